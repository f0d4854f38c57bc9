"""Dry-run wall time of the rlbuild graph against the floor: bare `snakemake -n` on an empty Snakefile.

Prints, from the same run on the same machine: the floor, the default experiment's dry run for one version,
and a config asking for 50 versions of the graph; each as the median of a few runs and as a ratio to the floor.

    uv run python benchmarks/dry_run.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = [sys.executable, "-m", "snakemake"]


def wall(command: list[str], cwd: Path, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
        times.append(time.perf_counter() - start)
        if result.returncode:
            raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        empty = work / "Empty.smk"
        empty.write_text("rule all:\n    output: 'x'\n    shell: 'touch {output}'\n")
        config = work / "fifty.yaml"
        versions = [f"2026.01.{day:02d}" for day in range(1, 29)] + [f"2026.02.{day:02d}" for day in range(1, 23)]
        config.write_text(yaml.safe_dump({"versions": versions, "storage_root": str(work / "results")}))

        floor = wall([*SNAKEMAKE, "-n", "--snakefile", str(empty)], work, args.repeats)
        one = wall(
            [
                *SNAKEMAKE,
                "-n",
                "--snakefile",
                str(REPO / "Snakefile"),
                "export/v2026.09.21",
                "--config",
                f"storage_root={work / 'results'}",
            ],
            work,
            args.repeats,
        )
        fifty = wall(
            [*SNAKEMAKE, "-n", "--snakefile", str(REPO / "Snakefile"), "--configfile", str(config)],
            work,
            args.repeats,
        )
    print(f"{'case':<44}{'median s':>10}{'x floor':>10}")
    print(f"{'floor: snakemake -n, empty Snakefile':<44}{floor:>10.2f}{1:>10.2f}")
    print(f"{'rlbuild dry run, export/v2026.09.21':<44}{one:>10.2f}{one / floor:>10.2f}")
    print(f"{'rlbuild dry run, 50 versions (7 jobs each)':<44}{fifty:>10.2f}{fifty / floor:>10.2f}")
    print(f"per extra version: {(fifty - one) / 49 * 1000:.0f} ms")


if __name__ == "__main__":
    main()
