"""A real local Iris cluster in its own process, for tests and benchmarks.

`python tests/iris/local_cluster.py --workers N --cpu-workers M --address-file F` starts a controller with
N fake H100x8 workers (one scale group, `pool: h100`, `leafgroup: h100-lg0`) plus M CPU workers
(`pool: cpu`), writes the controller URL to F when ready, and serves until SIGTERM/SIGINT.
Tasks inherit this process's cwd and environment: start it with the environment the tasks need.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

import yaml

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
