"""`make iris-local`'s script from a fresh copy of the code: its own local Iris cluster and S3 server, the graph
through `snakemake --profile iris`, where the artifacts are, their status (all done), and everything stopped."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import copy_of_the_code
from tests.e2e.test_pipeline import small_experiment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def test_iris_local_runs_the_graph_on_a_local_cluster_and_stops_it(tmp_path: Path) -> None:
    clone = copy_of_the_code(tmp_path / "clone")
    # A file of the checkout: Iris jobs get the checkout as a bundle and see no other file of this machine.
    experiment = small_experiment(clone / "config" / "experiments", max_steps=4, name="iris-local")
    result = subprocess.run(
        [sys.executable, "scripts/iris_local.py", "--experiment", str(experiment)],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    assert "artifacts under s3://" in out and "python -m rlbuild status" in out
    assert "Submitted train to Iris as 1-node gang" in out  # the one-node train job is a gang
    assert result.stdout.count(" done ") == 7 and "verdict: done" in result.stdout, result.stdout[-3000:]
    assert "stopped the local Iris cluster and S3 server" in out
