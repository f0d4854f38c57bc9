"""`make iris-local`: the Iris path on one machine.

Starts a local Iris cluster and a loopback S3 server (moto) — the same ones the tests use — runs the graph through
`snakemake --profile iris` (or, with --detach, as a detached coordinator: `rlbuild submit`), prints where the
artifacts are and how to watch them with `rlbuild status`, prints that status at the end, and stops what it
started. Exit code: Snakemake's (or 1 when the detached run did not finish every artifact).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlbuild.dev.s3 import S3Server, s3_server
from rlbuild.schedulers.iris.localcluster import LocalIris

REPO = Path(__file__).resolve().parent.parent

PREFIX = "rlbuild-iris-local"


def rlbuild(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlbuild", *argv], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )


def wait_detached(status_argv: list[str], env: dict[str, str], timeout_s: float) -> bool:
    """Poll `rlbuild status --json` until every artifact is done (True) or one failed or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = rlbuild(*status_argv, "--json", env=env)
        if found.returncode == 0:
            document = json.loads(found.stdout)
            print(f"[iris-local] {document['verdict']}", flush=True)
            if document["verdict"] == "done":
                return True
            if document["verdict"].startswith("failed"):
                return False
        time.sleep(15)
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="*", help="snakemake targets (default: rule all)")
    parser.add_argument("--experiment", help="experiment name or .yaml path (default: config/config.yaml's)")
    parser.add_argument("--detach", action="store_true", help="submit the graph as a coordinator job, then follow it")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for a detached run")
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="rlbuild-iris-local-"))
    try:
        with s3_server(quiet=True) as s3, LocalIris(base / "iris", workers=1, cpu_workers=1) as cluster:
            return run(args, cluster.url, s3, s3.new_bucket(), base)
    finally:
        print(f"[iris-local] stopped the local Iris cluster and S3 server (logs: {base})", flush=True)


def run(args: argparse.Namespace, url: str, s3: S3Server, bucket: str, base: Path) -> int:
    env = {**os.environ, **s3.env(), "SNAKEMAKE_IRIS_CONTROLLER_URL": url, "RAY_USAGE_STATS_ENABLED": "0"}
    env |= {"RLBUILD_BUCKET": bucket, "RLBUILD_PREFIX": PREFIX}
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):  # rlbuild reaches S3 with SNAKEMAKE_STORAGE_S3_*
        env.pop(name, None)
    root = f"s3://{bucket}/{PREFIX}"
    selection = ["--experiment", args.experiment] if args.experiment else []
    status = ["status", *selection, "--storage-root", root, "--iris-controller-url", url]
    print(f"[iris-local] Iris controller {url}; S3 endpoint {s3.endpoint}; artifacts under {root}/", flush=True)
    print(
        "[iris-local] watch from another shell:\n"
        f"  SNAKEMAKE_STORAGE_S3_ENDPOINT_URL={s3.endpoint} SNAKEMAKE_STORAGE_S3_ACCESS_KEY=testing-access-key "
        f"SNAKEMAKE_STORAGE_S3_SECRET_KEY=testing-secret-key python -m rlbuild {' '.join(status)} --watch 10",
        flush=True,
    )
    if args.detach:
        submitted = rlbuild("submit", *selection, *args.targets, env=env)
        print(submitted.stdout + submitted.stderr, end="", flush=True)
        ok = submitted.returncode == 0 and wait_detached(status, env, args.timeout)
        code = 0 if ok else 1
    else:
        config = ["--config", f"experiment={args.experiment}"] if args.experiment else []
        argv = [
            sys.executable,
            "-m",
            "snakemake",
            *args.targets,
            "--profile",
            "iris",
            "--snakefile",
            str(REPO / "Snakefile"),
            # The profile's 10 s between status checks suits a real cluster's controller; this one is on loopback,
            # where asking every second costs nothing and each job's end is seen 1 s after it, not up to 10.
            "--seconds-between-status-checks",
            "1",
        ]
        argv += ["--directory", str(base / "workdir"), *config]
        code = subprocess.run(argv, cwd=REPO, env=env, check=False).returncode
    final = rlbuild(*status, env=env)
    print(final.stdout + final.stderr, end="", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
