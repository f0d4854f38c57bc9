"""`python -m trainer {run, export, base-model, make-data, eval, episode}`; errors exit non-zero with a message."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from rlbuild.core.errors import RlbuildError
from rlbuild.core.redact import redact_text
from trainer.errors import TrainerError

# Each subcommand's module adds its parser. Only the one named is imported: `make-data` is pure Python and must not
# pay torch's and transformers' ~4 s import in every staging job.
SUBCOMMANDS = {
    "export": "trainer.commands.export",
    "base-model": "trainer.tiny",
    "make-data": "trainer.tasks",
    "eval": "trainer.commands.evaluate",
    "episode": "trainer.commands.episode",
}


def _run(args: argparse.Namespace) -> int:
    from rlbuild.contracts.launch import load_launch
    from rlbuild.core import storage
    from trainer import continuation
    from trainer.workers import cluster

    launch = load_launch(str(args.launch))
    continuation.listen()  # before anything slow
    to_train = not storage.exists(args.terminal or launch.artifacts.terminal_manifest_uri)  # else loop.run refuses
    if to_train and not cluster.in_process(launch):
        # Ray's services start, and its workers import the actors' modules, while this process imports the
        # loop's torch and transformers (seconds each, on the way to the first step either way).
        cluster.connect_for(launch)
        continuation.listen()  # again: ray.init replaces the SIGTERM handler with its own
    from trainer import loop

    try:
        manifest = loop.run(launch, args.terminal, args.allow_retrain)
        continuation.finished()
    except continuation.ToBeContinued as stopped:
        print(f"[trainer] {stopped}", flush=True)
        return stopped.exit_code
    print(json.dumps(manifest, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer", description="rlbuild's GRPO trainer")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train from a launch document")
    run.add_argument("--launch", required=True, type=Path)
    run.add_argument("--terminal", help="where terminal.json goes (default: artifacts.terminal_manifest_uri)")
    run.add_argument(
        "--allow-retrain",
        action="store_true",
        help="retrain an immutable version whose terminal manifest is missing, from step 0",
    )
    run.set_defaults(func=_run)
    argv = sys.argv[1:] if argv is None else argv
    named = next((a for a in argv if not a.startswith("-")), None)  # the top-level parser has no valued option
    wanted = [named] if named in SUBCOMMANDS else [] if named == "run" else list(SUBCOMMANDS)  # --help, a typo: all
    for command in wanted:
        importlib.import_module(SUBCOMMANDS[command]).add_cli(sub)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except (TrainerError, RlbuildError, OSError) as exc:
        print(failure_line(exc), file=sys.stderr)
        return 2


def failure_line(exc: BaseException) -> str:
    """The one line a failed command ends with (`rlbuild status` reads an OSError's errno and path from it). A
    failure inside a Ray actor arrives wrapped in a RayTaskError whose text is a remote traceback: its cause."""
    cause = getattr(exc, "cause", None) or exc
    return f"error: {type(cause).__name__}: {redact_text(str(cause))}"


if __name__ == "__main__":
    sys.exit(main())
