"""Dry-run wall time of the rlbuild graph against the floor: bare `snakemake -n` of a one-rule Snakefile on the
same storage, in the same run.

Rows, each the median of 5 runs (--repeats) and its ratio to the floor of its storage, and the ratio of the fastest runs
(a shared machine's noise only adds time, so it is the steadier measure of the work). The runs go in rounds, one
run of every case of a storage a round, the floor's among them: a shared machine's speed drifts over minutes, and
each ratio then compares runs made side by side, not the floor's minute with another's.
- local storage: the default experiment's dry run for one version, and a config asking for 50 versions;
- S3 on loopback (moto), and through a loopback proxy holding every request 20 ms (a real bucket's round trip):
  1 and 50 versions, with nothing built and with every artifact built; the storage requests each run made
  (counted by the proxy) and per version; `rlbuild status` of the 50 built versions; and the 50 empty versions
  with `-q`, which leaves out Snakemake's listing of every job (what that listing costs is the difference).

"Built" is the state a completed build leaves where the graph looks (rlbuild/dev/built.py: every identity record
as the jobs write it, every output); the built dry run must find nothing to do. Record contents are remembered
by ETag on this machine (rlbuild/core/inventory.py): the row "records unread" is the first dry run after the
build (every record fetched), the other built rows run after it.

Run it after `make setup`, which compiles the checkout's bytecode, as a user's Python caches it after the first run.

    uv run python benchmarks/dry_run.py [--repeats 5] [--smoke]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlbuild.contracts.artifacts import artifact
from rlbuild.dev.built import write_built
from rlbuild.dev.s3 import LatencyProxy, S3Server, latency_proxy, s3_server

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
EXPERIMENT = REPO / "config" / "experiments" / "tiny-addition.yaml"
LATENCY_S = 0.020
FIFTY = [f"2026.01.{day:02d}" for day in range(1, 29)] + [f"2026.02.{day:02d}" for day in range(1, 23)]


@dataclass(frozen=True)
class Timed:
    seconds: float  # the median run
    fastest: float  # the fastest run: on a shared machine, the least disturbed measure of the work itself
    requests: int  # storage requests of one run (the last), 0 where nothing counts them


def rounds(
    cases: dict[str, list[str]], cwd: Path, repeats: int, env: dict[str, str], proxy: LatencyProxy | None
) -> dict[str, Timed]:
    """Each command `repeats` times, one run of every command a round (see the module's docstring)."""
    times: dict[str, list[float]] = {name: [] for name in cases}
    counted: dict[str, int] = dict.fromkeys(cases, 0)
    for _ in range(repeats):
        for name, command in cases.items():
            if proxy is not None:
                proxy.reset()
            start = time.perf_counter()
            result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False, env=env)
            times[name].append(time.perf_counter() - start)
            counted[name] = proxy.reset() if proxy is not None else 0
            if result.returncode:
                raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return {name: Timed(statistics.median(t), min(t), counted[name]) for name, t in times.items()}


@contextmanager
def s3_env(server: S3Server, endpoint: str) -> Iterator[dict[str, str]]:
    """The environment a run against `endpoint` gets (and this process, while it writes the built state)."""
    env = {**os.environ, **server.env(), "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL": endpoint}
    saved = dict(os.environ)
    os.environ.update(server.env())
    try:
        yield env
    finally:
        os.environ.clear()
        os.environ.update(saved)


def local_rows(work: Path, repeats: int, count: int) -> list[tuple[str, Timed, Timed, int]]:
    config = work / "fifty.yaml"
    many = FIFTY[:count]
    config.write_text(yaml.safe_dump({"versions": many, "storage_root": str(work / "results")}))
    snakefile = [*SNAKEMAKE, "-n", "--snakefile", str(REPO / "Snakefile")]
    timed = rounds(
        {
            "floor": [*SNAKEMAKE, "-n", "--snakefile", str(work / "Empty.smk")],
            "one": [*snakefile, "export/v2026.09.21", "--config", f"storage_root={work / 'results'}"],
            "many": [*snakefile, "--configfile", str(config)],
        },
        work,
        repeats,
        dict(os.environ),
        None,
    )
    floor = timed["floor"]
    return [
        ("local: floor: snakemake -n, empty Snakefile", floor, floor, 1),
        ("local: rlbuild dry run, export/v2026.09.21", timed["one"], floor, 1),
        (f"local: rlbuild dry run, {len(many)} versions (7 jobs each)", timed["many"], floor, len(many)),
    ]


def s3_rows(
    work: Path, server: S3Server, endpoint: str, proxy: LatencyProxy | None, repeats: int, count: int
) -> list[tuple[str, Timed, Timed, int]]:
    """The floor, the dry runs of 1 and 50 versions empty and built, and status of the built ones, on one S3."""
    label = "s3+20ms" if proxy is not None else "s3"
    many = FIFTY[:count]
    with s3_env(server, endpoint) as env:
        env["RLBUILD_CACHE_DIR"] = str(work / f"cache-{len(label)}")
        bucket = server.new_bucket()
        flags = ["--default-storage-provider", "s3", "--default-storage-prefix"]
        write_built(EXPERIMENT, f"s3://{bucket}/built", many)

        def dry_run(state: str, versions: list[str], *extra: str) -> list[str]:
            config = work / f"{state}-{len(versions)}.yaml"
            config.write_text(yaml.safe_dump({"versions": versions}))
            command = [*SNAKEMAKE, "-n", *extra, "--snakefile", str(REPO / "Snakefile"), "--configfile", str(config)]
            return [*command, *flags, f"s3://{bucket}/{state}"]

        status = [sys.executable, "-m", "rlbuild", "status", "--experiment", str(EXPERIMENT), "--json"]
        status += ["--storage-root", f"s3://{bucket}/built", *(artifact("eval").version_folder(v) for v in many)]
        # The first built run reads every record (no cache yet): once, before the rounds.
        unread = rounds({"unread": dry_run("built", many)}, work, 1, env, proxy)["unread"]
        check_nothing_to_do(dry_run("built", many), work, env)
        timed = rounds(
            {
                "floor": [*SNAKEMAKE, "-n", "--snakefile", str(work / "Empty.smk"), *flags, f"s3://{bucket}/floor"],
                "empty 1": dry_run("empty", many[:1]),
                "empty": dry_run("empty", many),
                "quiet": dry_run("empty", many, "-q"),
                "built 1": dry_run("built", many[:1]),
                "built": dry_run("built", many),
                "status": status,
            },
            work,
            repeats,
            env,
            proxy,
        )
    floor, n = timed["floor"], len(many)
    return [
        (f"{label}: floor: snakemake -n, one-rule Snakefile", floor, floor, 1),
        (f"{label}: rlbuild dry run, 1 versions empty", timed["empty 1"], floor, 1),
        (f"{label}: rlbuild dry run, {n} versions empty", timed["empty"], floor, n),
        (f"{label}: rlbuild dry run, {n} versions empty, -q (no job list)", timed["quiet"], floor, n),
        (f"{label}: rlbuild dry run, {n} versions built, records unread", unread, floor, n),
        (f"{label}: rlbuild dry run, 1 versions built", timed["built 1"], floor, 1),
        (f"{label}: rlbuild dry run, {n} versions built", timed["built"], floor, n),
        (f"{label}: rlbuild status, {n} versions built", timed["status"], floor, n),
    ]


def check_nothing_to_do(command: list[str], cwd: Path, env: dict[str, str]) -> None:
    """The built state is what a build leaves: the dry run of every built version has nothing to do."""
    out = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    if "Nothing to be done" not in out.stdout + out.stderr:
        raise SystemExit(f"the built state is incomplete: the dry run still plans jobs:\n{out.stdout[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="2 versions instead of 50, one repeat (seconds)")
    parser.add_argument("--versions", type=int, default=len(FIFTY), help="the many-versions rows' count (<= 50)")
    parser.add_argument("--no-local", action="store_true", help="only the S3 rows")
    args = parser.parse_args()
    repeats = 1 if args.smoke else args.repeats
    count = 2 if args.smoke else min(args.versions, len(FIFTY))
    with tempfile.TemporaryDirectory() as tmp, s3_server(quiet=True) as server:
        work = Path(tmp)
        (work / "Empty.smk").write_text("rule all:\n    output: 'x'\n    shell: 'touch {output}'\n")
        rows = [] if args.no_local else local_rows(work, repeats, count)
        rows += s3_rows(work, server, server.endpoint, None, repeats, count)
        with latency_proxy(server.endpoint, LATENCY_S) as proxy:
            rows += s3_rows(work, server, proxy.endpoint, proxy, repeats, count)
    print_table(rows)


def print_table(rows: list[tuple[str, Timed, Timed, int]]) -> None:
    print(f"{'case':<64}{'median s':>10}{'x floor':>9}{'x (fastest)':>13}{'requests':>10}{'req/version':>13}")
    for name, timed, floor, versions in rows:
        counted = f"{timed.requests:>10}{timed.requests / versions:>13.1f}" if timed.requests else f"{'':>10}{'':>13}"
        ratios = f"{timed.seconds / floor.seconds:>9.2f}{timed.fastest / floor.fastest:>13.2f}"
        print(f"{name:<64}{timed.seconds:>10.2f}{ratios}{counted}")
    for state in ("empty", "built"):
        found = [(t, v) for n, t, _, v in rows if n.startswith("s3+20ms: rlbuild dry run") and n.endswith(state)]
        found = found[-2:]
        if len(found) == 2 and found[1][0].requests:
            (one, _), (many, versions) = found
            extra = (many.requests - one.requests) / max(versions - 1, 1)
            print(f"s3+20ms {state}: storage requests per extra version {extra:.1f}")


if __name__ == "__main__":
    main()
