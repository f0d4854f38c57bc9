"""The eval stage: results.json, the results table and the curves PNG from a synthetic metrics.jsonl."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rlbuild.evaluation import EvalError, plot_curves, read_metrics, run_eval
from rlbuild.staging import ManifestMismatchError, StagingError, write_manifest

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _metrics(path: Path) -> Path:
    lines = [json.dumps({"step": s, "reward_mean": s / 10, "entropy": 1.0}) for s in range(1, 11)]
    lines[4] = json.dumps({"step": 5, "eval_accuracy": 0.4})  # an eval line without reward
    lines.append(json.dumps({"step": 10, "eval_accuracy": 0.7, "reward_mean": None}))
    lines.append('{"step": 11, "rew')  # torn by a killed writer
    path.write_text("\n".join(lines) + "\n")
    return path


def _validation(staged: Path, n: int = 5) -> Path:
    """A staged data directory's validation file (with its manifest), as the eval rule receives it."""
    path = staged / "validation" / "0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(n)))
    write_manifest(staged)
    return path


@pytest.fixture
def scoring(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Calls to the stand-in for trainer.evaluate.evaluate; empty when the trainer's own scorer is used."""
    calls: list[dict[str, Any]] = []
    try:
        import trainer.evaluate

        return calls
    except ImportError:
        pass

    def evaluate(model_dir: Path, rows: list[dict[str, Any]], k: int = 1, *, seed: int = 0) -> dict[str, Any]:
        calls.append({"model_dir": model_dir, "n": len(rows), "k": k, "seed": seed})
        return {"n": len(rows), "accuracy": 0.4, "k": k, "pass_at_k": 0.6, "temperature": 1.0}

    module = types.ModuleType("trainer.evaluate")
    module.evaluate = evaluate  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trainer.evaluate", module)
    import trainer

    monkeypatch.setattr(trainer, "evaluate", module, raising=False)
    return calls


@pytest.fixture
def model(tmp_path: Path, scoring: list[dict[str, Any]]) -> Path:
    """The export to score: the tiny base model when the real scorer runs, an empty folder for the stand-in."""
    path = tmp_path / "export"
    try:
        import trainer.evaluate  # noqa: F401
    except ImportError:
        path.mkdir()
        return path
    from trainer.tiny import build_base_model

    build_base_model(path, seed=0, warm_start_steps=0)
    return path


def test_run_eval_writes_results_table_and_png(tmp_path: Path, model: Path, scoring: list[dict[str, Any]]) -> None:
    metrics = _metrics(tmp_path / "metrics.jsonl")
    results = run_eval(model, [_validation(tmp_path / "data")], str(metrics), tmp_path / "eval", k=2, seed=7)

    out = tmp_path / "eval"
    assert json.loads((out / "results.json").read_text()) == results
    assert results["k"] == 2 and results["n"] == 5 and results["seed"] == 7
    assert 0.0 <= results["accuracy"] <= 1.0 and 0.0 <= results["pass_at_k"] <= 1.0
    training = results["training"]
    assert training["unreadable_lines"] == 1 and training["last_step"] == 10
    assert training["reward_mean"] == {"first": 0.1, "last": 1.0, "max": 1.0}
    assert training["eval_accuracy"] == {"last": 0.7, "best": 0.7, "best_step": 10.0}
    assert "pass@2" in (out / "results.html").read_text()
    png = (out / "curves.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE)
    import matplotlib.image

    assert matplotlib.image.imread(out / "curves.png").shape[2] in (3, 4)
    assert not list(out.glob(".*tmp*"))
    if scoring:
        assert scoring == [{"model_dir": model, "n": 5, "k": 2, "seed": 7}]
        assert results["samples"] == {"n": 5, "k": 2, "temperature": 1.0}


def test_plot_without_metrics(tmp_path: Path) -> None:
    records, unreadable = read_metrics(str(tmp_path / "absent.jsonl"))
    assert (records, unreadable) == ([], 0)
    plot_curves(records, None, tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_SIGNATURE)


def test_validation_data_is_verified_and_checked(tmp_path: Path, scoring: list[dict[str, Any]]) -> None:
    loose = tmp_path / "loose.jsonl"
    loose.write_text('{"prompt": "1+1=", "answer": "2"}\n')
    with pytest.raises(StagingError, match=r"no manifest\.json at or above"):
        run_eval(tmp_path, [loose], None, tmp_path / "eval", seed=0)

    path = _validation(tmp_path / "data")
    path.write_text('{"prompt": "1+1="}\n')
    with pytest.raises(ManifestMismatchError, match=r"validation/0\.jsonl: size"):
        run_eval(tmp_path, [path], None, tmp_path / "eval", seed=0)
    write_manifest(tmp_path / "data")  # staged like that: the row itself is refused
    with pytest.raises(StagingError, match=r"0\.jsonl:1: missing column\(s\) \['answer'\]"):
        run_eval(tmp_path, [path], None, tmp_path / "eval", seed=0)
    with pytest.raises(EvalError, match="k >= 2"):
        run_eval(tmp_path, [path], None, tmp_path / "eval", k=1, seed=0)
    with pytest.raises(EvalError, match="no validation rows"):
        run_eval(tmp_path, [], None, tmp_path / "eval", seed=0)
