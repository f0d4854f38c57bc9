"""The tiny model's tokenizer reads the same from disk as in memory (the trainer only ever loads it from disk)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from trainer import tasks, tiny


def test_the_saved_tokenizer_loads_with_the_same_ids_and_round_trips(tmp_path: Path) -> None:
    tokenizer = tiny.build_tokenizer()
    # Saved as a model folder: config.json says qwen2, so AutoTokenizer loads Qwen2Tokenizer, which re-applies its
    # own byte-level pre-tokenization (before the fix, every space was dropped: "rev abc:" became "revabc:").
    tiny.build_model(tokenizer, seed=0).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    texts = [tiny.CHARACTERS, "next 4:", "prev 5:"]
    for task in ("addition", "reversal"):
        texts += [row["prompt"] + str(row["answer"]) for row in tasks.generate(task, "train", "seed-0")]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert loaded(text)["input_ids"] == ids, text
        assert len(ids) == len(text) + 1  # <bos>, then one token per character
        assert loaded.decode(ids, skip_special_tokens=True) == text
