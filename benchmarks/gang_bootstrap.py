"""Gang bring-up time on a real local Iris cluster: from gang start (rank 0's bootstrap begins) to all nodes
alive in Ray, for 2- and 4-node gangs of fake H100x8 workers; also submit-to-success wall time.

    uv run python benchmarks/gang_bootstrap.py [--sizes 2 4] [--repeats 1] [--iris-url URL]

`--iris-url`: a running local cluster of fake H100x8 workers instead of a fresh one (the tests pass theirs: two local
clusters on one host hand out task ports from the same range, so their gangs' Ray ports can meet).

Each gang runs the real bootstrap (`python -m rlbuild.schedulers.gangtask`, rendezvous in a local folder) with an
empty job step, so the numbers are the bootstrap's own cost: Ray head start, workers joining, the all-alive check.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlbuild.core.wire import RAY_PORT_NAMES  # noqa: E402
from rlbuild.schedulers.iris.client import Iris, Submission, shell  # noqa: E402
from rlbuild.schedulers.iris.localcluster import LocalIris  # noqa: E402
from snakemake_executor_plugin_iris.requests import Defaults, gang_command, placement  # noqa: E402

ALIVE = re.compile(r"Ray nodes alive: (\d+)/\d+ after ([\d.]+)s since gang start")


def run_gang(iris: Iris, nodes: int, rendezvous: Path) -> tuple[float, float]:
    """(seconds from gang start to all nodes alive, seconds from submit to SUCCEEDED)."""
    defaults = Defaults(cpu=4, memory="8GB", disk="10GB", priority="interactive", max_retries=0, coschedule="leafgroup")
    place = placement({"gpu_nodes": nodes, "gpus_per_node": 8, "gpu_variant": "H100"}, 1, defaults)
    command = gang_command(sys.executable, nodes, uuid.uuid4().hex[:12], "true", None, str(rendezvous), 300)
    name = f"bench-gang-{nodes}-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    job_id, _ = iris.submit(name, place, Submission(shell(str(REPO), command), {}, list(RAY_PORT_NAMES), 60, None))
    job = iris.client.job(job_id)
    status = job.wait(timeout=600, poll_interval=0.2, raise_on_failure=False)
    wall = time.monotonic() - started
    if status.state.value != "succeeded":
        raise SystemExit(f"{nodes}-node gang ended {status.state.value}: {status.error_message}")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # Iris's logs trail the terminal state by 1-2 s
        match = next((m for e in job.logs() if (m := ALIVE.search(e.data))), None)
        if match:
            return float(match.group(2)), wall
        time.sleep(0.5)
    raise SystemExit(f"{nodes}-node gang: no 'Ray nodes alive' line in its logs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--iris-url", help="a running local Iris cluster to use (default: start one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gang-bench-") as tmp:
        if args.iris_url:
            measure(args.iris_url, args.sizes, args.repeats, Path(tmp))
            return
        with LocalIris(Path(tmp) / "iris", workers=max(args.sizes), cpu_workers=0) as cluster:
            measure(cluster.url, args.sizes, args.repeats, Path(tmp))


def measure(url: str, sizes: list[int], repeats: int, tmp: Path) -> None:
    iris = Iris(url)
    print(f"local Iris at {url}, gangs of {sizes} fake H100x8 workers")
    print(f"{'nodes':>5}  {'gang start -> all alive (s)':>28}  {'submit -> succeeded (s)':>24}")
    for nodes in sizes:
        runs = [run_gang(iris, nodes, tmp / "rendezvous") for _ in range(repeats)]
        alive = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        print(f"{nodes:>5}  {alive:>28.1f}  {wall:>24.1f}", flush=True)
    iris.close()


if __name__ == "__main__":
    main()
