"""A real Slurm cluster on loopback for tests: munged, slurmctld and two slurmd (nodes n1, n2) on this host.

Debian's Slurm 22.05 (`scripts/install-slurm.sh`), started as root with a generated `slurm.conf` in a temporary
folder; no accounting (no slurmdbd): the plugin reads job states with `squeue`, so MinJobAge keeps finished jobs
visible for 10 minutes. Partitions:

- `gpu`: n1 and n2, one GPU each, declared as GRES `gpu` backed by empty files (Slurm schedules them; nothing
  uses CUDA: the trainer's ranks run on the CPU, as on a GPU-less Ray);
- `cpu`: the same two nodes without GPUs, for experiments of CPU ranks (`gpu_variant: cpu`).

The official plugin's job step removes SLURM_CONF before it runs `srun`, so commands inside a job find the
configuration where a configless node keeps it, `/run/slurm/conf`: the cluster links it to its own folder while
it runs and removes the link when it stops. Daemons are started and stopped by PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

NODES = ("n1", "n2")
CONFIG_LINK = Path("/run/slurm/conf")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def slurm_conf(base: Path, ports: dict[str, int]) -> str:
    lines = [
        "ClusterName=rlbuild-test",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ports['ctld']}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # Credentials expire after 10 s, not 120: a requeued job (the next link of a chain) waits that long plus one
        # second before it may start again.
        f"AuthInfo=socket={base / 'munge' / 'socket'},cred_expire=10",
        f"StateSaveLocation={base / 'state'}",
        f"SlurmdSpoolDir={base / 'spool'}/%n",
        f"SlurmctldPidFile={base / 'slurmctld.pid'}",
        f"SlurmdPidFile={base / 'slurmd'}.%n.pid",
        f"SlurmctldLogFile={base / 'log' / 'slurmctld.log'}",
        f"SlurmdLogFile={base / 'log'}/slurmd.%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        # A requeued job becomes eligible cred_expire + 1 s after its requeue, and then waits for a scheduling pass:
        # the backfill's every 30 s or the main loop's every 60 s by default. A pass every 2 s starts the next link
        # of a chain within 13 s of the requeue instead of 11-41 s (measured: 27 s before, 12.5 s after).
        "SchedulerParameters=sched_interval=2",
        "MpiDefault=none",
        "GresTypes=gpu",
        "MinJobAge=600",
        # Refuse at submission what a partition can never hold (as most sites do), instead of pending forever.
        "EnforcePartLimits=ALL",
        "KillWait=5",
        "ReturnToService=2",
    ]
    for name in NODES:
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={ports[name]} CPUs=2 "
            "RealMemory=4000 Gres=gpu:1 State=UNKNOWN"
        )
    lines.append(f"PartitionName=gpu Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP")
    lines.append(f"PartitionName=cpu Nodes={','.join(NODES)} MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


class LocalSlurm:
    """Start/stop the daemons by handle; everything they write lives under `base`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.conf = base / "etc" / "slurm.conf"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.linked = False

    @property
    def env(self) -> dict[str, str]:
        """What a client on this host needs: SLURM_CONF (jobs find /run/slurm/conf)."""
        return {"SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        for folder in ("etc", "state", "log", "munge", "dev", *(f"spool/{n}" for n in NODES)):
            (self.base / folder).mkdir(parents=True, exist_ok=True)
        (self.base / "dev" / "gpu0").touch()
        ports = {"ctld": free_port(), **{name: free_port() for name in NODES}}
        self.conf.write_text(slurm_conf(self.base, ports))
        (self.base / "etc" / "gres.conf").write_text(f"Name=gpu File={self.base / 'dev' / 'gpu0'}\n")
        self._link_config()
        key = self.base / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        munge = self.base / "munge"
        self._spawn(
            "munged",
            ["munged", "--foreground", "--force", f"--socket={munge / 'socket'}", f"--key-file={key}"]
            + [f"--{name}-file={munge / name}" for name in ("pid", "seed", "log")],
        )
        self._wait(lambda: (munge / "socket").exists(), "munged's socket")
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._wait(lambda: self._query(["scontrol", "ping"]).endswith("UP"), "slurmctld to answer")
        for name in NODES:
            self._spawn(f"slurmd.{name}", ["slurmd", "-D", "-N", name, "-f", str(self.conf)])
        self._wait(self._nodes_idle, "both nodes to be idle")

    def _link_config(self) -> None:
        if CONFIG_LINK.is_symlink() and not CONFIG_LINK.exists():
            CONFIG_LINK.unlink()  # a dead link left by an earlier, killed run
        if CONFIG_LINK.exists():
            raise RuntimeError(
                f"{CONFIG_LINK} exists ({os.path.realpath(CONFIG_LINK)}): another Slurm runs configless on this host; "
                "the test cluster would shadow or be shadowed by it"
            )
        CONFIG_LINK.parent.mkdir(parents=True, exist_ok=True)
        CONFIG_LINK.symlink_to(self.base / "etc")
        self.linked = True

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.base / "log" / f"{name}.out", "wb")  # noqa: SIM115 (the daemon owns it)
        self.processes.append(
            subprocess.Popen(argv, env={**os.environ, **self.env}, stdout=log, stderr=subprocess.STDOUT)
        )

    def _query(self, argv: list[str]) -> str:
        result = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=20)
        return result.stdout.strip()

    def _nodes_idle(self) -> bool:
        states = self._query(["sinfo", "--noheader", "--Node", "--partition", "gpu", "--format=%N %t"]).split("\n")
        return len(states) == len(NODES) and all(line.endswith("idle") for line in states)

    def _wait(self, ready: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            dead = [p.args[0] for p in self.processes if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                self.stop()
                logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}" for p in (self.base / "log").iterdir())
                raise RuntimeError(f"local Slurm: timed out waiting for {what} (exited: {dead})\n{logs}")
            time.sleep(0.2)

    def jobs(self) -> dict[str, str]:
        """Every job the controller still knows: id -> state."""
        lines = self._query(["squeue", "--noheader", "--states=all", "--format=%i|%T"]).splitlines()
        return dict(line.split("|", 1) for line in lines if "|" in line)

    def show_job(self, job: str) -> str:
        return self._query(["scontrol", "show", "job", job])

    def batch_script(self, job: str) -> str:
        """The script Slurm runs for a job, as it stored it at submission."""
        return self._query(["scontrol", "write", "batch_script", job, "-"])

    def stop(self) -> None:
        if any(p.poll() is None for p in self.processes):
            subprocess.run(["scancel", "--full", "--user=root"], env={**os.environ, **self.env}, check=False)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while time.monotonic() < deadline and any(s in ("RUNNING", "COMPLETING") for s in self.jobs().values()):
                time.sleep(0.5)
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes = []
        if self.linked and CONFIG_LINK.is_symlink():
            CONFIG_LINK.unlink()
        self.linked = False

    def __enter__(self) -> LocalSlurm:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()
