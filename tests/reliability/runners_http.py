"""Runners for HTTP bodies, staged-file and voice paths, archives and tokens."""

from __future__ import annotations

import ast
import hmac
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import httpx

from fuzz._http import parse_responses
from talkies.app import websocket_admission
from talkies.app.app import bearer_ok
from talkies.app.refusals import http_error
from talkies.config import Settings
from talkies.engines.tts.base import SpeechError
from talkies.engines.tts.voices import CUSTOM_VOICES_DIR, reference_voice
from talkies.logs import JsonFormatter
from talkies.transport.asgi import TalkiesASGI
from talkies.transport.http import HttpLimits
from talkies.transport.server import ServerOptions

from ..fake_engine import FakeProvider, speech, write_wav
from ..http_hosts import TOKEN
from ..wire import START
from .clients import (
    FrameReader,
    connect,
    frame,
    http_exchange,
    upgrade,
    wait_eof,
)
from .runners import Facts, Target, runner, server

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIBE = b"/v1/audio/transcriptions"


def _head(method: bytes, target: bytes, *lines: bytes, auth: bool = True) -> bytes:
    head = method + b" " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    if auth:
        head += b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
    return head + b"".join(line + b"\r\n" for line in lines) + b"\r\n"


def _port(target: Target) -> int:
    assert target.host is not None
    return target.host.port


# -- what a case leaves behind ----------------------------------------------------------------


def _tree(*roots: Path) -> dict[str, tuple[int, int]]:
    """Every file and link under ``roots`` (links not followed): size and mtime."""
    out: dict[str, tuple[int, int]] = {}
    for root in roots:
        if not root.exists():
            continue
        for folder, dirs, files in os.walk(root):
            for name in dirs:
                out[str(Path(folder, name))] = (0, 0)  # a folder's time changes with its files
            for name in files:
                path = Path(folder, name)
                st = path.lstat()
                out[str(path)] = (st.st_size, st.st_mtime_ns)
    return out


@contextmanager
def _changes(*roots: Path, expected: frozenset[Path] = frozenset()) -> Iterator[list[str]]:
    """The paths created, changed or removed under ``roots`` during the block, but the
    ``expected`` ones (after it, with up to 2 s for the server to clean up)."""
    before = _tree(*roots)
    found: list[str] = []
    yield found
    deadline = time.monotonic() + 2
    ignored = {str(path) for path in expected}
    while True:
        after = _tree(*roots)
        changed = before.keys() | after.keys()
        diff = sorted(k for k in changed if before.get(k) != after.get(k) and k not in ignored)
        if not diff or time.monotonic() > deadline:
            found.extend(diff)
            return
        time.sleep(0.05)


def _host_dirs(target: Target) -> tuple[Path, ...]:
    assert target.host is not None
    # The server's working folders, made when first needed: their appearing is not a leftover.
    for folder in ("tmp", "files"):
        (target.host.data_dir / folder).mkdir(exist_ok=True)
    return (target.host.data_dir, target.tmp)


# -- multipart bombs and bodies -----------------------------------------------------------------


def _multipart(body: bytes, boundary: bytes = b"B") -> bytes:
    return _head(
        b"POST",
        TRANSCRIBE,
        b"Content-Type: multipart/form-data; boundary=" + boundary,
        b"Content-Length: %d" % len(body),
    )


def _field(name: bytes, value: bytes, *headers: bytes, boundary: bytes = b"B") -> bytes:
    head = b"".join(h + b"\r\n" for h in headers)
    return (
        b"--" + boundary + b"\r\nContent-Disposition: form-data; name=" + name + b"\r\n"
        b"" + head + b"\r\n" + value + b"\r\n"
    )


def _file_part(data: bytes) -> bytes:
    return (
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\n" + data + b"\r\n"
    )


def _form_case(target: Target, body: bytes) -> Facts:
    with _changes(*_host_dirs(target)) as left:
        status, _ = http_exchange(_port(target), _multipart(body) + body)
    return {"status": [status], "left_behind": left}


@runner("multipart-part-count", "both")
def multipart_part_count(target: Target) -> Facts:
    body = _field(b"model", b"energy-test") + _field(b"f", b"x") * 50_000 + b"--B--\r\n"
    return _form_case(target, body)


@runner("multipart-nested", "both")
def multipart_nested(target: Target) -> Facts:
    inner = b""
    for depth in range(1000, 0, -1):  # 1,000 multipart/mixed bodies, each inside the last
        inner = (
            b"--n%d\r\nContent-Type: multipart/mixed; boundary=n%d\r\n\r\n" % (depth, depth + 1)
            + inner
            + b"\r\n--n%d--\r\n" % depth
        )
    body = _field(b"model", b"energy-test") + _file_part(inner) + b"--B--\r\n"
    return _form_case(target, body)


@runner("multipart-part-header", "both")
def multipart_part_header(target: Target) -> Facts:
    body = _field(b"model", b"energy-test", b"X-Pad: " + b"p" * 1_000_000) + b"--B--\r\n"
    return _form_case(target, body)


@runner("multipart-part-headers", "both")
def multipart_part_headers(target: Target) -> Facts:
    headers = [b"X-H%d: v" % i for i in range(10_000)]
    body = _field(b"model", b"energy-test", *headers) + b"--B--\r\n"
    return _form_case(target, body)


@runner("body-endless", "both")
def body_endless(target: Target) -> Facts:
    """A chunked multipart upload whose file part never ends: sent until the server answers."""
    head = _head(
        b"POST",
        TRANSCRIBE,
        b"Content-Type: multipart/form-data; boundary=B",
        b"Transfer-Encoding: chunked",
    )
    start = _field(b"model", b"energy-test") + _file_part(b"")[:-2]
    chunk = b"\0" * 65536
    stop = threading.Event()
    sent = [0]

    def send(sock: Any) -> None:
        with suppress(OSError):
            sock.sendall(head + b"%x\r\n%s\r\n" % (len(start), start))
            while not stop.is_set() and sent[0] < 256 << 20:  # 256 MB: far past any cap
                sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent[0] += len(chunk)

    with _changes(*_host_dirs(target)) as left:
        sock = connect(_port(target))
        thread = threading.Thread(target=send, args=(sock,), daemon=True)
        thread.start()
        sock.settimeout(30)
        response = b""
        with suppress(OSError):
            response = sock.recv(65536)
        stop.set()
        sock.close()
        thread.join(timeout=30)
    status = int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0
    return {"status": [status], "left_behind": left}


@runner("body-stalled", "in-process", "asgi")
def body_stalled(target: Target) -> Facts:
    """PUT /v1/files/... declaring 1,000 bytes, sending 10, then nothing (the body deadline
    shortened to 1 s from its default 60 s)."""
    limits = HttpLimits(body_timeout=1.0)
    if target.row.host == "asgi":
        return _asgi_stalled(target, limits)
    with server(target.tmp, options=ServerOptions(http=limits)) as running:
        # Only the data and files folders may appear (made before the body was read).
        files = target.tmp / "data" / "files"
        with _changes(target.tmp, expected=frozenset({files, files.parent})) as left:
            sock = connect(running.port)
            started = time.monotonic()
            sock.sendall(
                _head(b"PUT", b"/v1/files/stall.wav", b"Content-Length: 1000", auth=False)
                + b"RIFF012345"
            )
            sock.settimeout(10)
            response = sock.recv(65536)
            closed = wait_eof(sock, 10)
            seconds = 99.0 if closed is None else time.monotonic() - started
            sock.close()
    status = int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0
    return {"status": [status], "closed_s": seconds, "left_behind": left}


def _asgi_app(tmp: Path, *, token: str | None = None, **kwargs: Any) -> TalkiesASGI:
    settings = Settings(host="127.0.0.1", port=0, data_dir=tmp / "data", auth_token=token)
    return TalkiesASGI(settings, FakeProvider(), **kwargs)


async def _asgi_call(
    app: TalkiesASGI, scope: dict[str, Any], body: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One ASGI request: ``body`` messages, then a client that sends nothing more."""
    sent: list[dict[str, Any]] = []
    queue = list(body)
    closed = anyio.Event()

    async def receive() -> dict[str, Any]:
        if queue:
            if len(queue) < len(body):
                await anyio.sleep(0.05)  # a client that waits for ready before its audio
            return queue.pop(0)
        # Nothing more from this client; a WebSocket host says it left once the app closed.
        await closed.wait()
        return {"type": "websocket.disconnect", "code": 1000}

    async def send(message: Any) -> None:
        sent.append(dict(message))
        if message["type"] == "websocket.close":
            closed.set()

    with anyio.fail_after(10):
        await app(scope, receive, send)
    return sent


def _scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 5),
    }


def _asgi_stalled(target: Target, limits: HttpLimits) -> Facts:
    app = _asgi_app(target.tmp, http=limits)
    scope = _scope("PUT", "/v1/files/stall.wav", [(b"content-length", b"1000")])
    files = target.tmp / "data" / "files"
    with _changes(target.tmp, expected=frozenset({files, files.parent})) as left:
        sent = anyio.run(
            _asgi_call, app, scope, [{"type": "http.request", "body": b"RIFF01", "more_body": True}]
        )
    statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
    return {"status": statuses, "left_behind": left}


@runner("many-headers-asgi", "asgi")
def many_headers_asgi(target: Target) -> Facts:
    app = _asgi_app(target.tmp)
    headers = [(b"x-h%d" % i, b"v") for i in range(10_000)]
    sent = anyio.run(_asgi_call, app, _scope("GET", "/healthz", headers), [])
    return {"status": [m["status"] for m in sent if m["type"] == "http.response.start"]}


# -- staged files -----------------------------------------------------------------------------

PATH_TRICKS: dict[str, list[bytes]] = {
    "files-dotdot": [b"../x.wav", b"a/../../x.wav", b"..%2fx.wav", b"%2e%2e/x.wav", b".."],
    "files-absolute": [b"/etc/passwd", b"%2fetc%2fpasswd", b"/tmp/x.wav"],
    "files-nul": [b"a%00.wav", b"%00"],
    "files-overlong": [b"a" * 1025, b"b" * 256 + b".wav", b"/".join([b"c" * 205] * 5)],
    "files-backslash": [b"..%5cx.wav", b"a%5c..%5c..%5cx.wav"],
}


def _file_requests(port: int, paths: list[bytes]) -> list[int]:
    statuses = []
    for path in paths:
        target = b"/v1/files/" + path
        for method in (b"PUT", b"GET", b"DELETE"):
            body = b"RIFFdata" if method == b"PUT" else b""
            request = _head(method, target, b"Content-Length: %d" % len(body)) + body
            statuses.append(http_exchange(port, request)[0])
    return statuses


def _path_runner(name: str) -> None:
    def run(target: Target) -> Facts:
        with _changes(*_host_dirs(target)) as left:
            statuses = _file_requests(_port(target), PATH_TRICKS[name])
        return {"status": statuses, "left_behind": left}

    runner(name, "both")(run)


for _name in PATH_TRICKS:
    _path_runner(_name)


@runner("files-symlink-out", "both")
def files_symlink_out(target: Target) -> Facts:
    """Links planted in the files folder, pointing out: a folder and a file."""
    assert target.host is not None
    outside = target.tmp / "outside"
    outside.mkdir()
    (outside / "secret.wav").write_bytes(b"RIFF secret")
    files = target.host.data_dir / "files"
    files.mkdir(exist_ok=True)
    links = [files / "out-dir", files / "out-file"]
    links[0].symlink_to(outside, target_is_directory=True)
    links[1].symlink_to(outside / "secret.wav")
    try:
        with _changes(*_host_dirs(target)) as left:
            port = _port(target)
            statuses = _file_requests(port, [b"out-dir/new.wav", b"out-dir/secret.wav"])
            statuses += _file_requests(port, [b"out-file"])
        # Nothing was listed either.
        with httpx.Client(base_url=target.host.url, headers=target.host.headers) as client:
            listed = [row["id"] for row in client.get("/v1/files").json()["data"]]
        left += [f"listed {name}" for name in listed if name.startswith("out-")]
    finally:
        for link in links:
            link.unlink()
    return {"status": statuses, "left_behind": left}


# -- custom voices (the voices module directly) ----------------------------------------------

VOICE_TRICKS: dict[str, list[str]] = {
    "voice-dotdot": ["../secret", "team/../../secret", "..", "a/./b"],
    "voice-absolute": ["/etc/passwd", "/tmp/secret", "C:secret"],
    "voice-nul": ["anna\0", "\0"],
    "voice-overlong": ["a" * 129, "/".join(["a"] * 9), "b" * 65],
    "voice-backslash": ["..\\secret", "team\\anna"],
    "voice-symlink-out": ["leak", "linked/secret"],
}


def _voice_runner(name: str) -> None:
    def run(target: Target) -> Facts:
        data = target.tmp / "data"
        voices = data / CUSTOM_VOICES_DIR
        outside = target.tmp / "outside"
        voices.mkdir(parents=True)
        outside.mkdir()
        write_wav(voices / "anna.wav", speech(1.0))
        write_wav(outside / "secret.wav", speech(1.0))
        (voices / "leak.wav").symlink_to(outside / "secret.wav")
        (voices / "linked").symlink_to(outside, target_is_directory=True)
        assert reference_voice(data, "anna").audio == (voices / "anna.wav").resolve()
        kinds, statuses = [], []
        for voice in VOICE_TRICKS[name]:
            try:
                found = reference_voice(data, voice)
            except SpeechError as exc:
                kinds.append(exc.kind.value)
                statuses.append(http_error(exc).status)  # what POST /v1/audio/speech answers
            else:
                kinds.append(f"accepted {voice!r} -> {found.audio}")
        return {"refused": kinds, "status": statuses}

    runner(name, "module")(run)


for _name in VOICE_TRICKS:
    _voice_runner(_name)


# -- model archives: tests/test_engine_download.py ----------------------------------------------


@runner("zip-escape", "reference")
def zip_escape(target: Target) -> Facts:
    """The referenced tests exist (they run with the rest of the suite)."""
    named = set(target.row.outcome.removeprefix("see ").split(", "))
    found = set()
    for ref in named:
        file, _, name = ref.partition("::")
        tree = ast.parse((ROOT / file).read_text(encoding="utf-8"))
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        if name in defined:
            found.add(ref)
    return {"see": found}


# -- tokens -----------------------------------------------------------------------------------

WRONG = ["wrong-secret-1", "Wr0ng.Secret_2"]  # tokens that are refused: not to be logged either


def _ws_outcome(port: int, target: bytes, headers: bytes = b"") -> tuple[int, str]:
    sock, response, rest = upgrade(port, target=target, headers=headers)
    assert response.startswith(b"HTTP/1.1 101"), response
    got = FrameReader(sock, rest).pump(timeout=10)
    sock.close()
    return got.outcome()


@runner("token-in-query", "both")
def token_in_query(target: Target) -> Facts:
    port = _port(target)
    url = f"http://127.0.0.1:{port}"
    statuses = []
    for query in ("token", "access_token", "api_key", "key", "bearer", "auth"):
        statuses.append(httpx.get(f"{url}/v1/models?{query}={TOKEN}").status_code)
    statuses.append(httpx.get(f"{url}/v1/models?authorization=Bearer%20{TOKEN}").status_code)
    stream = b"/v1/audio/transcriptions/stream"
    closes = [
        _ws_outcome(port, stream + b"?token=" + TOKEN.encode()),
        _ws_outcome(port, stream + b"?access_token=" + TOKEN.encode()),
    ]
    return {"status": statuses, "close": closes}


@runner("token-in-path", "both")
def token_in_path(target: Target) -> Facts:
    url = f"http://127.0.0.1:{_port(target)}"
    paths = [f"/{TOKEN}/v1/models", f"/v1/models/{TOKEN}", f"/v1/files/{TOKEN}", f"/{TOKEN}"]
    statuses = [httpx.get(url + path).status_code for path in paths]
    # user:password@ in the URL becomes Basic authentication, which is not a bearer token.
    statuses.append(
        httpx.get(f"http://user:{TOKEN}@127.0.0.1:{_port(target)}/v1/models").status_code
    )
    return {"status": statuses}


def _traffic(port: int, token: str) -> None:
    """Requests and streams with the token, and wrong tokens, in every place a client might
    put one (the right place, the query, the path, a subprotocol), and some that fail."""
    url = f"http://127.0.0.1:{port}"
    good = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=30) as client:
        for i in range(20):
            client.get("/v1/models", headers=good)
            client.get("/healthz", headers=good)
            client.get(f"/v1/models?token={token}")
            client.get(f"/nope/{token}", headers=good)
            client.get(f"/v1/files/{token}.wav", headers=good)
            client.put(f"/v1/files/../{token}", headers=good, content=b"x")
            wrong = WRONG[i % 2]
            client.get("/v1/models", headers={"Authorization": f"Bearer {wrong}"})
            client.get(f"/v1/models?access_token={wrong}")
            client.post("/v1/audio/transcriptions", headers=good, content=b"--x")
    stream = b"/v1/audio/transcriptions/stream"
    tok = token.encode()
    for headers in (
        b"Authorization: Bearer " + tok + b"\r\n",
        b"Sec-WebSocket-Protocol: talkies, talkies.bearer." + tok + b"\r\n",
        b"Authorization: Bearer " + WRONG[0].encode() + b"\r\n",
        b"Sec-WebSocket-Protocol: talkies, talkies.bearer." + WRONG[1].encode() + b"\r\n",
    ):
        for start in (True, False):
            sock, _, rest = upgrade(port, headers=headers)
            if start:
                sock.sendall(frame(1, json.dumps(START).encode()))
                sock.sendall(frame(2, speech(0.5)[:4000]) + frame(1, b'{"type":"end"}'))
            else:
                sock.sendall(frame(1, b"\xff"))  # an error path
            FrameReader(sock, rest).pump(timeout=10)
            sock.close()
    sock, _, rest = upgrade(port, target=stream + b"?token=" + tok)
    FrameReader(sock, rest).pump(timeout=10)
    sock.close()


def _leaks(text: str, token: str) -> list[str]:
    return [secret for secret in (token, *WRONG) if secret in text]


@runner("token-in-metrics", "both")
def token_in_metrics(target: Target) -> Facts:
    assert target.host is not None
    _traffic(target.host.port, TOKEN)
    with target.host.client() as client:
        metrics = client.get("/metrics")
    assert metrics.status_code == 200 and "talkies_streams" in metrics.text
    return {"leaked": _leaks(metrics.text, TOKEN)}


_CLIENT_LOGGERS = ("httpx", "httpcore", "websockets.client")


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        # The test's own clients log their requests here too (one process): not the server's.
        if not record.name.startswith(_CLIENT_LOGGERS):
            self.lines.append(self.format(record))


@contextmanager
def _all_logs() -> Iterator[_Capture]:
    """Every log record of the process at DEBUG, formatted as the server writes them."""
    capture = _Capture()
    root = logging.getLogger()
    levels = {name: logging.getLogger(name).level for name in ("", "talkies", "uvicorn")}
    root.addHandler(capture)
    for name in levels:
        logging.getLogger(name).setLevel(logging.DEBUG)
    try:
        yield capture
    finally:
        root.removeHandler(capture)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@runner("token-in-logs", "in-process", "asgi")
def token_in_logs(target: Target) -> Facts:
    token = "log-probe-T0ken.value_1"
    if target.row.host == "asgi":
        with _all_logs() as capture:
            anyio.run(_asgi_traffic, _asgi_app(target.tmp, token=token), token)
    else:
        with (
            _all_logs() as capture,
            server(target.tmp, auth_token=token, stream_max_connections=2) as running,
        ):
            _traffic(running.port, token)
            running.wait_idle()
    # The traffic was logged (one line per stream at least), and looked at.
    assert len(capture.lines) >= 6, capture.lines
    return {"leaked": [line for line in capture.lines if _leaks(line, token)]}


async def _asgi_traffic(app: TalkiesASGI, token: str) -> None:
    """HTTP requests through httpx's ASGI transport, and streams through the ASGI interface
    with the token in a header and in a subprotocol."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://x") as client:
        for wrong in WRONG:
            await client.get("/v1/models", headers={"Authorization": f"Bearer {token}"})
            await client.get(f"/v1/models?token={token}")
            await client.get(f"/x/{token}", headers={"Authorization": f"Bearer {wrong}"})
    for headers, protocols in (
        ([(b"authorization", b"Bearer " + token.encode())], []),
        ([], ["talkies", f"talkies.bearer.{token}"]),
        ([(b"authorization", b"Bearer " + WRONG[0].encode())], []),
    ):
        scope = {
            "type": "websocket",
            "path": "/v1/audio/transcriptions/stream",
            "raw_path": b"/v1/audio/transcriptions/stream",
            "query_string": b"token=" + token.encode(),
            "headers": headers,
            "subprotocols": protocols,
            "client": ("127.0.0.1", 5),
        }
        good = [
            {"type": "websocket.receive", "text": json.dumps(START)},
            {"type": "websocket.receive", "bytes": speech(0.25)},
            {"type": "websocket.receive", "text": '{"type":"end"}'},
        ]
        bad = [{"type": "websocket.receive", "text": "not json"}]  # an error path
        for script in (good, bad):
            await _asgi_call(app, scope, [{"type": "websocket.connect"}, *script])


@runner("token-compare", "module")
def token_compare(target: Target) -> Facts:
    ways = _static_comparisons()
    ways |= _runtime_comparisons()
    return {"comparisons": ways}


# A name that holds a secret (``token``, ``auth_token``, ``credentials``, ``candidate``), as
# opposed to, say, ``_tokens`` (the comma-separated tokens of an HTTP header).
_SECRET_NAME = re.compile(r"(?:^|_)(?:token|credentials?|candidate|secret|bearer)$")


def _names(node: ast.AST) -> set[str]:
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id.lower())
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr.lower())
    return {name for name in out if _SECRET_NAME.search(name)}


def _static_comparisons() -> set[str]:
    """How the request path compares anything named like a secret: ``==``-style comparisons
    (other than ``is None``) are reported by file and line."""
    ways = set()
    for folder in ("app", "transport"):
        for path in sorted((ROOT / "talkies" / folder).glob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                    if node.func.attr == "compare_digest":
                        ways.add("compare_digest")
                    elif node.func.attr in ("startswith", "endswith", "find", "index") and _names(
                        node.func.value
                    ):
                        ways.add(f"{path.name}:{node.lineno} {node.func.attr}")
                if not isinstance(node, ast.Compare):
                    continue
                operands = [node.left, *node.comparators]
                if all(isinstance(op, ast.Is | ast.IsNot) for op in node.ops) and any(
                    isinstance(o, ast.Constant) and o.value is None for o in operands
                ):
                    continue
                if any(_names(o) for o in operands):
                    ways.add(f"{path.name}:{node.lineno} {type(node.ops[0]).__name__}")
    return ways


class _Poisoned(bytes):
    """The configured token as bytes: any comparison but hmac.compare_digest raises."""

    def _refuse(self, *args: object) -> bool:
        raise AssertionError("the token was compared with an ordinary operator")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = _refuse  # type: ignore[assignment]
    startswith = endswith = find = index = _refuse  # type: ignore[assignment]
    __hash__ = bytes.__hash__


class _PoisonedToken(str):
    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        return _Poisoned(str.encode(self, *args, **kwargs))

    def _refuse(self, *args: object) -> bool:
        raise AssertionError("the token was compared with an ordinary operator")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __contains__ = _refuse  # type: ignore[assignment]
    startswith = endswith = find = index = _refuse  # type: ignore[assignment]
    __hash__ = str.__hash__


def _runtime_comparisons() -> set[str]:
    """Every admission decision (header and subprotocol, right and wrong tokens) made with
    a token that refuses ordinary comparison, recording each hmac.compare_digest call."""
    real = hmac.compare_digest
    calls: list[tuple[bytes, bytes]] = []

    def recording(a: Any, b: Any) -> bool:
        calls.append((bytes(a), bytes(b)))
        return real(bytes(a), bytes(b))

    token = _PoisonedToken("s3cret-token")
    cases: list[tuple[list[tuple[bytes, bytes]], list[str], bool]] = [
        ([(b"authorization", b"Bearer s3cret-token")], [], True),
        ([(b"Authorization", b"bearer s3cret-token")], [], True),
        ([(b"authorization", b"Bearer s3cret-tokem")], [], False),
        ([(b"authorization", b"Bearer s")], [], False),
        ([(b"authorization", b"Bearer " + b"s" * 1000)], [], False),
        ([], ["talkies", "talkies.bearer.s3cret-token"], True),
        ([], ["talkies", "talkies.bearer.wrong"], False),
        ([], ["talkies", "talkies.bearer."], False),
        ([(b"authorization", b"Bearer wrong")], ["talkies", "talkies.bearer.s3cret-token"], False),
    ]
    ways = set()
    hmac.compare_digest = recording
    try:
        for headers, protocols, expected in cases:
            calls.clear()
            if protocols:
                allowed, _ = websocket_admission(headers, protocols, token)
            else:
                allowed = bearer_ok(headers, token)
            assert allowed is expected, (headers, protocols)
            assert len(calls) == 1 and calls[0][1] == b"s3cret-token", calls
            ways.add("compare_digest")
    finally:
        hmac.compare_digest = real
    return ways


# -- framing and bodies a parser must survive (issue 21, points 6 and 7) ---------------------

SPEECH = b"/v1/audio/speech"


def _exchange_all(port: int, request: bytes, timeout: float = 15.0) -> tuple[list[Any], float]:
    """Send ``request`` (one write), read until the server closes: its responses, and the
    seconds until it closed (99 if it did not within ``timeout``)."""
    sock = connect(port)
    started = time.monotonic()
    sock.sendall(request)
    sock.settimeout(timeout)
    data = b""
    closed = 99.0
    with suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
        closed = time.monotonic() - started
    sock.close()
    return parse_responses(data, []), closed


def _openai_error(response: Any, param: str | None = None) -> dict[str, Any]:
    """The response's OpenAI error object (the runner fails if it is not one)."""
    document = json.loads(response.body)
    error = document["error"]
    assert set(document) == {"error"} and set(error) == {"message", "type", "param", "code"}, (
        response.body
    )
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return dict(error)


def _speech_request(body: bytes, *lines: bytes) -> bytes:
    return _head(b"POST", SPEECH, b"Content-Type: application/json", *lines) + body


@runner("http-length-and-chunked", "both")
def http_length_and_chunked(target: Target) -> Facts:
    """RFC 9112 section 6.1: both framings at once, then a request pipelined behind them."""
    head = _head(b"POST", SPEECH, b"Content-Length: 4", b"Transfer-Encoding: chunked").replace(
        b"Connection: close\r\n", b""
    )
    pipelined = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    responses, closed = _exchange_all(_port(target), head + b"2\r\n{}\r\n0\r\n\r\n" + pipelined)
    for response in responses:
        if response.status == 400:
            _openai_error(response)
    return {"status": [r.status for r in responses], "closed_s": closed}


@runner("http-framed-twice-large-head", "both")
def http_framed_twice_large_head(target: Target) -> Facts:
    """Both framings and 120 headers (over the limit of 100), in one write: the smuggling
    attempt is what is refused (400), whatever else is wrong with the head. (A head over the
    byte limit cannot show this reliably: arriving in two reads, h11 refuses it as too large
    before either host can see its framing.)"""
    pads = [b"X-Pad-%d: a" % i for i in range(120)]
    head = _head(b"POST", SPEECH, b"Content-Length: 4", b"Transfer-Encoding: chunked", *pads)
    responses, closed = _exchange_all(_port(target), head + b"2\r\n{}\r\n0\r\n\r\n")
    for response in responses:
        _openai_error(response)
    return {"status": [r.status for r in responses], "closed_s": closed}


def _speech_case(target: Target, body: bytes, param: str | None) -> Facts:
    responses, _ = _exchange_all(
        _port(target), _speech_request(body, b"Content-Length: %d" % len(body))
    )
    for response in responses:
        _openai_error(response, param)
    return {"status": [r.status for r in responses]}


@runner("speech-nested-json", "both")
def speech_nested_json(target: Target) -> Facts:
    return _speech_case(target, b"[" * 60_000, None)


@runner("speech-speed-digits", "both")
def speech_speed_digits(target: Target) -> Facts:
    body = b'{"model":"qwen3-tiny-random","input":"hi","voice":"ryan","speed":'
    return _speech_case(target, body + b"9" * 4000 + b"}", "speed")


@runner("speech-checked-before-load", "both")
def speech_checked_before_load(target: Target) -> Facts:
    """An empty input for a model whose weights are not there: the input's 400, and the model
    was never loaded."""
    assert target.host is not None
    body = json.dumps({"model": "qwen3-tts-0.6b", "input": "", "voice": "ryan"}).encode()
    facts = _speech_case(target, body, "input")
    row = target.host.models()["qwen3-tts-0.6b"]
    assert row["loaded"] is False and row["downloaded"] is False, row
    return facts


def _chunked_case(target: Target, chunks: bytes) -> Facts:
    request = _speech_request(chunks, b"Transfer-Encoding: chunked")
    responses, closed = _exchange_all(_port(target), request)
    for response in responses:  # uvicorn's own answer too (talkies.transport.uvicorn_h11)
        _openai_error(response)
    return {"status": [r.status for r in responses], "closed_s": closed}


@runner("chunk-size-not-hex", "standalone", "uvicorn")
def chunk_size_not_hex(target: Target) -> Facts:
    return _chunked_case(target, b"zz\r\n{}\r\n0\r\n\r\n")


@runner("chunk-shorter-than-declared", "standalone", "uvicorn")
def chunk_shorter_than_declared(target: Target) -> Facts:
    return _chunked_case(target, b"5\r\n{}\r\n0\r\n\r\n")


@runner("transfer-coding-unknown", "standalone", "uvicorn")
def transfer_coding_unknown(target: Target) -> Facts:
    request = _speech_request(b"{}", b"Transfer-Encoding: gzip")
    responses, closed = _exchange_all(_port(target), request)
    for response in responses:
        _openai_error(response)
    return {"status": [r.status for r in responses], "closed_s": closed}
