"""`rlbuild`: the preflight check for people, and one subcommand per rule for Snakemake.

Each rule calls exactly one subcommand; each subcommand writes its payload first and the identity record last.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from rlbuild.contracts.artifacts import (
    METRICS_NAME,
    artifact,
    experiment_root,
    read_record,
    record_of,
    sealed,
    stored_digests,
    verify_document,
)
from rlbuild.contracts.launch import LaunchDocument, dump_launch, launch_from_text, load_launch
from rlbuild.contracts.manifest import MANIFEST
from rlbuild.core import storage
from rlbuild.core.errors import PreflightError, RlbuildError, Violation
from rlbuild.core.redact import redact_text
from rlbuild.core.wire import ALLOW_RETRAIN, INTERRUPTED_EXIT_CODE
from rlbuild.core.yamlfile import load_yaml
from rlbuild.job import interrupts
from rlbuild.plan.identity import derived_record
from rlbuild.plan.planview import Cost, format_plan, plan_dict
from rlbuild.plan.preflight import load_experiment
from rlbuild.plan.resolve import Plan, resolve_file
from rlbuild.plan.series import CheckedExperiment, check
from rlbuild.plan.spec import Experiment
from rlbuild.schedulers.base import CoordinatorRequest, Scheduler
from rlbuild.schedulers.registry import SCHEDULERS, job_scheduler

EXIT_INVALID = 2
DEFAULT_STORAGE_ROOT = "results"
REPO = Path(__file__).resolve().parent.parent


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("rlbuild")
    except PackageNotFoundError:  # a checkout run without installing it
        return "unknown"


def _storage_root(root: str) -> str:
    """The checked storage root (rlbuild/core/storage.py): a bad one is bad input, not an empty experiment."""
    return storage.storage_root(root, "--storage-root")


def _plan(args: argparse.Namespace) -> Plan:
    return resolve_file(Path(args.experiment), args.version, _storage_root(args.storage_root))


def _write_record(path: Path, record: dict, folder: str | None = None, elsewhere: dict[str, str] | None = None) -> None:
    """Payload first, record last: sealed, naming the digest of every control document of the artifact (each in
    its version folder `folder`, or where `elsewhere` says)."""
    names = artifact(record["kind"]).documents if folder is not None else ()
    documents = {name: (elsewhere or {}).get(name) or storage.join(folder or "", name) for name in names}
    storage.write_json(str(path), sealed(record, stored_digests(documents)))


def _trainer(*argv: str) -> int:
    """rlbuild reaches the trainer only through its command line."""
    return interrupts.run_child([sys.executable, "-m", "trainer", *argv])


def _verified_launch(launch_uri: str, launch_record: str) -> tuple[LaunchDocument, dict]:
    """The launch document and its stored record, both verified: the record's seal, and the document's bytes
    against the digest the record names (a launch.yaml edited after resolve_launch is refused, not trained)."""
    record = read_record(launch_record)
    if record is None:
        raise RlbuildError(f"{launch_record} is missing; rerun the resolve_launch rule")
    data = verify_document(record, artifact("launch").output, launch_uri)
    if data is None:
        return load_launch(launch_uri), record  # says it does not exist, and what to run
    return launch_from_text(data.decode("utf-8", errors="replace"), launch_uri), record


def cmd_check(args: argparse.Namespace) -> int:
    """The dry run's checks without Snakemake: same defaults (config/config.yaml), same storage-backed checks,
    and what the scheduler itself says where it answers (a partition that cannot hold the gang)."""
    from rlbuild.plan.versioning import check_all
    from rlbuild.workflow import experiment_file, profile_executor, workflow_config

    config = workflow_config(load_yaml(REPO / "config" / "config.yaml", "config"), "config/config.yaml")
    storage_root = _storage_root(args.storage_root or str(REPO / config.storage_root))
    versions = [args.version] if args.version is not None else config.versions
    plans: dict[str, Plan] = {}
    costs: dict[str, Cost] = {}
    checked: CheckedExperiment | None = None
    executor = "local"  # no plan is printed when the profile is refused
    try:
        path = experiment_file(REPO, args.experiment or config.experiment)
        executor, shares_venv = profile_executor(REPO, args.profile)
        checked = check(load_experiment(path), shares_venv=shares_venv)
        plans, errors, costs = check_all(checked, versions, storage_root, str(path), config.node_limits)
    except RlbuildError as exc:
        errors = exc.as_violations()
    if errors and not args.json:
        print(redact_text(str(PreflightError(str(args.experiment or config.experiment), errors))), file=sys.stderr)
    if args.json:
        found = {"ok": not errors, "errors": [v.as_dict() for v in errors]}
        dicts = {v: plan_dict(p, cost=costs.get(v), executor=executor) for v, p in plans.items()}
        print(json.dumps(found | {"plans": dicts}, indent=2))
    else:
        from rlbuild.plan.series import plan_lines

        texts = [format_plan(p, cost=costs.get(v), executor=executor) for v, p in plans.items()]
        if checked is not None:  # a series: what each arm changes, which stages it shares
            texts = ["\n".join([text, *plan_lines(checked, v)]) for text, v in zip(texts, plans, strict=True)]
        print("\n\n".join(texts))
    return EXIT_INVALID if errors else 0


# `rlbuild status` waits at most about 5 s for storage (one attempt), then says `storage unreachable`.
STATUS_STORAGE_WAIT = {
    "RLBUILD_S3_CONNECT_TIMEOUT_S": "2",
    "RLBUILD_S3_READ_TIMEOUT_S": "3",
    "RLBUILD_S3_ATTEMPTS": "1",
}


def cmd_status(args: argparse.Namespace) -> int:
    """Every artifact's state from storage (and the scheduler, for a running job); `--watch N` refreshes."""
    import time

    from rlbuild.ops.status import (
        Options,
        StatusTargetError,
        addresses_from_environment,
        gather,
        target_selection,
    )
    from rlbuild.ops.statusview import format_status
    from rlbuild.workflow import experiment_file, workflow_config

    config = workflow_config(load_yaml(REPO / "config" / "config.yaml", "config"), "config/config.yaml")
    storage_root = _storage_root(args.storage_root or str(REPO / config.storage_root))
    experiment = load_experiment(experiment_file(REPO, args.experiment or config.experiment))
    try:
        versions, kinds = target_selection(args.targets) if args.targets else (config.versions, None)
    except StatusTargetError as error:  # a mistyped target is bad input (exit 2), as everywhere else
        fix = f"give KIND/vVERSION, e.g. {artifact('export').version_folder('2026.09.21')}"
        raise PreflightError("rlbuild status", [Violation("targets", str(error).split(";")[0], fix)]) from None
    if args.version:
        versions = [args.version]
    addresses = addresses_from_environment() | _addresses(args)
    options = Options(stall_after_s=args.stall_after, addresses=addresses, verify=args.verify)
    while True:
        try:
            with storage.waits(STATUS_STORAGE_WAIT):  # a person is waiting: seconds, not storage's minutes
                document = gather(experiment, versions, storage_root, kinds, options)
        except storage.StorageUnavailableError as error:
            print(f"storage unreachable: {redact_text(str(error))}", file=sys.stderr)
            return 1
        text = json.dumps(document, indent=2) if args.json else format_status(document)
        if args.watch and not args.json and sys.stdout.isatty():
            print("\033[2J\033[H", end="")
        print(text, flush=True)
        if not args.watch:  # a version that cannot be resolved is bad input, as in `rlbuild check`
            return EXIT_INVALID if any("error" in kinds for kinds in document["versions"].values()) else 0
        time.sleep(args.watch)


def cmd_lease(args: argparse.Namespace) -> int:
    """`rlbuild lease break <artifact>`: free an artifact's lease for a person (rlbuild/ops/lease.py)."""
    from rlbuild.contracts.artifacts import key_of_target, kind_of_target
    from rlbuild.ops.lease import break_lease
    from rlbuild.ops.status import unscoped
    from rlbuild.workflow import experiment_file, workflow_config

    kind, key = kind_of_target(args.artifact), key_of_target(args.artifact)
    if kind is None or key is None:
        fix = f"give KIND/vVERSION, e.g. {artifact('train').version_folder('2026.09.21')}"
        problem = Violation("artifact", f"{args.artifact!r} names no artifact", fix)
        raise PreflightError("rlbuild lease break", [problem])
    config = workflow_config(load_yaml(REPO / "config" / "config.yaml", "config"), "config/config.yaml")
    storage_root = _storage_root(args.storage_root or str(REPO / config.storage_root))
    experiment = load_experiment(experiment_file(REPO, args.experiment or config.experiment))
    root = experiment_root(unscoped(storage_root, experiment.name), experiment.name)
    broken = break_lease(root, kind, key, force=args.force)
    print(f"rlbuild: {broken}; recorded in {root}/.leases (rlbuild status shows it)")
    return 0


def _addresses(args: argparse.Namespace) -> dict[str, str]:
    """Each scheduler's address given on the command line (`add_address_options`), by scheduler name."""
    return {name: value for name in SCHEDULERS if (value := getattr(args, f"address_{name}", None))}


def add_address_options(parser: argparse.ArgumentParser, schedulers: list[type[Scheduler]], verb: str) -> None:
    """A flag per scheduler that answers at an address (its default: the variable its executor plugin reads)."""
    for cls in schedulers:
        if (option := cls.address_option) is not None:
            parser.add_argument(
                option.flag,
                dest=f"address_{cls.name}",
                metavar="ADDRESS",
                help=f"{verb} this {option.what} (default: {option.variable})",
            )


def coordinating() -> type[Scheduler]:
    """The scheduler that runs detached coordinators (`rlbuild submit`)."""
    return next(cls for cls in SCHEDULERS.values() if cls.runs_coordinators)


def _submit_context(args: argparse.Namespace) -> tuple[Scheduler, str, Path, Experiment]:
    """(scheduler, experiment root in its profile's storage, experiment file, experiment) of `rlbuild submit` /
    `rlbuild cancel`."""
    from rlbuild.ops.status import unscoped
    from rlbuild.workflow import experiment_file, workflow_config

    cls = coordinating()
    option = cls.address_option
    address = _addresses(args).get(cls.name) or (os.environ.get(option.variable) if option else None)
    bucket, prefix = os.environ.get("RLBUILD_BUCKET"), os.environ.get("RLBUILD_PREFIX", "")
    root = args.storage_root or (f"s3://{bucket}/{prefix}".rstrip("/") if bucket else None)
    problems = []
    if option is not None and not address:
        problems.append(Violation(option.flag, f"no {option.what}", f"pass it, or set {option.variable}"))
    if not root:
        problems.append(
            Violation(
                "--storage-root",
                "no storage root",
                f"pass it, or set RLBUILD_BUCKET (and RLBUILD_PREFIX) as for --profile {cls.name}",
            )
        )
    if problems:  # bad input, exit 2 like every other
        raise PreflightError(f"rlbuild {args.command}", problems)
    config = workflow_config(load_yaml(REPO / "config" / "config.yaml", "config"), "config/config.yaml")
    path = experiment_file(REPO, args.experiment or config.experiment)
    experiment = load_experiment(path)
    root = experiment_root(unscoped(str(root), experiment.name), experiment.name)
    return cls(address), root, path, experiment


def with_config(argv: list[str], entry: str) -> list[str]:
    """`argv` with `entry` in its (last) `--config`: Snakemake keeps only the last of several `--config` flags."""
    if "--config" not in argv:
        return [*argv, "--config", entry]
    at = len(argv) - argv[::-1].index("--config")
    return [*argv[:at], entry, *argv[at:]]


def cmd_submit(args: argparse.Namespace) -> int:
    """The graph as a detached job (a coordinator) of the scheduler that runs them; returns once it has it."""
    from rlbuild.workflow import in_checkout

    scheduler, root, path, experiment = _submit_context(args)
    # The coordinator runs the checkout's bundle: it is handed the experiment as the bundle holds it.
    passed = with_config(args.snakemake_args, f"experiment={in_checkout(REPO, path)}")
    request = CoordinatorRequest(
        root, args.targets, passed, REPO, experiment.runtime.image, args.cpu, args.memory, args.disk, args.cpu_pool
    )
    job, adopted = scheduler.submit_coordinator(request)
    verb = "is already running as" if adopted else "submitted as"
    print(f"coordinator of {' '.join(args.targets) or 'the default targets'} {verb} {scheduler.title} job {job}")
    print(f"watch it:  python -m rlbuild status --storage-root {root.rsplit('/', 1)[0]} --watch 30")
    print(f"cancel it: python -m rlbuild cancel {' '.join(args.targets)}".rstrip())
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """Stop a detached coordinator and every job it submitted."""
    scheduler, root, _, _ = _submit_context(args)
    cancelled = scheduler.cancel_coordinators(root, args.targets)
    for job in cancelled:
        print(f"cancelled {scheduler.title} job {job} and the jobs it submitted")
    if not cancelled:
        print(f"no running coordinator of {' '.join(args.targets) or root} found")
    return 0


def cmd_base_model(args: argparse.Namespace) -> int:
    from rlbuild.stages.basemodel import build_or_copy, cache_folder

    plan = _plan(args)
    fields = plan.records["base_model"]["fields"]
    seed, variant = fields["seed"], fields["revision"]
    code = build_or_copy(
        Path(args.out),
        seed,
        variant,
        lambda out: _trainer("base-model", "--out", str(out), "--seed", str(seed), "--variant", variant),
        cache_folder(),
    )
    if code == 0:
        _write_record(Path(args.record), plan.records["base_model"], args.out)
    return code


def cmd_stage_model(args: argparse.Namespace) -> int:
    from rlbuild.contracts.sources import parse_source
    from rlbuild.stages.staging import stage_model

    plan = _plan(args)
    model = plan.experiment.model
    artifacts = {"base_model": Path(args.base_model)} if args.base_model else None
    out = Path(args.out)
    stage_model(
        parse_source(model.source, model.revision),
        parse_source(model.tokenizer.source, model.tokenizer.revision),
        out,
        artifact_dirs=artifacts,
    )
    _write_record(Path(args.record), plan.records["stage_model"], args.out)
    return 0


def cmd_stage_data(args: argparse.Namespace) -> int:
    from rlbuild.contracts.sources import parse_source
    from rlbuild.stages.staging import stage_data

    plan = _plan(args)
    data = plan.experiment.data
    out = Path(args.out)
    stage_data(
        [parse_source(d.source, d.revision) for d in data.train],
        [parse_source(d.source, d.revision) for d in data.validation],
        out,
    )
    _write_record(Path(args.record), plan.records["stage_data"], args.out)
    return 0


def cmd_resolve_launch(args: argparse.Namespace) -> int:
    plan = _plan(args)
    if args.model and args.data:  # the staged inputs: checked before anything is written
        from rlbuild.plan.modelcheck import check_staged_inputs

        train = sorted((Path(args.data) / "train").glob("*.jsonl"))
        problems = check_staged_inputs(Path(args.model), train, plan.recipe)
        if problems:
            raise PreflightError(f"{args.experiment} (staged model {args.model}, data {args.data})", problems)
    storage.write_text(args.out, redact_text(dump_launch(plan.launch)))
    storage.write_text(args.plan, format_plan(plan) + "\n")
    _write_record(Path(args.record), plan.records["launch"], str(Path(args.out).parent))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from rlbuild.schedulers.base import TrainLimits

    launch, launch_record = _verified_launch(args.launch, args.launch_record)
    attempts = launch.artifacts.attempts_root
    trainer_argv = ["run", "--launch", args.launch, "--terminal", args.terminal]
    if args.allow_retrain or os.environ.get(ALLOW_RETRAIN) == "1":
        trainer_argv.append("--allow-retrain")
    limits = TrainLimits(args.max_links, args.stop_lead)
    code = job_scheduler(os.environ).run_training(trainer_argv, args.launch, attempts, limits)
    if code == 0:
        record = derived_record(launch_record, "train")
        metrics = {METRICS_NAME: launch.artifacts.metrics_uri}
        _write_record(Path(args.record), record, str(Path(args.terminal).parent), metrics)
    return code


def _stored_record(kind: str, version_folder: str) -> dict:
    """The record of an artifact a stage is built from, its seal verified (found through the launch document's
    URIs: the rule declares only the files it downloads)."""
    record = read_record(record_of(version_folder))
    if record is None:
        raise RlbuildError(f"{record_of(version_folder)} is missing: the {kind} artifact is not complete; build it")
    return record


def cmd_export(args: argparse.Namespace) -> int:
    import tempfile

    from rlbuild.stages.modelcard import card_for_run

    launch, launch_record = _verified_launch(args.launch, args.launch_record)
    train = _stored_record("train", _parent(launch.artifacts.terminal_manifest_uri))
    verify_document(train, artifact("train").output, args.terminal)
    record = derived_record(launch_record, "export")
    with tempfile.TemporaryDirectory(prefix="rlbuild-card-") as tmp:
        card = Path(tmp) / "README.md"
        card_for_run(launch, args.model_record, args.data_record, record["identity"], args.license).save(card)
        code = _trainer(
            "export", "--launch", args.launch, "--terminal", args.terminal, "--out", args.out, "--card", str(card)
        )
    if code == 0:
        _write_record(Path(args.record), record, args.out)
    return code


def cmd_eval(args: argparse.Namespace) -> int:
    from rlbuild.stages.evaluation import CURVES, RESULTS, TABLE, accuracy_line, run_eval

    launch, launch_record = _verified_launch(args.launch, args.launch_record)
    verify_document(
        _stored_record("train", _parent(launch.artifacts.terminal_manifest_uri)),
        METRICS_NAME,
        launch.artifacts.metrics_uri,
    )
    verify_document(_stored_record("export", launch.artifacts.export_root), MANIFEST, str(Path(args.model) / MANIFEST))
    out = Path(args.out)
    validation = sorted((Path(args.data) / "validation").glob("*.jsonl"))
    results = run_eval(Path(args.model), validation, launch, out, k=args.k)
    _write_record(Path(args.record), derived_record(launch_record, "eval"), args.out)
    # The rule's log (logs/eval/v<version>.log) is this stream: what was measured and where it is.
    print(f"rlbuild eval: {launch.run.name} v{launch.run.version}: {accuracy_line(results)}", file=sys.stderr)
    for warning in results["training"]["warnings"]:
        print(f"rlbuild eval: warning: {warning}", file=sys.stderr)
    print(f"rlbuild eval: wrote {out / RESULTS}, {TABLE} and {CURVES} beside it", file=sys.stderr)
    return 0


def _parent(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[0]


def cmd_publish(args: argparse.Namespace) -> int:
    from rlbuild.stages.publish import PublishError, run_publish

    experiment = load_experiment(Path(args.experiment))
    settings = experiment.execution.publish
    if settings is None:
        raise PublishError(f"{args.experiment} sets no execution.publish: add {{repo_id: <owner>/<name>}} to publish")
    published = run_publish(
        Path(args.model),
        Path(args.results),
        Path(args.out),
        {"repo_id": settings.repo_id, "private": settings.private, "tag": settings.tag(args.version)},
        os.environ,
        args.version,
    )
    print(f"rlbuild: published {published['repo_id']} at {published['revision']} (tag {published['tag']})")
    return 0


def _experiment_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiment", required=True, help="path to config/experiments/<name>.yaml")
    parser.add_argument("--version", required=True, help="YYYY.MM.DD[.N] or dev")
    parser.add_argument("--storage-root", default=DEFAULT_STORAGE_ROOT, help="local folder or s3://bucket/prefix")


def cmd_compare(args: argparse.Namespace) -> int:
    """The series report of one version: every arm side by side. The rule `compare` names each arm's launch
    document and eval results; a person names the version, and the arms are read from the storage root."""
    from rlbuild.ops.compare import CompareError, noise_words, read_arm, write_report
    from rlbuild.plan.series import series_keys
    from rlbuild.workflow import experiment_file, workflow_config

    if args.launches:
        checked = check(load_experiment(Path(args.experiment)))
        pairs = list(zip(args.launches, args.results or [], strict=True))
        out = Path(args.out)
    else:
        config = workflow_config(load_yaml(REPO / "config" / "config.yaml", "config"), "config/config.yaml")
        checked = check(load_experiment(experiment_file(REPO, args.experiment or config.experiment)))
        experiment = checked.experiment
        root = experiment_root(_storage_root(args.storage_root or str(REPO / config.storage_root)), experiment.name)
        version = args.version or config.versions[0]
        _compared_series(experiment, version)
        keys = series_keys(checked, version)
        pairs = [
            (storage.join(root, artifact("launch").path(k)), storage.join(root, artifact("eval").path(k))) for k in keys
        ]
        missing = [k for (_, results), k in zip(pairs, keys, strict=True) if not storage.exists(results)]
        if missing:
            raise CompareError(
                f"{experiment.name}: {', '.join(missing)} not evaluated yet in {root}; build the series first "
                f"(snakemake --cores 2 --config experiment={args.experiment or config.experiment})"
            )
        out = Path(args.out or f"series-{experiment.name}-v{version}")
    report = write_report(checked, [read_arm(*pair) for pair in pairs], out)
    for arm, found in report["arms"].items():
        accuracy = found["scores"].get("accuracy")
        shown = "—" if accuracy is None else f"{accuracy:.3f}"
        delta = noise_words(found, report["base"])
        print(f"{arm:<16} accuracy {shown}{f' ({delta})' if delta else ''}  GPU-h {found['gpu_hours']}  {found['key']}")
    print(f"rlbuild: series report in {out}/")
    return 0


def _compared_series(experiment: Experiment, version: str) -> None:
    """A comparison needs a series (an experiment with arms) and a version it could have built: else bad input."""
    from rlbuild.plan.spec import check_version

    problems = check_version(version)
    if not experiment.arms:
        problems.append(
            Violation(
                "experiment",
                f"{experiment.name} is not a series (it has no arms:), so there is nothing to compare",
                "name a series: an experiment with arms: in config/experiments/ (rlbuild compare <series>)",
            )
        )
    if problems:
        raise PreflightError("rlbuild compare", problems)


PEOPLE_COMMANDS = {cmd_check, cmd_status, cmd_submit, cmd_cancel, cmd_compare, cmd_lease}
# The rules' subcommands that build an artifact under its lease (the kind the Snakemake run leased).
LEASED_KIND = {
    "base-model": "base_model",
    "stage-model": "stage_model",
    "stage-data": "stage_data",
    "resolve-launch": "launch",
    "train": "train",
    "export": "export",
    "eval": "eval",
}


def _operator_commands(sub: argparse._SubParsersAction) -> None:
    """The commands a person runs on a long run: status, submit, cancel."""
    status = sub.add_parser("status", help="what is built, running, stale or failed; the health of a running train")
    status.add_argument("targets", nargs="*", help="artifact targets, e.g. export/v2026.09.21 (default: every kind)")
    status.add_argument("--experiment", help="an experiment name or .yaml path (default: config/config.yaml's)")
    status.add_argument("--version", help="one version (default: the targets', else config/config.yaml's versions)")
    status.add_argument(
        "--storage-root", help="local folder or s3://bucket/prefix (default: config/config.yaml's, in the repository)"
    )
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument(
        "--verify", action="store_true", help="also check every checkpoint shard against its manifest (reads them all)"
    )
    status.add_argument("--watch", type=float, metavar="N", help="refresh every N seconds until interrupted")
    status.add_argument(
        "--stall-after",
        type=float,
        default=None,
        metavar="S",
        help="seconds without a step that count as stalled (default: 20 measured steps, at least 60 s; 600 s "
        "before a step time is measured)",
    )
    add_address_options(status, list(SCHEDULERS.values()), "ask")
    status.set_defaults(func=cmd_status)

    coordinator = coordinating()
    for name, func, help_text in (
        ("submit", cmd_submit, f"run the graph as a detached coordinator job on {coordinator.title}, and return"),
        ("cancel", cmd_cancel, "stop a detached coordinator and the jobs it submitted"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("targets", nargs="*", help="artifact targets, e.g. export/v2026.09.21 (default: rule all)")
        if name == "submit":
            p.epilog = "Arguments after `--` go to the coordinator's snakemake."
        p.add_argument("--experiment", help="an experiment name or .yaml path (default: config/config.yaml's)")
        p.add_argument("--storage-root", help="s3://bucket/prefix (default: s3://$RLBUILD_BUCKET/$RLBUILD_PREFIX)")
        add_address_options(p, [coordinator], "submit to")
        if name == "submit":
            p.add_argument("--cpu", type=float, default=4.0, help="coordinator CPUs (seed 000: 4)")
            p.add_argument("--memory", default="16GB", help="coordinator memory")
            p.add_argument("--disk", default="64GB", help="coordinator disk")
            p.add_argument("--cpu-pool", help="the worker pool of CPU jobs (default: the executor's)")
        p.set_defaults(func=func)


PEOPLE_VERBS = "{check,status,compare,submit,cancel,lease}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rlbuild",
        description=__doc__,
        epilog="Exit codes: 0 done, 2 bad input (the error names the field and the fix), 1 a runtime failure, "
        "130 interrupted (by Ctrl-C, as a shell reports it).",
    )
    parser.add_argument("--version", action="version", version=f"rlbuild {_package_version()}")
    # The rules' own subcommands (stage-model, train, export, ...) work as before but are not listed here.
    sub = parser.add_subparsers(dest="command", required=True, metavar=PEOPLE_VERBS)

    check = sub.add_parser("check", help="run every preflight check; print the plan or all errors (exit 0 / 2)")
    check.add_argument(
        "experiment", nargs="?", help="an experiment name or .yaml path (default: config/config.yaml's experiment)"
    )
    check.add_argument("--version", help="YYYY.MM.DD[.N] or dev (default: config/config.yaml's versions)")
    check.add_argument(
        "--storage-root", help="local folder or s3://bucket/prefix (default: config/config.yaml's, in the repository)"
    )
    check.add_argument(
        "--profile",
        help="judge the nodes' runtime as `snakemake --profile NAME` runs the jobs (profiles/NAME: a profile whose "
        "nodes share no disk sets up from uv.lock or runs runtime.image); default: the local executor, this .venv",
    )
    check.add_argument("--json", action="store_true", help="machine-readable output")
    check.set_defaults(func=cmd_check)

    compare = sub.add_parser("compare", help="the series report of a version: every arm's curves, evals and cost")
    compare.add_argument("experiment", nargs="?", help="an experiment name or .yaml path (default: config.yaml's)")
    compare.add_argument("--version", help="YYYY.MM.DD[.N] or dev (default: config/config.yaml's first version)")
    compare.add_argument("--storage-root", help="local folder or s3://bucket/prefix (default: config/config.yaml's)")
    compare.add_argument("--out", help="the report's folder (default: ./series-<experiment>-v<version>/)")
    compare.add_argument("--launches", nargs="+", help="(the rule) each arm's launch.yaml")
    compare.add_argument("--results", nargs="+", help="(the rule) each arm's eval results.json, in the same order")
    compare.set_defaults(func=cmd_compare)

    _operator_commands(sub)
    _lease_commands(sub)
    _stage_commands(sub)
    return parser


def _lease_commands(sub: argparse._SubParsersAction) -> None:
    """`rlbuild lease break`: a person frees a lease its run can no longer free."""
    lease = sub.add_parser("lease", help="break an artifact's lease (a run that died where it cannot be seen)")
    verbs = lease.add_subparsers(dest="lease_verb", required=True, metavar="{break}")
    breaking = verbs.add_parser("break", help="delete the lease; refused while its holder is alive, unless --force")
    breaking.add_argument("artifact", help="the artifact, e.g. train/v2026.09.21")
    breaking.add_argument("--experiment", help="an experiment name or .yaml path (default: config/config.yaml's)")
    breaking.add_argument("--storage-root", help="local folder or s3://bucket/prefix (default: config/config.yaml's)")
    breaking.add_argument("--force", action="store_true", help="break it even though its holder heartbeats")
    breaking.set_defaults(func=cmd_lease)


def _stage_commands(sub: argparse._SubParsersAction) -> None:
    """The subcommands the rules call, one per stage."""
    for name, func, help_text in (
        ("base-model", cmd_base_model, "build the tiny base model in code (embedded default)"),
        ("stage-model", cmd_stage_model, "stage model + tokenizer with a manifest"),
        ("stage-data", cmd_stage_data, "stage train/validation data with a manifest"),
    ):
        p = sub.add_parser(name, description=help_text)
        _experiment_args(p)
        p.add_argument("--out", required=True)
        p.add_argument("--record", required=True, help="where the identity record goes (written last)")
        if name == "stage-model":
            p.add_argument("--base-model", help="folder made by the base_model rule, for artifact:base_model")
        p.set_defaults(func=func)

    launch = sub.add_parser("resolve-launch", description="write the resolved launch.yaml and its identity record")
    _experiment_args(launch)
    launch.add_argument("--out", required=True)
    launch.add_argument("--record", required=True)
    launch.add_argument("--plan", required=True, help="where to write the human-readable plan (for the report)")
    launch.add_argument("--model", help="the staged model folder: its tokenizer is checked against the data")
    launch.add_argument("--data", help="the staged data folder: its train prompts must fit max_prompt_length")
    launch.set_defaults(func=cmd_resolve_launch)

    train = sub.add_parser("train", description="run the trainer, then write the train identity record")
    train.add_argument("--launch", required=True)
    train.add_argument("--launch-record", required=True)
    train.add_argument("--terminal", required=True)
    train.add_argument("--record", required=True)
    train.add_argument("--allow-retrain", action="store_true", help="retrain a fixed version's completed run")
    train.add_argument("--max-links", type=int, default=1, help="jobs a chain across wall-clock limits may take")
    train.add_argument(
        "--stop-lead", type=int, default=0, help="seconds before a job's limit at which training hands over"
    )
    train.set_defaults(func=cmd_train)

    _delivery_commands(sub)


def _delivery_commands(sub: argparse._SubParsersAction) -> None:
    """The subcommands of the stages after training: export, eval, publish."""
    export = sub.add_parser("export", description="export the terminal checkpoint as a Hugging Face folder")
    export.add_argument("--launch", required=True)
    export.add_argument("--launch-record", required=True)
    export.add_argument("--terminal", required=True)
    export.add_argument("--model-record", required=True, help="the staged model's record (sources for the card)")
    export.add_argument("--data-record", required=True, help="the staged data's record (sources for the card)")
    export.add_argument("--license", required=True, help="the card's license: the experiment's `license:`")
    export.add_argument("--out", required=True)
    export.add_argument("--record", required=True)
    export.set_defaults(func=cmd_export)

    evaluate = sub.add_parser("eval", description="score the export on the validation set; write results and plots")
    evaluate.add_argument("--launch", required=True)
    evaluate.add_argument("--launch-record", required=True)
    evaluate.add_argument("--model", required=True)
    evaluate.add_argument("--data", required=True)
    evaluate.add_argument("--out", required=True)
    evaluate.add_argument("--record", required=True)
    evaluate.add_argument("--k", type=int, default=4, help="samples per prompt for pass@k")
    evaluate.set_defaults(func=cmd_eval)

    publish = sub.add_parser("publish", description="upload the export to the Hugging Face Hub and tag the version")
    publish.add_argument("--experiment", required=True, help="path to config/experiments/<name>.yaml")
    publish.add_argument("--version", required=True, help="YYYY.MM.DD[.N] or dev")
    publish.add_argument("--model", required=True, help="the export folder")
    publish.add_argument("--results", required=True, help="the eval stage's results.json (the card's model-index)")
    publish.add_argument("--out", required=True, help="where the published repo, tag and revision are recorded")
    publish.set_defaults(func=cmd_publish)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # `rlbuild submit [TARGET...] [options] -- <snakemake arguments>`: what follows `--` is the coordinator's.
    split = argv.index("--") if argv[:1] == ["submit"] and "--" in argv else len(argv)
    args = build_parser().parse_args(argv[:split])
    args.snakemake_args = argv[split + 1 :]
    if args.func not in PEOPLE_COMMANDS:  # a rule's job: it stops with its Snakemake (rlbuild/job/interrupts.py)
        interrupts.raise_on_signals()
        interrupts.stop_when_snakemake_dies()
        if (kind := LEASED_KIND.get(args.command)) is not None:
            from rlbuild.ops.lease import job_lease

            job_lease(kind, args.record, os.environ)  # every write under the artifact's lease is fenced
    try:
        return args.func(args)
    except interrupts.Interrupted as exc:
        print(
            f"rlbuild: {exc}; its partial output is not a finished artifact (no record), a rerun builds it",
            file=sys.stderr,
        )
        return INTERRUPTED_EXIT_CODE
    except KeyboardInterrupt:  # Ctrl-C on a person's command (status --watch): no traceback, and a script stops
        print(file=sys.stderr)
        interrupts.end_by_signal(signal.SIGINT)
    except PreflightError as exc:
        print(redact_text(str(exc)), file=sys.stderr)
        return EXIT_INVALID
    except RlbuildError as exc:
        print(f"rlbuild: {redact_text(str(exc))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
