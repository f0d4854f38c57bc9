# The two commands of the README. Both set up ./.venv from uv.lock first (idempotent).
VENV := .venv/bin
export PATH := $(CURDIR)/$(VENV):$(PATH)

.PHONY: setup main iris-local test test-fast lint bench

# The `harbor` extra (Harbor's task loading, verifier and sandbox environments) is large but the tests exercise it.
setup:
	scripts/setup.sh --extra harbor

# The main job on the embedded default: the whole graph (base model, staging, launch, train, export, eval)
# on this machine's CPUs, then the Snakemake report, which opens on the results; its last lines say the held-out
# accuracy before and after training and where the eval and the report are (rlbuild/ops/results.py).
main: setup
	snakemake --cores 2
	snakemake --report $(CURDIR)/results/tiny-addition/report.html

# The Iris path on this machine: a local Iris cluster and S3 server (the tests' own), the graph through
# `snakemake --profile iris`, then where the artifacts are and their `rlbuild status`; stops what it started.
iris-local: setup
	python scripts/iris_local.py

# Every test, slow ones included (CI runs this), in three pytest-xdist workers on two cores: much of the suite waits
# on servers, schedulers, requeues and polls, and a third worker keeps both cores busy through those waits (measured:
# CPU idle 1% of the run). A module, or the folder of a shared local cluster (tests/iris, tests/slurm), is one unit
# of work (tests/conftest.py). The log ends with the 40 slowest tests, the time per folder and the suite's time against
# CI's 35 minutes (`suite 31:40 of 35:00`, from .ci/run's start when it ran it). The agent's base
# model, which four modules wait on, starts building as the session starts (RLBUILD_TEST_PREBUILD).
PARALLEL := -n 3 --dist loadscope --no-loadscope-reorder

test: setup
	RLBUILD_TEST_PREBUILD=tiny-agent-h64-l2:42 python -m pytest $(PARALLEL)

# The inner loop: every test not marked slow (no real graph, cluster or training run), in under 3 minutes; these
# keep the CPU busy, so one worker a core.
test-fast: setup
	python -m pytest -n 2 --dist loadscope --no-loadscope-reorder -m "not slow"

lint: setup
	ruff check .

bench: setup
	scripts/setup.sh --group bench
	python benchmarks/dry_run.py
	python benchmarks/trainer_vs_trl.py
	python benchmarks/gang_bootstrap.py
	python benchmarks/startup.py
	python benchmarks/fsdp_cpu.py
	python benchmarks/agent_rollout.py
	python benchmarks/async_vs_sync.py
