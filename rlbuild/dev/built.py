"""What a completed build of a version leaves where the graph looks, written directly (seconds, no training):
for the dry-run benchmark and the test that counts a dry run's storage requests.

Every artifact's identity record (the record the jobs write: `resolve` makes it, as preflight does, sealed with the
digests of its control documents), its outputs and the `.snakemake_timestamp` of its directory outputs, payload
first, record last. The payloads are stand-ins
(the graph reads only their existence and times); a dry run of a version written here has nothing to do.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlbuild.contracts.artifacts import ARTIFACTS, sealed, sha256_bytes
from rlbuild.core import storage
from rlbuild.plan import series
from rlbuild.plan.preflight import load_experiment
from rlbuild.plan.resolve import resolve_checked

# Outputs of the rules besides each artifact's own path and record (rules/*.smk).
EXTRA_OUTPUTS = {"launch": ["plan.txt"], "eval": ["results.html", "curves.png"]}


def write_built(experiment_file: Path, storage_root: str, versions: list[str]) -> None:
    """Leave every version of the experiment built under `storage_root` (local or `s3://`)."""
    checked = series.check(load_experiment(experiment_file))

    def one(version: str) -> None:
        plan = resolve_checked(checked, version, storage_root)
        for a in ARTIFACTS:
            if a.kind not in plan.records:
                continue
            folder = plan.uri(a.version_folder(version))
            # The rules' outputs only (not the run's metrics.jsonl: the graph never reads it).
            written = dict.fromkeys(EXTRA_OUTPUTS.get(a.kind, []), "")
            if a.is_directory:
                written |= {"manifest.json": '{"files": {}}\n', ".snakemake_timestamp": ""}
            else:
                written[a.output] = "{}\n"
            for name, text in written.items():
                _write(storage.join(folder, name), text)
            payload = {name: sha256_bytes(written[name].encode()) for name in a.documents if name in written}
            record = sealed(plan.records[a.kind], payload)
            _write(plan.uri(a.record(version)), json.dumps(record, indent=2, sort_keys=True) + "\n")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, versions))


def _write(uri: str, text: str) -> None:
    """One PUT on the shared client (thousands of objects in seconds), or a local atomic write."""
    if not storage.is_s3(uri):
        storage.write_text(uri, text)
        return
    bucket, _, key = uri.removeprefix(storage.S3).partition("/")
    storage.shared_s3_client().put_object(Bucket=bucket, Key=key, Body=text.encode())
