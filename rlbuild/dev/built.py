"""What a completed build of a version leaves where the graph looks, written directly (seconds, no training):
for the dry-run benchmark and the test that counts a dry run's storage requests.

Every artifact's identity record (the record the jobs write: `resolve` makes it, as preflight does), its outputs
and the `.snakemake_timestamp` of its directory outputs, payload first, record last. The payloads are stand-ins
(the graph reads only their existence and times); a dry run of a version written here has nothing to do.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlbuild.contracts.artifacts import ARTIFACTS
from rlbuild.core import storage
from rlbuild.plan.preflight import load_experiment
from rlbuild.plan.resolve import resolve

# Outputs of the rules besides each artifact's own path and record (rules/*.smk).
EXTRA_OUTPUTS = {"launch": ["plan.txt"], "eval": ["results.html", "curves.png"]}


def write_built(experiment_file: Path, storage_root: str, versions: list[str]) -> None:
    """Leave every version of the experiment built under `storage_root` (local or `s3://`)."""
    experiment = load_experiment(experiment_file)

    def one(version: str) -> None:
        plan = resolve(experiment, version, storage_root)
        for a in ARTIFACTS:
            if a.kind not in plan.records:
                continue
            folder = plan.uri(a.version_folder(version))
            if a.is_directory:
                storage.write_text(storage.join(folder, "manifest.json"), '{"files": {}}\n')
                storage.write_text(storage.join(folder, ".snakemake_timestamp"), "")
            else:
                storage.write_text(plan.uri(a.path(version)), "{}\n")
            for name in EXTRA_OUTPUTS.get(a.kind, []):
                storage.write_text(storage.join(folder, name), "")
            storage.write_json(plan.uri(a.record(version)), plan.records[a.kind])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, versions))
