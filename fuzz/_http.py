"""The HTTP harness's oracle: raw request bytes through the standalone server's HTTP code.

One input is what a client sends on one connection. It goes through what ``talkies serve``
runs for an accepted connection (:meth:`Server.serve_connection`): h11's parser and the
keep-alive loop, the shared head and framing checks (431, 400), the body reader with its cap
and deadline, then the app layer (``TalkiesApp.handle``): auth, routing, the upload cap, JSON
and form parsing, staged-file paths, speech and transcription checks, MCP, the model list. A
WebSocket upgrade gets its 101 and the stream route (no model here streams: what a stream does
with its frames is the wire harness's). Only the ends are replaced, in memory:

- the socket, by :class:`MemoryConnection` (no sockets, no threads): the client's bytes, cut
  into reads as byte 0 says; once they are all read, the client leaves (EOF) as soon as the
  server has nothing left to do (every task waiting, no worker thread busy), so a response the
  server is working on is never cut short by the input's end;
- the speech model, by :class:`FuzzPool`'s ``speech-fuzz`` (instant, streamed from a real
  synthesis thread), and ffmpeg's encoding of its speech by :func:`encode_wav` (WAV under the
  format's name): a subprocess per input would make the harness a hundred times slower.

The one ASR model, ``asr-fuzz``, is of an executor with no runtime here (``canary_multitask``):
a transcription is read and checked up to its model (the form, the fields) and refused there
with a 400, before any audio is decoded; what ffmpeg does with hostile files is
tests/test_audio.py's.

One server, one data folder and one event loop serve every input of a process; the staged
files an input made are removed after it.

The oracle (:func:`check_http_input`) -- "never a 500, never a traceback, never a hang":

- the connection is served within :data:`HANG_SECONDS` and closed, and nothing is logged at
  ERROR or with a traceback (the server logs whatever escapes a connection);
- what the server wrote parses as HTTP/1.1 responses; none is a 5xx (but ``/readyz``'s 503:
  no model here streams, so the server is never ready); every 4xx is OpenAI's error object
  (but HEAD's, and ``/mcp``'s from the MCP SDK, in MCP's own shapes);
- every request the server could read whole is answered, unless the server closed the
  connection after an earlier answer (``connection: close``, or a 101); no answer is to a
  request that was not sent; an answer to a head that does not parse is a 4xx and closes, one
  to a request with both ``Content-Length`` and ``Transfer-Encoding`` a 400 that closes;
- afterwards no model slot is held and no temporary upload is left in the data folder.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import io
import json
import logging
import os
import shutil
import tempfile
import threading
import wave
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
import anyio.to_thread
import h11

from talkies import audio
from talkies.config import Settings
from talkies.engines.base import (
    Refusal,
)
from talkies.engines.pool import AnyModel, ModelPool
from talkies.engines.supply.registry import ModelEntry
from talkies.engines.tts.base import (
    Emitter,
    SpeechRequest,
    SpeechStream,
    check_request,
    start_synthesis,
)
from talkies.protocol import ErrorCode
from talkies.protocol.audit import InvariantViolation
from talkies.transport.http import HttpLimits
from talkies.transport.server import Server, ServerOptions

__all__ = [
    "CHUNK_SIZES",
    "HANG_SECONDS",
    "TOKEN",
    "HttpInput",
    "HttpReport",
    "Response",
    "check_http_input",
    "decode_http_input",
    "encode_http_input",
    "parse_responses",
]

TOKEN = "fuzz-token"
SPEECH = "speech-fuzz"
ASR = "asr-fuzz"
HANG_SECONDS = 10.0
# Small limits, so that every limit is reachable by an input of run.sh's -max_len (12,288).
LIMITS = HttpLimits(max_head_bytes=2048, max_headers=24, read_size=4096)
UPLOAD_CAP = 4096
# Byte 0 of an input: bits 0-2 pick how the client's bytes are cut into socket reads.
CHUNK_SIZES = (0, 1, 2, 7, 64, 509, 4096, 3)
_MAX_READS = 64  # past this many reads the rest arrives at once (each read costs a loop turn)


@dataclass(frozen=True, slots=True)
class HttpInput:
    chunks: tuple[bytes, ...]  # the client's bytes, one item per socket read

    @property
    def data(self) -> bytes:
        return b"".join(self.chunks)


def decode_http_input(data: bytes) -> HttpInput:
    size = CHUNK_SIZES[(data[0] if data else 0) & 7]
    body = data[1:]
    if size == 0:
        return HttpInput(chunks=(body,) if body else ())
    cut = min(len(body), size * _MAX_READS)
    chunks = [body[i : i + size] for i in range(0, cut, size)]
    if cut < len(body):
        chunks.append(body[cut:])
    return HttpInput(chunks=tuple(chunks))


def encode_http_input(client: bytes, *, chunk_size: int = 0) -> bytes:
    """The fuzz input that sends ``client`` in reads of ``chunk_size`` (0: at once)."""
    return bytes([CHUNK_SIZES.index(chunk_size)]) + client


# -- the socket --------------------------------------------------------------------------------


class MemoryConnection(anyio.abc.ByteStream):
    """The client's end: reads come from the input's chunks; once they are used up, EOF as
    soon as the server is idle. Writes are kept."""

    def __init__(self, chunks: tuple[bytes, ...]) -> None:
        self._chunks = list(chunks)
        self._pending = b""
        self.sent = bytearray()
        self.closed = False
        self.eof_sent = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        await anyio.lowlevel.checkpoint()  # a read is a suspension point, as on a socket
        if self.closed:
            raise anyio.ClosedResourceError
        while not self._pending and self._chunks:
            self._pending = self._chunks.pop(0)
        if not self._pending:
            if not self.eof_sent:
                await _until_idle()
                self.eof_sent = True
            if self.closed:
                raise anyio.ClosedResourceError
            raise anyio.EndOfStream
        data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return data

    async def send(self, item: bytes) -> None:
        if self.closed:
            raise anyio.BrokenResourceError
        self.sent += item

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        self.closed = True


def _threads_busy() -> bool:
    """A worker thread is working for the server: an anyio worker call, a model load, a
    synthesis (talkies names its own threads ``talkies-*``)."""
    if anyio.to_thread.current_default_thread_limiter().borrowed_tokens:
        return True
    return any(t.name.startswith("talkies-") for t in threading.enumerate())


async def _until_idle() -> None:
    """Return once no worker thread is busy, no callback is due and every other task waits
    (a task that a thread or a callback is about to wake is not waiting)."""
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    while True:
        if _threads_busy():
            await anyio.sleep(0.0005)
            continue
        if not loop._ready and all(  # type: ignore[attr-defined]
            (waiter := getattr(task, "_fut_waiter", None)) is not None and not waiter.done()
            for task in asyncio.all_tasks(loop)
            if task is not me
        ):
            return
        await anyio.lowlevel.checkpoint()


# -- the models and ffmpeg ---------------------------------------------------------------------


class FuzzSpeech:
    """A speech model: two voices, speeds 0.5 to 2, 1 ms of silence per character of input,
    streamed in chunks of 10 ms from a real synthesis thread (``start_synthesis``)."""

    sample_rate = 24000
    streaming = True

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def voices(self) -> list[str]:
        return ["alloy", "nova"]

    def validate(self, request: SpeechRequest) -> None:
        check_request(request, speed_range=(0.5, 2.0), voices=self.voices())

    async def synthesize(self, request: SpeechRequest, *, chunk_steps: int = 8) -> SpeechStream:
        self.validate(request)
        samples = 24 * len(request.text)

        def job(emitter: Emitter) -> None:
            for start in range(0, samples, 240):
                emitter.step()
                emitter.emit(bytes(2 * min(240, samples - start)))

        return start_synthesis(job, lock=self._lock, max_chunks=4, name=SPEECH)

    def close(self) -> None:
        pass


class FuzzPool(ModelPool):
    """The pool over the two fuzz models; ``speech-fuzz`` is handed out here, on one slot
    (the pool's pipeline loads speech models only through their engines)."""

    def __init__(self, data_dir: Path, settings: Settings) -> None:
        entries = {}
        for slug, executor in ((SPEECH, "kokoro"), (ASR, "canary_multitask")):
            (data_dir / slug).mkdir(parents=True, exist_ok=True)
            entries[slug] = ModelEntry(
                slug=slug, executor=executor, path=data_dir / slug, max_concurrency=1
            )
        super().__init__(entries, settings, validate=False)
        self.speech = FuzzSpeech()
        self.speech_in_use = 0

    def peek(self, slug: str) -> AnyModel | None:
        return self.speech if slug == SPEECH else super().peek(slug)

    async def acquire(self, slug: str) -> tuple[AnyModel, Callable[[], None]]:
        if slug != SPEECH:
            return await super().acquire(slug)
        await anyio.lowlevel.checkpoint()
        if self.speech_in_use:
            raise Refusal(ErrorCode.CONNECTION_LIMIT, f"model {slug!r} is at its limit")
        self.speech_in_use += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.speech_in_use -= 1

        return self.speech, release


_ENCODE = audio.encode  # the library's own, whatever replaced it later


async def encode_wav(pcm: bytes, sample_rate: int, fmt: str) -> tuple[bytes, str]:
    """ffmpeg's encode: PCM and WAV as the library writes them (in process), every other
    format as WAV under that format's content type."""
    if fmt in ("pcm", "wav") or fmt not in audio.SPEECH_FORMATS:
        return await _ENCODE(pcm, sample_rate, fmt)
    data, _ = await _ENCODE(pcm, sample_rate, "wav")
    return data, audio.SPEECH_FORMATS[fmt][0]


# -- the server's output -----------------------------------------------------------------------


@dataclass(slots=True)
class Response:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def header(self, name: bytes) -> bytes | None:
        values = [v for k, v in self.headers if k == name]
        return b", ".join(values) if values else None

    @property
    def closes(self) -> bool:
        value = self.header(b"connection") or b""
        return b"close" in {t.strip().lower() for t in value.split(b",")}


@dataclass(slots=True)
class _Sent:
    """A request as the server's parser reads it (offline, from the same bytes)."""

    method: bytes
    target: bytes
    complete: bool  # its head and body arrived whole (or its head failed to parse)
    malformed: bool = False
    framed_twice: bool = False  # both Content-Length and Transfer-Encoding (RFC 9112 6.1)
    oversized: bool = False  # a head over LIMITS.max_head_bytes


@dataclass
class HttpReport:
    requests: list[_Sent] = field(default_factory=list)
    responses: list[Response] = field(default_factory=list)
    logged: list[str] = field(default_factory=list)


def _requests(data: bytes) -> list[_Sent]:
    """The requests in ``data`` as h11 reads them with the server's limits, each answered at
    once with an empty 400 so that the next can be read (as the server answers them)."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=LIMITS.max_head_bytes)
    conn.receive_data(data)
    conn.receive_data(b"")
    out: list[_Sent] = []
    current: _Sent | None = None
    while True:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError:
            if current is None:
                # A head that does not parse is answered; one cut short by the client's EOF
                # cannot be (h11 has no request to answer: its state stays IDLE).
                answerable = conn.our_state is h11.SEND_RESPONSE
                out.append(_Sent(b"", b"", complete=answerable, malformed=True))
            return out
        if isinstance(event, h11.Request):
            names = {name for name, _ in event.headers}
            twice = {b"content-length", b"transfer-encoding"} <= names
            size = len(event.method) + len(event.target) + 12
            size += sum(len(k) + len(v) + 4 for k, v in event.headers)
            current = _Sent(
                bytes(event.method),
                bytes(event.target),
                False,
                framed_twice=twice,
                oversized=size > LIMITS.max_head_bytes,
            )
            out.append(current)
        elif isinstance(event, h11.EndOfMessage):
            assert current is not None
            current.complete = True
            current = None
            try:
                # Not a 2xx: that would switch protocols after a CONNECT.
                conn.send(h11.Response(status_code=400, headers=[(b"content-length", b"0")]))
                conn.send(h11.EndOfMessage())
            except h11.LocalProtocolError:
                return out
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return out
            conn.start_next_cycle()
        elif (
            event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed)
        ):
            return out


def _chunked(data: bytes, at: int) -> tuple[bytes, int]:
    body = b""
    while True:
        end = data.index(b"\r\n", at)
        size = int(data[at:end].split(b";")[0], 16)
        at = end + 2
        if size == 0:
            end = data.index(b"\r\n\r\n", at - 2)  # no trailers are ever sent
            return body, end + 4
        body += data[at : at + size]
        if data[at + size : at + size + 2] != b"\r\n":
            raise ValueError("a chunk is not followed by CRLF")
        at += size + 2


def parse_responses(data: bytes, methods: list[bytes]) -> list[Response]:
    """The final responses in what the server wrote (``methods``: each one's request method,
    for HEAD); stops after a 101 (what follows is WebSocket). Raises InvariantViolation if
    the bytes are not HTTP/1.1 responses."""
    out: list[Response] = []
    at = 0
    try:
        while at < len(data):
            end = data.index(b"\r\n\r\n", at)
            lines = data[at:end].split(b"\r\n")
            version, status_text, _ = (lines[0] + b" ").split(b" ", 2)
            status = int(status_text)
            if version != b"HTTP/1.1" or not 100 <= status <= 599:
                raise ValueError(f"status line {lines[0]!r}")
            headers = []
            for line in lines[1:]:
                name, sep, value = line.partition(b":")
                if not sep:
                    raise ValueError(f"header line {line!r}")
                headers.append((name.strip().lower(), value.strip()))
            at = end + 4
            response = Response(status, headers, b"")
            if 100 <= status < 200:
                if status == 101:
                    out.append(response)
                    return out
                continue
            method = methods[len(out)] if len(out) < len(methods) else b"GET"
            length = response.header(b"content-length")
            closing = (response.header(b"connection") or b"").lower() == b"close"
            if (
                method == b"HEAD"
                and closing
                and length is not None
                and len(data) - at == int(length)
            ):
                # A refusal of a head the server could not read (431): it cannot know the
                # request was a HEAD, so its last answer carries a body, and the connection ends.
                response.body, at = data[at:], len(data)
            elif method == b"HEAD" or status in (204, 304):
                pass
            elif b"chunked" in (response.header(b"transfer-encoding") or b"").lower():
                response.body, at = _chunked(data, at)
            elif length is not None:
                size = int(length)
                if at + size > len(data):
                    raise ValueError("a body shorter than its Content-Length")
                response.body, at = data[at : at + size], at + size
            else:
                response.body, at = data[at:], len(data)
            out.append(response)
    except ValueError as exc:
        raise InvariantViolation(f"the server's output does not parse: {exc}") from None
    return out


def _check_error_shape(response: Response, sent: _Sent | None) -> None:
    if sent is not None and sent.method == b"HEAD":
        return
    if sent is not None and sent.target.split(b"?")[0] == b"/mcp":
        # Past the app's own checks (401, 405, 413: OpenAI's shape), the MCP SDK answers for
        # its transport, in its own shapes (a JSON-RPC error, or text such as "Invalid
        # Content-Type header"): what MCP clients expect.
        return
    try:
        document = json.loads(response.body)
    except ValueError:
        document = None
    error = document.get("error") if isinstance(document, dict) else None
    if (
        not isinstance(document, dict)
        or set(document) != {"error"}
        or not isinstance(error, dict)
        or set(error) != {"message", "type", "param", "code"}
        or not isinstance(error["message"], str)
        or not isinstance(error["type"], str)
    ):
        raise InvariantViolation(
            f"a {response.status} that is not OpenAI's error object: {response.body!r:.300}"
        )


def _check_responses(report: HttpReport) -> None:
    requests, responses = report.requests, report.responses
    if len(responses) > len(requests):
        raise InvariantViolation(
            f"{len(responses)} responses to {len(requests)} requests: "
            f"{[r.status for r in responses]}"
        )
    for sent, response in zip(requests, responses, strict=False):
        if response.status == 503 and sent.target.split(b"?")[0] == b"/readyz":
            continue  # readiness: no streaming model here, so never ready (by design)
        if response.status >= 500:
            raise InvariantViolation(
                f"{response.status} for {sent.method!r} {sent.target!r:.200}: "
                f"{response.body!r:.300}"
            )
        if response.status >= 400:
            _check_error_shape(response, sent)
        if sent.malformed and (response.status < 400 or not response.closes):
            raise InvariantViolation(f"a malformed head answered {response.status}, kept open")
        # Framed twice is refused as such (400), before the head's size and count; but a
        # head over the size limit that arrives in more than one read is refused (431) by
        # h11 before the server can see how it is framed. Either way it is refused and closed.
        framed_refusals = {400, 431} if sent.oversized else {400}
        if sent.framed_twice and (response.status not in framed_refusals or not response.closes):
            raise InvariantViolation(
                f"a request framed twice answered {response.status}, closes={response.closes}"
            )
    for index, sent in enumerate(requests[len(responses) :], start=len(responses)):
        if responses and (responses[-1].closes or responses[-1].status == 101):
            return  # the server closed the connection after its last answer
        if not sent.complete:
            return  # the client left in the middle of this request
        raise InvariantViolation(
            f"request {index + 1} ({sent.method!r} {sent.target!r:.200}) got no response "
            f"(answered: {[r.status for r in responses]})"
        )


# -- the server ------------------------------------------------------------------------------


class _Logged(logging.Handler):
    """Every record at ERROR or above, or with a traceback, of any logger that propagates."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR or record.exc_info:
            self.records.append(f"{record.name}: {record.getMessage()}")
            if record.exc_info and record.exc_info[1] is not None:
                exc = record.exc_info[1]
                self.records.append(f"  {type(exc).__name__}: {exc}"[:500])


@dataclass
class _Harness:
    loop: asyncio.AbstractEventLoop
    server: Server
    pool: FuzzPool
    data_dir: Path
    lifespan: asyncio.Task[None]


def _data_dir() -> Path:
    """A data folder for this process, in memory where there is a tmpfs (staged files are
    written and removed all the time). libFuzzer ends a process without Python's exit
    handlers, so the folders of processes that are gone are removed here, at the next start."""
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    for old in parent.glob("talkies-fuzz-http-*-*"):
        pid = old.name.split("-")[3]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    folder = Path(tempfile.mkdtemp(prefix=f"talkies-fuzz-http-{os.getpid()}-", dir=parent))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.cache
def _harness() -> _Harness:
    """One server, data folder and event loop for every input of the process."""
    data_dir = _data_dir()
    settings = Settings(
        host="127.0.0.1",
        port=0,
        data_dir=data_dir,
        auth_token=TOKEN,
        max_upload_bytes=UPLOAD_CAP,
        stream_max_connections=1,
        stream_max_duration=60.0,
    )
    pool = FuzzPool(data_dir, settings)
    server = Server(settings, pool, options=ServerOptions(http=LIMITS, close_timeout=0.0))
    loop = asyncio.new_event_loop()
    ready = asyncio.Event()

    async def lifespan() -> None:
        # The app's lifespan (the MCP manager, the idle-model sweeper), for the whole run.
        async with server.app.lifespan():
            ready.set()
            await anyio.sleep_forever()

    task = loop.create_task(lifespan())
    with _watched():
        loop.run_until_complete(ready.wait())
    return _Harness(loop, server, pool, data_dir, task)


# Loggers whose records the oracle must see, whatever a caller set (fuzz/_wire.py silences
# talkies.transport, for one): each is held at WARNING at most while an input runs.
_WATCHED = ("", "talkies", "mcp", "asyncio", "h11", "anyio", "python_multipart")


@contextlib.contextmanager
def _watched() -> Iterator[_Logged]:
    """While an input runs: ffmpeg's encoding replaced (the module docstring says why), and
    every record at WARNING or above of the server's loggers seen; both as they were after,
    so that a test process that runs the harness is left as it was."""
    names = [n for n in logging.root.manager.loggerDict if n.startswith(_WATCHED[1:])]
    loggers = [logging.getLogger(name) for name in (*_WATCHED, *names)]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        if logger.level > logging.WARNING:
            logger.setLevel(logging.WARNING)
    handler = _Logged()
    logging.root.addHandler(handler)
    encode = audio.encode
    audio.encode = encode_wav  # type: ignore[assignment]
    try:
        yield handler
    finally:
        audio.encode = encode  # type: ignore[assignment]
        logging.root.removeHandler(handler)
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


async def _serve(harness: _Harness, connection: MemoryConnection) -> None:
    with anyio.move_on_after(HANG_SECONDS) as scope:
        await harness.server.serve_connection(connection)
    if scope.cancelled_caught:
        raise InvariantViolation(f"the connection was not served within {HANG_SECONDS} s")


def _tidy(data_dir: Path) -> list[str]:
    """Remove the staged files an input made; return the temporary files it left."""
    files = data_dir / "files"
    if files.exists() and any(files.iterdir()):
        shutil.rmtree(files)
    tmp = data_dir / "tmp"
    return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []


def check_http_input(data: bytes) -> HttpReport:
    """Run one input through the server's HTTP code and check it; raises on a finding."""
    harness = _harness()
    decoded = decode_http_input(data)
    connection = MemoryConnection(decoded.chunks)
    with _watched() as logged:
        harness.loop.run_until_complete(_serve(harness, connection))
    report = HttpReport(logged=logged.records)
    left = _tidy(harness.data_dir)
    if report.logged:
        raise InvariantViolation("logged: " + " | ".join(report.logged)[:2000])
    if not connection.closed:
        raise InvariantViolation("the connection was not closed")
    if harness.server.connections:
        raise InvariantViolation(f"{harness.server.connections} connections still counted")
    if harness.pool.speech_in_use:
        raise InvariantViolation("a model slot was not given back")
    if left:
        raise InvariantViolation(f"temporary files left behind: {left}")
    report.requests = _requests(decoded.data)
    report.responses = parse_responses(
        bytes(connection.sent), [sent.method for sent in report.requests]
    )
    _check_responses(report)
    return report


def wav(pcm: bytes) -> bytes:
    """``pcm`` (16 kHz mono PCM16) as a WAV file's bytes, for seeds and tests."""
    out = io.BytesIO()
    with wave.open(out, "wb") as writer:
        writer.setnchannels(1)
        writer.setsampwidth(2)
        writer.setframerate(16000)
        writer.writeframes(pcm)
    return out.getvalue()
