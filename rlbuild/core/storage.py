"""Artifact storage: local paths and `s3://` URIs through one fsspec layer, with whole-object writes.

Every part (the rules' subcommands, the trainer, the gang bootstrap) reads and writes storage through these
functions. A write is atomic: readers see the old object or the whole new one (a local file is written under a
temporary name and renamed, an S3 object is one PUT). Files are created readable by the group and others as the
process umask allows, like any other file the user writes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import ipaddress
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from rlbuild.core.errors import PreflightError, RlbuildError, Violation

if TYPE_CHECKING:
    import fsspec

S3 = "s3://"


# Every S3 call waits a bounded time: a stalled or unreachable endpoint is a StorageUnavailableError within
# (connect + read timeout) x attempts plus botocore's backoff (under 1 + 2 + 4 s for 4 attempts), never a hang.
# Defaults: 10 s + 60 s, 4 attempts (at most about 4.8 minutes); RLBUILD_S3_CONNECT_TIMEOUT_S,
# RLBUILD_S3_READ_TIMEOUT_S and RLBUILD_S3_ATTEMPTS change them. The attempts are botocore's, for boto3 and
# aiobotocore (s3fs) alike: `total_max_attempts` counts the first try (botocore's `max_attempts` does not, which
# made 5), and s3fs's own retry loop (5 more rounds of those attempts by default) is cut to one round.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
S3_ATTEMPTS = 4
# A folder transfer (put_dir, get_dir) is one call of many requests: each is bounded as above, and the whole call
# by the one-request bound plus its bytes at this floor rate (a 16 GB checkpoint: about 4.5 hours), so a
# transfer that trickles without ever timing out a request still ends.
FLOOR_BYTES_PER_S = 1 << 20


class StorageError(RlbuildError):
    """A storage location that cannot be used as given."""


class StorageUnavailableError(StorageError):
    """The storage endpoint did not answer within the bounded wait, or refused the connection."""


class LeaseLostError(RlbuildError):
    """This process builds under a lease that another run has taken over (or a person broke): it writes nothing
    more (rlbuild/ops/lease.py)."""


# A job that builds an artifact under a lease (its `rlbuild` subcommand and everything it starts: the trainer, its
# Ray workers) carries the lease's URI and the run that took it. Every write it makes first reads the lease again
# and is refused once another run holds it: a run frozen past the lease's expiry (SIGSTOP, a paused VM) and
# continued after a takeover writes nothing over the new holder's artifacts. The check and the write are two
# requests, so the window left is one request's length, not the minutes of a freeze.
LEASE_ENV = "RLBUILD_LEASE"
LEASE_RUN_ENV = "RLBUILD_LEASE_RUN"
_LOST: dict[tuple[str, str], str] = {}  # (lease, run) -> who holds it: once lost, never the run's again


def fence() -> None:
    """Raise LeaseLostError when this process writes under a lease (LEASE_ENV) its run (LEASE_RUN_ENV) no longer
    holds; nothing when it writes under none."""
    uri, run = os.environ.get(LEASE_ENV), os.environ.get(LEASE_RUN_ENV)
    if uri and run:
        check_lease(uri, run)


def check_lease(uri: str, run: str) -> None:
    """Raise LeaseLostError, naming who holds it now, unless the lease at `uri` is held by `run`."""
    if (uri, run) not in _LOST:
        text = read_text(uri)
        try:
            holder = json.loads(text) if text is not None else None
        except ValueError:
            holder = {}  # unreadable: it names no run, so not ours
        if isinstance(holder, dict) and holder.get("run") == run:
            return
        _LOST[uri, run] = _holder_text(holder)
    raise LeaseLostError(
        f"run {run} lost its lease {uri}: {_LOST[uri, run]}. It stops here without writing; the artifact is that run's "
        "to build (rlbuild status shows it)."
    )


def _holder_text(holder: Any) -> str:
    if holder is None:
        return "no run holds it now (released by the run that took it over, or broken with `rlbuild lease break`)"
    if not isinstance(holder, dict) or not holder.get("run"):
        return "it now holds an unreadable document (not written by rlbuild)"
    return (
        f"run {holder['run']} of {holder.get('user')}@{holder.get('host')} (pid {holder.get('pid')}) holds it now, "
        f"since {holder.get('since')}"
    )


def _reported[**P, R](function: Callable[P, R]) -> Callable[P, R]:
    """S3 faults (no answer, refused connection, timeouts) become one StorageUnavailableError naming the endpoint,
    the wait and what to do; a missing object stays what each function makes of it."""

    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        started = time.monotonic()
        try:
            return function(*args, **kwargs)
        except (FileNotFoundError, FileExistsError):
            raise
        except Exception as error:
            uri = next((a for a in args if isinstance(a, str) and is_s3(a)), None)
            if uri is None or not _is_fault(error):
                raise
            endpoint = _s3_settings()["endpoint_url"] or "AWS S3"
            raise StorageUnavailableError(
                f"storage at {endpoint} {_what_happened(time.monotonic() - started)}: {function.__name__}({uri}) "
                f"({type(error).__name__}: {str(error)[:200]}). "
                "Check the endpoint and the network; completed artifacts are safe, and a rerun resumes."
            ) from None

    return call


def _what_happened(waited_s: float) -> str:
    """A refusal within the first connect timeout came at once (nothing listens, a name that does not resolve):
    the bounded wait was not what stopped it, and saying so would send a person to look for a slow network."""
    timeouts = _s3_timeouts()
    if waited_s < timeouts["connect_timeout"]:
        attempts = timeouts["retries"]["total_max_attempts"]
        return (
            f"refused each of {attempts} attempt(s) at once ({waited_s:.1f} s in all, the pauses between them "
            "included; no timeout was reached: is anything listening there?)"
        )
    return (
        f"did not answer within {timeouts['connect_timeout']:.0f} s + {timeouts['read_timeout']:.0f} s x "
        f"{timeouts['retries']['total_max_attempts']} attempts"
    )


def _is_fault(error: BaseException) -> bool:
    from botocore.exceptions import BotoCoreError, ClientError

    if isinstance(error, ClientError):
        return False  # the server answered (access denied, no such bucket, ...): not an outage
    return isinstance(error, BotoCoreError | OSError | TimeoutError)


def is_s3(uri: str) -> bool:
    return uri.startswith(S3)


def filesystem(uri: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path within it) for a local path or an `s3://` URI (settings: `fsspec_options`)."""
    import fsspec  # here: a dry run reads storage through boto3 alone, and fsspec's import costs it 45 ms

    if not is_s3(uri):
        if "://" in uri:
            raise StorageError(f"storage URI {uri!r}: only local paths and s3:// URIs are supported")
        return fsspec.filesystem("file"), uri
    return fsspec.filesystem("s3", **fsspec_options(uri)), uri.removeprefix(S3)


def fsspec_options(uri: str) -> dict[str, Any]:
    """The fsspec settings for `uri`, for libraries that open storage themselves (torch.distributed.checkpoint).

    S3 settings come from the variables the Snakemake S3 storage plugin reads
    (SNAKEMAKE_STORAGE_S3_{ENDPOINT_URL,ACCESS_KEY,SECRET_KEY,TOKEN,REGION}), so jobs reach the same store as
    Snakemake; unset ones fall back to boto's AWS_* chain.
    """
    if not is_s3(uri):
        return {}
    _one_retry_round()
    settings = _s3_settings()
    # No listing or instance cache: a verification must see storage as it is now.
    return {
        "endpoint_url": settings["endpoint_url"],
        "key": settings["aws_access_key_id"],
        "secret": settings["aws_secret_access_key"],
        "token": settings["aws_session_token"],
        "client_kwargs": {"region_name": settings["region_name"]} if settings["region_name"] else {},
        "config_kwargs": _s3_timeouts(),
        "skip_instance_cache": True,
        "use_listings_cache": False,
    }


def endpoint_violation(environ: Mapping[str, str]) -> Violation | None:
    """The S3 endpoint setting Snakemake's S3 plugin and rlbuild both read, if it cannot be an endpoint."""
    endpoint = environ.get("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL")
    if endpoint and (problem := endpoint_problem(endpoint)):
        fix = "export the store's http(s)://host[:port], or unset it for AWS S3"
        return Violation("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL", problem, fix)
    return None


def _s3_settings() -> dict[str, str | None]:
    env = os.environ
    if violation := endpoint_violation(env):
        raise PreflightError("the S3 settings", [violation])
    return {
        "endpoint_url": env.get("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL") or None,
        "aws_access_key_id": env.get("SNAKEMAKE_STORAGE_S3_ACCESS_KEY") or None,
        "aws_secret_access_key": env.get("SNAKEMAKE_STORAGE_S3_SECRET_KEY") or None,
        "aws_session_token": env.get("SNAKEMAKE_STORAGE_S3_TOKEN") or None,
        "region_name": env.get("SNAKEMAKE_STORAGE_S3_REGION") or None,
    }


def _s3_timeouts() -> dict[str, Any]:
    env = os.environ
    return {
        "connect_timeout": float(env.get("RLBUILD_S3_CONNECT_TIMEOUT_S") or CONNECT_TIMEOUT_S),
        "read_timeout": float(env.get("RLBUILD_S3_READ_TIMEOUT_S") or READ_TIMEOUT_S),
        "retries": {"total_max_attempts": _attempts(), "mode": "standard"},
    }


def deadline_s() -> float:
    """The most one S3 request may take, retries included: attempts x (connect + read) + botocore's backoff.
    s3fs calls of one object get it as a whole-call deadline too (fsspec's `timeout`): a PUT to an endpoint that
    accepts the connection and never answers was not ended by the read timeout alone."""
    timeouts = _s3_timeouts()
    attempts = _attempts()
    return attempts * (timeouts["connect_timeout"] + timeouts["read_timeout"]) + 2 ** (attempts - 1)


@contextlib.contextmanager
def waits(settings: Mapping[str, str]) -> Iterator[None]:
    """Storage's waits (the RLBUILD_S3_* variables) for one block, where the user set none; restored after, so an
    in-process caller (a test worker, a notebook) keeps its own: a short wait left behind once made a later,
    unrelated upload on a loaded machine fail on its first slow answer."""
    added = {name: value for name, value in settings.items() if name not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def _attempts() -> int:
    return max(1, int(os.environ.get("RLBUILD_S3_ATTEMPTS") or S3_ATTEMPTS))


def _one_retry_round() -> None:
    """s3fs repeats a failed call (after botocore's own attempts) `retries` times, 5 by default; botocore's bounded
    attempts are the only retries (also for torch.distributed.checkpoint, which opens s3fs itself)."""
    from s3fs import S3FileSystem

    S3FileSystem.retries = 1


def s3_client() -> Any:
    """A boto3 client for what fsspec does not offer (conditional writes), with the same settings and timeouts."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(**_s3_timeouts()), **_s3_settings())


def _whole_call(uri: str) -> dict[str, float]:
    """fsspec's whole-call deadline for an s3fs call of one object (none for local paths)."""
    return {"timeout": deadline_s()} if is_s3(uri) else {}


# An S3 bucket's name as S3-compatible stores accept it (lower case, digits, '.', '-'; AWS itself wants 3+ characters).
BUCKET_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$")


def bucket_problem(bucket: str) -> str | None:
    """Why `bucket` cannot be an S3 bucket's name (an unset variable's empty one, a `...` placeholder); None if
    it can."""
    if BUCKET_NAME.match(bucket) and ".." not in bucket:
        return None
    return f"{bucket!r} is not a bucket name" + (" (an unset variable leaves it empty)" if not bucket else "")


def storage_root(root: str, field: str) -> str:
    """`root` checked once, from whichever entry point names it (`--storage-root`, `--config storage_root=`, the
    default): a local folder (returned absolute) that exists or can be made, and is writable, or
    `s3://<bucket>[/<prefix>]`. Nothing is created: a dry run or a check leaves the disk as it found it."""
    problem, fix = _root_problem(root)
    if problem is None:
        return root if "://" in root else str(Path(root).resolve())
    raise PreflightError(field, [Violation("storage_root", f"{root!r} {problem}", fix)])


def _root_problem(root: str) -> tuple[str | None, str]:
    """(why `root` cannot hold artifacts, or None; the fix)."""
    local_fix = "give a writable folder, or a new one whose nearest existing parent is a writable folder"
    if "://" in root:
        scheme, _, rest = root.partition("://")
        why = f"scheme {scheme!r} is not s3" if scheme != "s3" else bucket_problem(rest.split("/", 1)[0])
        fix = "give s3://<bucket>/<prefix> with a real bucket (export RLBUILD_BUCKET and RLBUILD_PREFIX), or a folder"
        return (None if why is None else f"is not a storage location ({why})"), fix
    path = Path(root).resolve()
    if path.exists() and not path.is_dir():
        return "is a file, not a folder", local_fix
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        return f"cannot be created: {existing} is a file, not a folder", local_fix
    try:  # access(2) says yes to root everywhere; a read-only mount or /proc says no only to a real write
        Path(tempfile.mkdtemp(prefix=".rlbuild-probe-", dir=existing)).rmdir()
    except OSError as error:
        verb = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        return f"{verb} ({error.strerror})", local_fix
    return None, local_fix


def endpoint_problem(url: str) -> str | None:
    """Why `url` cannot be an S3 endpoint (a `http://...` placeholder, no scheme, a bad port); None if it can."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        return f"{url!r} is not a URL ({error})"
    if parts.scheme not in ("http", "https"):
        return f"{url!r} is not an http:// or https:// URL"
    host = parts.hostname or ""
    if not (HOST_NAME.match(host) or _is_ip(host)) or (port is not None and not 0 < port < 65536):
        return f"{url!r} names no host (a placeholder?)"
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _transfer(size: int) -> dict[str, float]:
    """fsspec's whole-call deadline for an s3fs transfer of `size` bytes in many requests."""
    return {"timeout": deadline_s() + size / FLOOR_BYTES_PER_S}


def request_timeouts() -> dict[str, float]:
    """The connect and read timeouts of one S3 request, for clients rlbuild does not make (Snakemake's plugin)."""
    timeouts = _s3_timeouts()
    return {"connect_timeout": timeouts["connect_timeout"], "read_timeout": timeouts["read_timeout"]}


def _bucket_key(uri: str) -> tuple[str, str]:
    bucket, _, key = uri.removeprefix(S3).partition("/")
    return bucket, key


def _precondition_failed(error: Exception) -> bool:
    code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
    return code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


@_reported
def create_exclusive(uri: str, text: str) -> bool:
    """Create the object only if nothing is there (S3 `If-None-Match: *`; a hard link locally); False if it exists."""
    if is_s3(uri):
        from botocore.exceptions import ClientError

        bucket, key = _bucket_key(uri)
        try:
            s3_client().put_object(Bucket=bucket, Key=key, Body=text.encode(), IfNoneMatch="*")
        except ClientError as error:
            if _precondition_failed(error):
                return False
            raise
        return True
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        os.link(tmp, path)  # atomic, and fails if the name exists: the whole content or nothing
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    return True


@_reported
def read_tagged(uri: str) -> tuple[str, str] | None:
    """(content, tag) where the tag changes whenever the object does (S3: its ETag); None if absent."""
    if is_s3(uri):
        return _get_object(s3_client(), uri)
    text = read_text(uri)
    return None if text is None else (text, hashlib.sha256(text.encode()).hexdigest())


@dataclass(frozen=True)
class Aged:
    """An object's text and tag, and its age by storage's own clock: the seconds between its last write and the
    read, both as the storage server (S3: its Last-Modified and Date headers, to the second) or the local
    filesystem tells them, never a host's clock, so a host whose clock is skewed misjudges nothing."""

    text: str
    tag: str
    age_s: float


@_reported
def read_aged(uri: str) -> Aged | None:
    """The object with its age by storage's clock; None if absent."""
    if not is_s3(uri):
        info, text = stat(uri), read_text(uri)
        if info is None or text is None:
            return None
        return Aged(text, hashlib.sha256(text.encode()).hexdigest(), max(time.time() - info.mtime, 0.0))
    from email.utils import parsedate_to_datetime

    response = _get_response(s3_client(), uri)
    if response is None:
        return None
    served = response["ResponseMetadata"]["HTTPHeaders"].get("date")
    now = parsedate_to_datetime(served).timestamp() if served else time.time()  # every HTTP/1.1 server sends Date
    age = now - response["LastModified"].timestamp()
    return Aged(response["Body"].read().decode(), str(response["ETag"]), max(age, 0.0))


def read_many_aged(uris: list[str]) -> dict[str, Aged | None]:
    """`read_aged` of every URI, READ_WORKERS at a time."""
    with ThreadPoolExecutor(max_workers=READ_WORKERS) as pool:
        return dict(zip(uris, pool.map(read_aged, uris), strict=True))


@_reported
def replace_if(uri: str, text: str, tag: str) -> str | None:
    """Overwrite the object only if it still has `tag`; the new tag, or None if someone else changed it.

    S3 checks the ETag itself (`If-Match`); a local file is compared, then replaced atomically (two writers on one
    filesystem within the same millisecond can both win: local leases guard against people, not races)."""
    if is_s3(uri):
        from botocore.exceptions import ClientError

        bucket, key = _bucket_key(uri)
        try:
            response = s3_client().put_object(Bucket=bucket, Key=key, Body=text.encode(), IfMatch=tag)
        except ClientError as error:
            if _precondition_failed(error) or error.response.get("Error", {}).get("Code") == "NoSuchKey":
                return None
            raise
        return str(response["ETag"])
    current = read_tagged(uri)
    if current is None or current[1] != tag:
        return None
    _put_bytes(uri, text.encode("utf-8"))  # a lease's own heartbeat: not a write under the lease
    return hashlib.sha256(text.encode()).hexdigest()


def join(root: str, *parts: str) -> str:
    """`root/part/...` for a local path or URI; empty parts are skipped."""
    return "/".join([root.rstrip("/"), *(p.strip("/") for p in parts if p)])


@_reported
def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return bool(fs.exists(path, **_whole_call(uri)))


@_reported
def read_text(uri: str) -> str | None:
    """The whole object as text; None when it does not exist. One GET (`read_bytes`), not a file handle: a
    handle's HEAD and ranged GETs fail with FileExpired when the object is rewritten between them (a heartbeat,
    progress.json, a `latest` pointer: objects status reads while a gang rewrites them)."""
    data = read_bytes(uri)
    return None if data is None else data.decode("utf-8")


@_reported
def read_bytes(uri: str) -> bytes | None:
    """The whole object's bytes; None when it does not exist."""
    fs, path = filesystem(uri)
    try:
        return bytes(fs.cat_file(path, **_whole_call(uri)))
    except FileNotFoundError:
        return None


def read_json(uri: str) -> Any:
    """A JSON document; None when it does not exist."""
    text = read_text(uri)
    return None if text is None else json.loads(text)


@_reported
def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole object atomically: local files under a temporary name, then renamed; S3 in one PUT."""
    fence()
    _put_bytes(uri, data)


def _put_bytes(uri: str, data: bytes) -> None:
    if is_s3(uri):
        fs, path = filesystem(uri)
        fs.pipe_file(path, data, **_whole_call(uri))
        return
    path = Path(uri)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    # os.open with 0o666 honours the umask, unlike mkstemp's 0o600.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode("utf-8"))


def write_json(uri: str, value: Any) -> None:
    write_text(uri, json.dumps(value, indent=2, sort_keys=True) + "\n")


@_reported
def put_dir(local: Path, uri: str, replace: bool = True) -> None:
    """Copy the contents of a local folder to `uri`, replacing what is there (or, with `replace=False`, beside
    it: how the ranks of one checkpoint each add their own files)."""
    fence()
    if is_s3(uri):
        fs, path = filesystem(uri)
        if replace and fs.exists(path, **_whole_call(uri)):
            fs.rm(path, recursive=True, **_whole_call(uri))
        size = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
        fs.put(f"{str(local).rstrip('/')}/", path.rstrip("/") + "/", recursive=True, **_transfer(size))
        return
    target = Path(uri)
    if replace:
        shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(local, target, dirs_exist_ok=not replace)


@_reported
def get_dir(uri: str, local: Path) -> Path:
    """A local copy of a stored folder (the folder itself when it is already local)."""
    if not is_s3(uri):
        return Path(uri)
    fs, path = filesystem(uri)
    size = int(fs.du(path, total=True, **_whole_call(uri)))
    fs.get(path.rstrip("/") + "/", f"{str(local).rstrip('/')}/", recursive=True, **_transfer(size))
    return local


@_reported
def remove(uri: str) -> None:
    fence()
    fs, path = filesystem(uri)
    if fs.exists(path, **_whole_call(uri)):
        fs.rm(path, recursive=True, **_whole_call(uri))


@_reported
def list_names(uri: str) -> list[str]:
    """Names of the entries directly under `uri` (empty when it does not exist). On S3 one delimiter listing on
    the shared boto3 client: s3fs's first use (imports, its own client) cost `rlbuild status`, which lists the
    coordinators this way, half a second for one request."""
    if is_s3(uri):
        return sorted(list_children(uri))
    fs, path = filesystem(uri)
    try:
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(path, detail=False, **_whole_call(uri)))
    except FileNotFoundError:
        return []


# Bulk reads: what is stored under a folder in one paginated listing, and many small objects read at once.
READ_WORKERS = 16  # concurrent reads of small objects (identity records, leases)


@dataclass(frozen=True)
class StoredObject:
    """One stored object as a listing sees it; `tag` changes whenever the object does (S3: its ETag; a local file:
    its size and mtime in nanoseconds)."""

    uri: str
    size: int
    mtime: float
    tag: str


@functools.cache
def _shared_client(settings: tuple[tuple[str, Any], ...]) -> Any:
    import boto3
    from botocore.config import Config

    # The process's default session, whose loaded service models Snakemake's S3 plugin already paid for; its
    # clients made from now on parse S3's listing timestamps without dateutil (`_listing_timestamp`).
    if boto3.DEFAULT_SESSION is None:
        boto3.setup_default_session()
    session = boto3.DEFAULT_SESSION
    session._session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=_listing_timestamp)
    config = Config(**_s3_timeouts(), max_pool_connections=READ_WORKERS)
    return session.client("s3", config=config, **dict(settings))


def _listing_timestamp(value: Any) -> datetime:
    """botocore's timestamp parser, with the ISO 8601 form S3 lists objects in (`2026-01-01T00:00:00.000Z`) read
    by the standard library: botocore's dateutil takes 0.12 ms a timestamp, a tenth of a second of every listing
    of 1,000 objects. The same instants; any other form (HEAD's HTTP date) goes to botocore's."""
    from botocore.utils import parse_timestamp

    if isinstance(value, str) and value.endswith("Z"):
        with contextlib.suppress(ValueError):
            return datetime.fromisoformat(value)
    return parse_timestamp(value)


def shared_s3_client() -> Any:
    """One boto3 client per set of settings, shared by the threads of bulk reads (boto3 clients are thread-safe)."""
    return _shared_client(tuple(sorted(_s3_settings().items())))


@_reported
def list_tree(uri: str) -> dict[str, StoredObject]:
    """Every object under the folder `uri`, at any depth, by URI (empty when nothing is there): one listing,
    paginated (S3 ListObjectsV2, 1000 keys a page), or one walk of a local folder."""
    if not is_s3(uri):
        found: dict[str, StoredObject] = {}
        for folder, _, names in os.walk(uri):
            for name in names:
                path = os.path.join(folder, name)
                with contextlib.suppress(FileNotFoundError):
                    info = os.stat(path)
                    found[path] = StoredObject(path, info.st_size, info.st_mtime, f"{info.st_size}-{info.st_mtime_ns}")
        return found
    bucket, key = _bucket_key(uri.rstrip("/") + "/")
    return {
        f"{S3}{bucket}/{item['Key']}": StoredObject(
            f"{S3}{bucket}/{item['Key']}", int(item["Size"]), item["LastModified"].timestamp(), str(item["ETag"])
        )
        for page in _pages(bucket, Prefix=key)
        for item in page.get("Contents", [])
    }


@_reported
def list_children(uri: str) -> set[str]:
    """Names of the entries directly under the folder `uri`, files and folders alike (S3: one listing with a
    delimiter, paginated, however much lies deeper)."""
    if not is_s3(uri):
        try:
            return set(os.listdir(uri))
        except (FileNotFoundError, NotADirectoryError):
            return set()
    bucket, key = _bucket_key(uri.rstrip("/") + "/")
    names: set[str] = set()
    for page in _pages(bucket, Prefix=key, Delimiter="/"):
        names.update(p["Prefix"][len(key) :].rstrip("/") for p in page.get("CommonPrefixes", []))
        names.update(item["Key"][len(key) :] for item in page.get("Contents", []))
    return names - {""}


def _pages(bucket: str, **query: str) -> Iterator[dict[str, Any]]:
    from botocore.exceptions import ClientError

    try:
        yield from shared_s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, **query)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") != "NoSuchBucket":
            raise  # a missing bucket holds nothing: Snakemake creates it on the first upload


@_reported
def stat(uri: str) -> StoredObject | None:
    """The object at `uri` as `list_tree` would list it, asked now; None when absent."""
    if not is_s3(uri):
        try:
            info = os.stat(uri)
        except FileNotFoundError:
            return None
        return (
            None
            if os.path.isdir(uri)
            else StoredObject(uri, info.st_size, info.st_mtime, f"{info.st_size}-{info.st_mtime_ns}")
        )
    from botocore.exceptions import ClientError

    bucket, key = _bucket_key(uri)
    try:
        head = shared_s3_client().head_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            return None
        raise
    return StoredObject(uri, int(head["ContentLength"]), head["LastModified"].timestamp(), str(head["ETag"]))


def read_many(uris: list[str]) -> dict[str, tuple[str, str] | None]:
    """`read_tagged` of every URI, READ_WORKERS at a time: {uri: (content, tag) or None when absent}. The tags
    are those `list_tree` reports (S3: the ETag)."""
    with ThreadPoolExecutor(max_workers=READ_WORKERS) as pool:
        return dict(zip(uris, pool.map(_read_listed, uris), strict=True))


@_reported
def _read_listed(uri: str) -> tuple[str, str] | None:
    if not is_s3(uri):
        info = stat(uri)
        text = read_text(uri)
        return None if info is None or text is None else (text, info.tag)
    return _get_object(shared_s3_client(), uri)


def _get_object(client: Any, uri: str) -> tuple[str, str] | None:
    """An S3 object's text and ETag through `client`; None if there is no such object."""
    response = _get_response(client, uri)
    return None if response is None else (response["Body"].read().decode(), str(response["ETag"]))


def _get_response(client: Any, uri: str) -> dict[str, Any] | None:
    """The GetObject response of an S3 object through `client`; None if there is no such object."""
    from botocore.exceptions import ClientError

    bucket, key = _bucket_key(uri)
    try:
        return client.get_object(Bucket=bucket, Key=key)
    except ClientError as error:
        if error.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
            return None
        raise
