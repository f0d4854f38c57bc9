"""A real local Iris cluster in its own process, for `make iris-local`, the tests and the benchmarks.

`python rlbuild/schedulers/iris/localcluster.py --workers N --cpu-workers M --address-file F` starts a controller with
N fake H100x8 workers (one scale group, `pool: h100`, `leafgroup: h100-lg0`) plus M CPU workers
(`pool: cpu`), writes the controller URL to F when ready, and serves until SIGTERM/SIGINT.
Tasks inherit this process's cwd and environment: `LocalIris` starts it with an isolated HOME and TMPDIR.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20


class LocalIris:
    """Start/stop the cluster process by handle; its HOME/TMPDIR live under `base` and go away with it."""

    def __init__(self, base: Path, workers: int = 2, cpu_workers: int = 1, env: dict[str, str] | None = None) -> None:
        self.base = base
        self.workers, self.cpu_workers = workers, cpu_workers
        self.extra_env = env or {}
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> str:
        for name in ("home", "tmp"):
            (self.base / name).mkdir(parents=True, exist_ok=True)
        address = self.base / "controller.url"
        env = {
            **os.environ,
            "HOME": str(self.base / "home"),
            "TMPDIR": str(self.base / "tmp"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "RAY_USAGE_STATS_ENABLED": "0",
            **self.extra_env,
        }
        argv = [sys.executable, __file__, "--workers", str(self.workers), "--cpu-workers", str(self.cpu_workers)]
        self.log = open(self.base / "controller.log", "wb")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            [*argv, "--address-file", str(address)], cwd=self.base, env=env, stdout=self.log, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not address.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = (self.base / "controller.log").read_text()[-3000:]
                raise RuntimeError(f"local Iris controller did not start:\n{tail}")
            time.sleep(0.2)
        self.url = address.read_text().strip()
        return self.url

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self.log.close()
        shutil.rmtree(self.base / "tmp", ignore_errors=True)

    def __enter__(self) -> LocalIris:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


LEAFGROUP = "h100-lg0"


def cluster_config(gpu_workers: int, cpu_workers: int) -> dict:
    groups: dict[str, dict] = {
        "h100": {
            "num_vms": 1,
            "buffer_slices": gpu_workers,
            "max_slices": gpu_workers,
            "resources": {
                "cpu": 128,
                "ram": "1024GB",
                "disk": "1000GB",
                "device_type": "gpu",
                "device_variant": "H100",
                "device_count": 8,
                "capacity_type": "on-demand",
            },
            "slice_template": {"num_vms": 1, "local": {}},
            "worker": {"attributes": {"pool": "h100", "leafgroup": LEAFGROUP}},
        }
    }
    if cpu_workers:
        groups["cpu"] = {
            "num_vms": 1,
            "buffer_slices": cpu_workers,
            "max_slices": cpu_workers,
            "resources": {
                "cpu": 16,
                "ram": "64GB",
                "disk": "200GB",
                "device_type": "cpu",
                "capacity_type": "on-demand",
            },
            "slice_template": {"num_vms": 1, "local": {}},
            "worker": {"attributes": {"pool": "cpu", "leafgroup": "cpu-lg0"}},
        }
    return {"name": "rlbuild-test", "scale_groups": groups}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2, help="fake H100x8 workers")
    parser.add_argument("--cpu-workers", type=int, default=1)
    parser.add_argument("--address-file", type=Path, required=True)
    args = parser.parse_args()

    from iris.cluster.config import load_config, make_local_config
    from iris.cluster.local_cluster import LocalCluster

    config_file = args.address_file.with_suffix(".cluster.yaml")
    config_file.write_text(yaml.safe_dump(cluster_config(args.workers, args.cpu_workers)))
    config = make_local_config(load_config(config_file))
    cluster = LocalCluster(config)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    url = cluster.start()
    tmp = args.address_file.with_suffix(".tmp")
    tmp.write_text(url)
    tmp.rename(args.address_file)
    try:
        stop.wait()
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
