"""A recording stand-in for Daytona's API on loopback, for the tests of the `daytona` sandbox backend: no Daytona
account exists here, yet Harbor's DaytonaEnvironment and the daytona SDK under it should run an episode over real
HTTP, and a test should see every request they send (method, path, headers, body), in order.

It answers what one Harbor episode asks of Daytona (Harbor 0.25, daytona 0.226), under three roots of one server:
- `/api` (DAYTONA_API_URL): create a sandbox from a Dockerfile (`POST /sandbox`; it answers `started` at once, so
  the SDK has no state to wait for), delete it (`DELETE /sandbox/<id>`), and the object-storage credentials the
  SDK uploads a Dockerfile's build context with (`GET /object-storage/push-access`);
- `/storage` (the push-access storageUrl): that upload, in S3's protocol (HEAD, then a multipart upload of
  `<org>/<hash>/context.tar`: POST ?uploads, PUT each part, POST ?uploadId to complete);
- `/toolbox` (the sandbox's toolboxProxyUrl): process sessions (`POST /<id>/process/session`, `.../exec`, the
  command's exit code and logs), which Harbor runs every command through, and the bulk file transfer
  (`POST /<id>/files/bulk-upload`, multipart; `POST /<id>/files/bulk-download`, answered multipart), which carries
  Harbor's tarballs of tests/ and /logs/verifier.

The `/api` and `/toolbox` roots refuse a request without the API key as its bearer token, and `/storage` one not
signed with the push-access key, so a test can tell where each credential went.

A sandbox is a folder on this machine whose subfolders are its top-level folders (`<root>/app` is `/app`), with
one user, who runs every command (Harbor's `su` to root or to the task's user runs the command as that user).
"Building" it honours what rlbuild's local backend honours of a Dockerfile (rlbuild/contracts/rows.py
`local_image`: WORKDIR, ENV, COPY from the uploaded context) and refuses the rest; the image's own programs are
not there. Commands run through a `Runner` the caller gives (the tests give one that runs them in rlbuild's
bubblewrap sandbox, trainer/sandbox/local/bubblewrap.py, with those folders bound at their paths), so a model's
command never runs on the host unconfined.
"""

from __future__ import annotations

import io
import json
import secrets
import shlex
import shutil
import tarfile
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Protocol
from xml.sax.saxutils import escape

from werkzeug.exceptions import HTTPException, NotFound
from werkzeug.routing import Map, Rule
from werkzeug.serving import make_server
from werkzeug.wrappers import Request, Response

from rlbuild.contracts.rows import DOCKERFILE, TASK_FILE, local_image

ORGANIZATION = "stand-in-organization"
BUCKET = "stand-in-builds"
STORAGE_KEY = "stand-in-storage-key"  # the push-access key the SDK signs its context upload with
# A sandbox's top-level folders besides its image's: /tmp, and where Harbor's paths start (EnvironmentPaths). The
# sandbox's root is read-only, so a command can create folders only below these and the image's own.
TOP_FOLDERS = ("tmp", "logs", "tests", "solution")

URLS = Map(
    [
        Rule("/api/sandbox", methods=["POST"], endpoint="create"),
        Rule("/api/sandbox/<sandbox>", methods=["DELETE"], endpoint="delete"),
        Rule("/api/object-storage/push-access", methods=["GET"], endpoint="push_access"),
        Rule("/storage/<bucket>/<path:key>", methods=["HEAD", "PUT", "POST"], endpoint="storage"),
        Rule("/toolbox/<sandbox>/process/session", methods=["POST"], endpoint="session"),
        Rule("/toolbox/<sandbox>/process/session/<session>/exec", methods=["POST"], endpoint="execute"),
        Rule("/toolbox/<sandbox>/process/session/<session>/command/<command>", endpoint="command"),
        Rule("/toolbox/<sandbox>/process/session/<session>/command/<command>/logs", endpoint="logs"),
        Rule("/toolbox/<sandbox>/files/bulk-upload", methods=["POST"], endpoint="upload"),
        Rule("/toolbox/<sandbox>/files/bulk-download", methods=["POST"], endpoint="download"),
    ]
)


@dataclass(frozen=True)
class Call:
    method: str
    path: str  # with its query string
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Ran:
    exit_code: int
    stdout: bytes
    stderr: bytes


class Runner(Protocol):
    def __call__(self, root: Path, command: str, env: Mapping[str, str], cwd: str) -> Ran:
        """Run `command` with /bin/sh in the sandbox whose top-level folders are `root`'s subfolders."""
        ...


@dataclass
class _Sandbox:
    id: str
    root: Path
    env: dict[str, str]
    labels: dict[str, str]
    workdir: str
    state: str = "started"
    commands: dict[str, tuple[str, Ran]] = field(default_factory=dict)


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class DaytonaStandIn:
    """The running stand-in: its address, the API key it accepts, and every request it was sent."""

    url: str
    api_key: str
    folder: Path  # the sandboxes' folders
    runner: Runner
    calls: list[Call] = field(default_factory=list)
    sandboxes: dict[str, _Sandbox] = field(default_factory=dict)
    objects: dict[str, bytes] = field(default_factory=dict)  # the build contexts uploaded, by storage key
    uploads: dict[str, dict[int, bytes]] = field(default_factory=dict)  # multipart uploads under way: their parts
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def env(self) -> dict[str, str]:
        """What points the daytona SDK here: the variables it reads when given no configuration."""
        return {"DAYTONA_API_URL": f"{self.url}/api", "DAYTONA_API_KEY": self.api_key}

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        request = Request(environ)
        body = request.get_data(cache=True)  # kept, so the form parsers below read it again
        with self._lock:
            self.calls.append(Call(request.method, request.full_path.rstrip("?"), dict(request.headers), body))
        try:
            endpoint, arguments = URLS.bind_to_environ(environ).match()
            self._authorize(request, endpoint)
            response = getattr(self, f"_{endpoint}")(request, **arguments)
        except HTTPException as error:
            response = error.get_response()
        except _Refused as error:
            response = _json({"message": str(error), "statusCode": error.status}, error.status)
        return response(environ, start_response)

    def _authorize(self, request: Request, endpoint: str) -> None:
        header = request.headers.get("Authorization", "")
        if endpoint == "storage":
            if f"Credential={STORAGE_KEY}/" not in header:
                raise _Refused(403, "not signed with the push-access key")
        elif header != f"Bearer {self.api_key}":
            raise _Refused(401, "Unauthorized")

    def _box(self, sandbox: str) -> _Sandbox:
        if sandbox not in self.sandboxes or self.sandboxes[sandbox].state == "destroyed":
            raise _Refused(404, f"Sandbox with ID or name {sandbox} not found")
        return self.sandboxes[sandbox]

    def _dto(self, box: _Sandbox) -> Response:
        return _json(
            {
                **{"id": box.id, "name": box.id, "organizationId": ORGANIZATION, "user": "root", "target": "local"},
                **{"env": box.env, "labels": box.labels, "public": False, "networkBlockAll": True, "kvm": False},
                **{"cpu": 1, "gpu": 0, "memory": 1, "disk": 3, "state": box.state},
                "toolboxProxyUrl": f"{self.url}/toolbox",
            }
        )

    def _create(self, request: Request) -> Response:
        spec = json.loads(request.get_data())
        box_id = uuid.uuid4().hex
        root = self.folder / box_id
        image_env, workdir = self._build(spec.get("buildInfo") or {}, root)
        box = _Sandbox(box_id, root, {**image_env, **spec.get("env", {})}, spec.get("labels", {}), workdir)
        self.sandboxes[box_id] = box
        return self._dto(box)

    def _build(self, build: dict[str, Any], root: Path) -> tuple[dict[str, str], str]:
        """Lay out a sandbox's folders from a Dockerfile and its uploaded context; its ENV and WORKDIR."""
        if "dockerfileContent" not in build:
            raise _Refused(400, "the stand-in makes sandboxes from a Dockerfile only, not from snapshots")
        with tempfile.TemporaryDirectory() as scratch:
            task = Path(scratch)
            (task / DOCKERFILE).parent.mkdir(parents=True)
            (task / DOCKERFILE).write_text(build["dockerfileContent"])
            (task / TASK_FILE).write_text("")
            for digest in build.get("contextHashes") or []:
                key = f"{ORGANIZATION}/{digest}/context.tar"
                if key not in self.objects:
                    raise _Refused(400, f"build context {digest} was never uploaded")
                with tarfile.open(fileobj=io.BytesIO(self.objects[key])) as archive:
                    archive.extractall((task / DOCKERFILE).parent, filter="data")
            image = local_image(task)
            if isinstance(image, str):
                raise _Refused(400, f"the stand-in builds no image, and {image}")
            if image.problems:
                raise _Refused(400, "; ".join(map(str, image.problems)))
            for name in TOP_FOLDERS:
                (root / name).mkdir(parents=True, exist_ok=True)
            _inside(root, image.workdir).mkdir(parents=True, exist_ok=True)
            for source, destination in image.copies:
                _copy((task / DOCKERFILE).parent / source, _inside(root, destination))
        return image.env, image.workdir

    def _delete(self, request: Request, sandbox: str) -> Response:
        box = self._box(sandbox)
        shutil.rmtree(box.root, ignore_errors=True)
        box.state = "destroyed"
        return self._dto(box)

    def _push_access(self, request: Request) -> Response:
        return _json(
            {
                **{"accessKey": STORAGE_KEY, "secret": "stand-in-storage-secret", "sessionToken": "stand-in-token"},
                **{"storageUrl": f"{self.url}/storage", "organizationId": ORGANIZATION, "bucket": BUCKET},
                "region": "us-east-1",
            }
        )

    def _storage(self, request: Request, bucket: str, key: str) -> Response:
        """S3's HEAD of an object, and the three requests of a multipart upload (obstore's way, whatever the size)."""
        upload = request.args.get("uploadId")
        if request.method == "POST" and "uploads" in request.args:
            upload = uuid.uuid4().hex
            self.uploads[upload] = {}
            return _xml("InitiateMultipartUploadResult", Bucket=bucket, Key=key, UploadId=upload)
        if request.method == "PUT" and upload in self.uploads:
            self.uploads[upload][int(request.args["partNumber"])] = request.get_data()
            return Response(status=200, headers={"ETag": f'"{uuid.uuid4().hex}"'})
        if request.method == "POST" and upload in self.uploads:
            parts = self.uploads.pop(upload)
            self.objects[key] = b"".join(parts[number] for number in sorted(parts))
            return _xml("CompleteMultipartUploadResult", Bucket=bucket, Key=key, ETag='"stored"')
        if request.method == "HEAD" and key in self.objects:
            return Response(status=200, headers={"Content-Length": str(len(self.objects[key])), "ETag": '"stored"'})
        return Response(status=404)

    def _session(self, request: Request, sandbox: str) -> Response:
        self._box(sandbox)
        return Response(status=201)

    def _execute(self, request: Request, sandbox: str, session: str) -> Response:
        """Harbor sends every command with `runAsync` and polls for its exit code, sleeping a second between polls;
        the stand-in runs it to its end before answering, so the first poll finds it."""
        box = self._box(sandbox)
        spec = json.loads(request.get_data())
        ran = self.runner(box.root, _as_the_one_user(spec["command"]), box.env, box.workdir)
        command_id = uuid.uuid4().hex
        box.commands[command_id] = (spec["command"], ran)
        return _json({"cmdId": command_id})

    def _command(self, request: Request, sandbox: str, session: str, command: str) -> Response:
        text, ran = self._ran(sandbox, command)
        return _json({"id": command, "command": text, "exitCode": ran.exit_code})

    def _logs(self, request: Request, sandbox: str, session: str, command: str) -> Response:
        _, ran = self._ran(sandbox, command)
        return _json({"output": (ran.stdout + ran.stderr).decode(errors="replace"), **_streams(ran)})

    def _ran(self, sandbox: str, command: str) -> tuple[str, Ran]:
        commands = self._box(sandbox).commands
        if command not in commands:
            raise NotFound()
        return commands[command]

    def _upload(self, request: Request, sandbox: str) -> Response:
        box = self._box(sandbox)
        for name, path in request.form.items():
            if name.endswith(".path"):
                target = _inside(box.root, path, box.workdir)
                target.parent.mkdir(parents=True, exist_ok=True)
                request.files[name.removesuffix(".path") + ".file"].save(target)
        return Response(status=200)

    def _download(self, request: Request, sandbox: str) -> Response:
        """Each file as a part named `file` (or `error`), its path as the part's filename, as the SDK parses."""
        box = self._box(sandbox)
        boundary = secrets.token_hex(16)
        parts = []
        for path in json.loads(request.get_data())["paths"]:
            target = _inside(box.root, path, box.workdir)
            name, content = ("file", target.read_bytes()) if target.is_file() else ("error", b"file not found")
            head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"; filename="{path}"\r\n'
            parts.append(head.encode() + b"Content-Type: application/octet-stream\r\n\r\n" + content + b"\r\n")
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        return Response(body, content_type=f"multipart/form-data; boundary={boundary}")


def _json(value: object, status: int = 200) -> Response:
    return Response(json.dumps(value), status=status, content_type="application/json")


def _xml(root: str, **values: str) -> Response:
    inner = "".join(f"<{name}>{escape(value)}</{name}>" for name, value in values.items())
    return Response(f"<{root}>{inner}</{root}>", content_type="application/xml")


def _streams(ran: Ran) -> dict[str, str]:
    return {name: data.decode(errors="replace") for name, data in (("stdout", ran.stdout), ("stderr", ran.stderr))}


def _as_the_one_user(command: str) -> str:
    """A stand-in sandbox has one user, who runs every command: Harbor's `su USER -s SHELL -c COMMAND` (its way to
    run a command as root or as the task's user) becomes `SHELL -c COMMAND`, as `su` finds no user database."""
    try:
        words = shlex.split(command)
    except ValueError:
        return command
    if len(words) == 6 and words[0] == "su" and words[2] == "-s" and words[4] == "-c":
        return shlex.join(words[3:])
    return command


def _inside(root: Path, path: str, workdir: str = "/") -> Path:
    """Where a sandbox path (relative ones from the working folder) lies in the sandbox's folder."""
    resolved = PurePosixPath(workdir) / path
    if ".." in resolved.parts:
        raise _Refused(400, f"path {path!r}: the stand-in takes no '..'")
    return root.joinpath(*resolved.parts[1:])


def _copy(source: Path, target: Path) -> None:
    """A Dockerfile's COPY: a folder's content into the target, a file into it when it is a folder."""
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
        return
    if target.is_dir():
        target = target / source.name
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, target)


@contextmanager
def daytona_stand_in(runner: Runner) -> Iterator[DaytonaStandIn]:
    """The stand-in on a free loopback port for the duration of the block; its sandboxes' folders go with it."""
    with tempfile.TemporaryDirectory(prefix="daytona-stand-in-") as folder:
        Path(folder).chmod(0o711)  # a runner may run commands as another user, who must reach a sandbox's folder
        stand_in = DaytonaStandIn(url="", api_key=secrets.token_hex(16), folder=Path(folder), runner=runner)
        server = make_server("127.0.0.1", 0, stand_in, threaded=True)
        stand_in.url = f"http://127.0.0.1:{server.server_port}"
        # A short poll, as the test waits for it at every shutdown.
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="daytona-stand-in", daemon=True)
        thread.start()
        try:
            yield stand_in
        finally:
            server.shutdown()
            thread.join()
            server.server_close()
