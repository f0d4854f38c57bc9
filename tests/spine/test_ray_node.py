"""A gang node whose `ray start` dies while starting (Ray's 30 s raylet registration, missed on a loaded host) is
started again; a head, or a node that ran past the start window, is not. `ray` is a script here that exits or
runs as told, so these run real processes without a Ray cluster."""

from __future__ import annotations

import stat
import time
from pathlib import Path

import pytest

from rlbuild.core.wire import RAY_PORT_NAMES
from rlbuild.job import gang
from rlbuild.job.gang import RayNode

PORTS = dict.fromkeys(RAY_PORT_NAMES, 1)


def fake_ray(folder: Path, exits_first: int) -> tuple[Path, Path]:
    """A `ray` that exits 1 on its first `exits_first` starts and blocks afterwards; each start appends a line."""
    calls = folder / "calls"
    program = folder / "ray"
    program.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n[ "$(wc -l < {calls})" -le {exits_first} ] && exit 1\nexec sleep 60\n'
    )
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    return program, calls


def node_that_died(program: Path, head: str | None) -> RayNode:
    node = RayNode(rank=1, host="127.0.0.1", ports=PORTS, program=str(program))
    node.start(head_address=head)
    assert node.process is not None
    node.process.wait(10)
    return node


def test_a_worker_whose_ray_start_died_starting_is_started_again_with_the_same_arguments(tmp_path: Path) -> None:
    program, calls = fake_ray(tmp_path, exits_first=1)
    node = node_that_died(program, "10.0.0.1:6379")
    try:
        assert node.keep_running()
        assert node.running() and node.starts == 2
        deadline = time.monotonic() + 10
        while len(calls.read_text().splitlines()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        first, second = calls.read_text().splitlines()
        assert "--address=10.0.0.1:6379" in first and first.split("--temp-dir")[0] == second.split("--temp-dir")[0]
    finally:
        node.stop()
    assert not node.keep_running()  # stopped on purpose: not started again


def test_a_worker_is_started_at_most_the_attempts_and_a_head_never_again(tmp_path: Path) -> None:
    program, calls = fake_ray(tmp_path, exits_first=99)
    node = node_that_died(program, "10.0.0.1:6379")
    for _ in range(gang.RAY_START_ATTEMPTS - 1):
        assert node.keep_running()
        assert node.process is not None
        node.process.wait(10)
    assert not node.keep_running()
    assert len(calls.read_text().splitlines()) == gang.RAY_START_ATTEMPTS
    head = node_that_died(program, head=None)
    assert not head.keep_running() and head.starts == 1


def test_a_worker_that_died_after_the_start_window_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    program, calls = fake_ray(tmp_path, exits_first=99)
    node = node_that_died(program, "10.0.0.1:6379")
    monkeypatch.setattr(gang, "RAY_START_WINDOW_S", 0.0)
    assert not node.keep_running()
    assert len(calls.read_text().splitlines()) == 1
