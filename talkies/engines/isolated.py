"""Native speech engines in a process of their own, so that a crash in one never ends the server.

Vosk, sherpa-onnx, whisper.cpp and parakeet.cpp are native libraries, and so are torch and
onnxruntime under the speech models (Qwen3-TTS, Kokoro): a bad model, a bug or an
out-of-memory in them can end the process that called them (a segmentation fault, an
``abort()``, sherpa's ``exit(255)``), with no exception and no cleanup. With
``TALKIES_ENGINE_ISOLATION=process`` (the default) the pool loads each such model in a child
process (``python -m talkies.engines.isolated``) and talks to it over local sockets; the server
keeps only a proxy (:class:`IsolatedModel`, or :class:`IsolatedSpeechModel` for a speech model,
whose synthesis streams its chunks over a connection of its own).

- **Same runtime.** The proxy is a :class:`~talkies.engines.base.RecognitionModel` like the
  others: the server's decode rounds (:mod:`talkies.engines.runner`) with their byte-bounded
  queues, batching, deadline and slots drive it unchanged. A round thread's ``accept``,
  ``finish`` or ``decode_many`` becomes one request on that thread's own connection to the
  child, where a thread of its own makes the real call (native decoders release the GIL, so
  rounds in parallel stay parallel). A file transcription is one request; the client leaving
  sends a cancel on a second connection.
- **A crash.** If the child ends, every call in flight and every later one on that model
  raises :class:`EngineCrashed`: the runtime fails those streams with 4500 ``server_error``
  (their slots are freed as for any engine failure) and a file transcription answers 500.
  The server, its other models and its other connections go on. The next stream or request
  for the model loads it again in a fresh child (the pool sees the proxy is no longer
  :attr:`IsolatedModel.alive`).
- **Its life.** The child reads a JSON request on stdin, loads the model, listens on a Unix
  socket in a private folder (authenticated with a random key the request carries), and
  answers one line on stdout: ready, with what the model can do, or why it failed. It then
  lives until its stdin closes: the server unloading the model, or the server itself ending
  (even killed), so no child outlives its server. It ignores SIGINT and SIGTERM: a Ctrl-C or
  a signal to the whole process group lets the server drain its streams before it closes the
  engines.

Every message is a pickled tuple on a :mod:`multiprocessing.connection` between two processes
of this package, authenticated both ways; nothing else can connect.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from ..config import Settings
from ..protocol import EngineFinal, ErrorCode
from ..protocol.messages import StartOptions
from . import memory
from .base import (
    EngineUnavailable,
    EngineUpdate,
    FileTranscriber,
    LoadedModel,
    Recognition,
    RecognitionModel,
    Refusal,
    Transcript,
    TranscriptionCancelled,
    TranscriptionRequest,
    Work,
)
from .registry import ModelEntry, entry_from_json
from .tts.base import (
    Emitter,
    SpeechError,
    SpeechErrorKind,
    SpeechModel,
    SpeechRequest,
    SpeechStream,
    SynthesisFailed,
    start_synthesis,
)
from .validate import entry_json, load_model

if TYPE_CHECKING:
    from .runner import DecodeRounds

__all__ = [
    "ISOLATED_EXECUTORS",
    "EngineCrashed",
    "IsolatedFileModel",
    "IsolatedModel",
    "IsolatedSpeechModel",
    "isolates",
    "load_engine",
    "load_isolated",
    "load_isolated_speech",
]

log = logging.getLogger("talkies.engines")

# The executors whose models run in a child with TALKIES_ENGINE_ISOLATION=process (native
# code: the ASR libraries, and torch and onnxruntime under the speech models).
ISOLATED_EXECUTORS = frozenset({"sherpa", "vosk", "whisper", "parakeet_cpp", "qwen3_tts", "kokoro"})

_HELLO = "TALKIES-ENGINE "  # the prefix of the child's one line on stdout
_CLOSE_WAIT = 10.0  # seconds a closed child has to free its model before it is killed
_CALL_WAIT = 30.0  # seconds a speech model's voices/validate call may take: else it is hung
_STOP_POLL = 0.05  # how often a call waiting for the child looks at its cancel or stop flag


class EngineCrashed(RuntimeError):
    """The model's engine process ended; the model must be loaded again."""


def _describe_exit(status: int | None) -> str:
    if status is None:
        return "stopped answering"
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


# -- the server's side -------------------------------------------------------------------------


def isolates(entry: ModelEntry, settings: Settings) -> bool:
    """Whether ``entry`` is loaded in a child process under ``settings``."""
    return settings.engine_isolation == "process" and entry.executor in ISOLATED_EXECUTORS


def load_engine(entry: ModelEntry, root: Path, device: str, settings: Settings) -> LoadedModel:
    """What the pool's default loader does: :func:`load_isolated` where :func:`isolates`,
    else :func:`~talkies.engines.validate.load_model` in this process (for servers that wrap
    the loader, e.g. to add models of their own)."""
    if isolates(entry, settings):
        return load_isolated(entry, root, device)
    return load_model(entry, root, device)


def load_isolated(
    entry: ModelEntry, root: Path, device: str, *, timeout: float = 300.0
) -> IsolatedModel:
    """Start a child that loads ``entry`` and return its proxy (blocking: the pool calls it
    from the thread that loads the model). A load that fails, crashes or takes longer than
    ``timeout`` seconds is an :class:`EngineUnavailable`."""
    spawned, hello = _spawn(entry, root, device, {}, timeout)
    cls = IsolatedFileModel if hello.get("files") else IsolatedModel
    return cls(
        spawned,
        parallel=int(hello.get("parallel", 1)),
        gather=float(hello.get("gather", 0.0)),
    )


def load_isolated_speech(
    entry: ModelEntry, root: Path, device: str, data_dir: Path, *, timeout: float = 300.0
) -> IsolatedSpeechModel:
    """:func:`load_isolated` for a speech (TTS) entry: its proxy is a
    :class:`~talkies.engines.tts.base.SpeechModel`. ``data_dir`` holds the custom voices."""
    spawned, hello = _spawn(
        entry, root, device, {"speech": True, "data_dir": str(data_dir)}, timeout
    )
    return IsolatedSpeechModel(
        spawned, sample_rate=int(hello["sample_rate"]), streaming=bool(hello["streaming"])
    )


@dataclass(frozen=True, slots=True)
class _Spawned:
    """An engine process that said it is ready, and how to reach it."""

    slug: str
    proc: subprocess.Popen[bytes]
    folder: Path  # private (0700), holding the socket
    address: str
    key: bytes  # the connections' authkey


def _spawn(
    entry: ModelEntry, root: Path, device: str, extra: dict[str, Any], timeout: float
) -> tuple[_Spawned, dict[str, Any]]:
    """Start the child, send it the request, wait for its ready line: the child and what it
    said of the model."""
    folder = Path(tempfile.mkdtemp(prefix="talkies-engine-"))  # mode 0700
    address = str(folder / "socket")
    key = os.urandom(32)
    request = {
        "slug": entry.slug,
        "entry": entry_json(entry, root),
        "root": str(root),
        "device": device,
        "address": address,
        "key": key.hex(),
        "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        **extra,
    }
    proc = subprocess.Popen(
        # The slug only names the process for ps and top; the request says what to load.
        [sys.executable, "-m", "talkies.engines.isolated", entry.slug],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        close_fds=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    tail, copier = _pass_stderr(proc)
    try:
        with contextlib.suppress(BrokenPipeError):  # it ended at once: the hello says how
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
        hello = _read_hello(proc, timeout)
    except EngineUnavailable as exc:
        _discard(proc, folder, wait=0.0)
        copier.join(1.0)  # its stderr, to the end, for the message
        last = tail[-1][:300] if tail else "no output"
        raise EngineUnavailable(f"model {entry.slug!r} {exc}: {last}") from None
    except BaseException:
        _discard(proc, folder, wait=0.0)
        raise
    if not hello.get("ok"):
        _discard(proc, folder, wait=_CLOSE_WAIT)
        raise EngineUnavailable(f"model {entry.slug!r} could not be loaded: {hello.get('error')}")
    return _Spawned(entry.slug, proc, folder, address, key), hello


def _pass_stderr(proc: subprocess.Popen[bytes]) -> tuple[deque[str], threading.Thread]:
    """Copy the child's stderr (its JSON log lines, a native library's messages) to ours, as
    it comes, in a thread that ends with it; the last lines are kept for the message of a
    failed load."""
    tail: deque[str] = deque(maxlen=5)
    stream = proc.stderr
    assert stream is not None

    def copy() -> None:
        out = sys.stderr
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                tail.append(line)
            with contextlib.suppress(Exception):
                out.write(line + "\n")
                out.flush()
        stream.close()

    copier = threading.Thread(target=copy, name="talkies-engine-stderr", daemon=True)
    copier.start()
    return tail, copier


def _read_hello(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """The child's ready line (other output of a native library is skipped)."""
    result: dict[str, Any] = {}
    stdout = proc.stdout
    assert stdout is not None

    def read() -> None:
        for raw in stdout:
            line = raw.decode("utf-8", "replace")
            if line.startswith(_HELLO):
                result.update(json.loads(line[len(_HELLO) :]))
                return

    reader = threading.Thread(target=read, name="talkies-engine-hello", daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        raise EngineUnavailable(f"did not load within {timeout:g} s")
    if not result:
        status = proc.wait()
        raise EngineUnavailable(f"failed to load: its engine process {_describe_exit(status)}")
    return result


def _stop(proc: subprocess.Popen[bytes], *, wait: float) -> None:
    """End a child: close its stdin (it frees its model and exits), kill it after ``wait``."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _discard(proc: subprocess.Popen[bytes], folder: Path, *, wait: float) -> None:
    """:func:`_stop` the child and remove its socket folder."""
    _stop(proc, wait=wait)
    shutil.rmtree(folder, ignore_errors=True)


class _EngineProcess:
    """The server's side of one engine process: its life, its end, and calls to it."""

    def __init__(self, spawned: _Spawned) -> None:
        self.slug = slug = spawned.slug
        self._proc = spawned.proc
        self._folder = spawned.folder
        self._address = spawned.address
        self._key = spawned.key
        self._local = threading.local()  # each thread's connection
        self._calls = itertools.count(1)
        self._closed = False
        self._reaped = False  # its pipes closed after it ended
        # It ended or is ending: a call found its socket closed, or it was killed. (poll()
        # alone can say "running" while another thread is in wait() on it.)
        self._dead = False
        self._killed_for: str | None = None  # why this side killed it (kill())
        self._reap_lock = threading.Lock()
        threading.Thread(target=self._watch, name=f"talkies-engine-{slug}", daemon=True).start()

    def _watch(self) -> None:
        """Watcher thread: notes at once that the child ended by itself."""
        status = self._proc.wait()
        if self._closed:
            return
        self._dead = True
        self._reap(status)
        self._ended(self._end_detail(status))

    def _ended(self, detail: str) -> None:
        """The child ended by itself (the watcher thread calls this once)."""

    def _reap(self, status: int | None) -> None:
        """The child has ended: its pipes and socket folder go now, not when the pool
        replaces the proxy."""
        if self._release(wait=0.0):
            log.error(
                "engine process ended",
                extra={"model": self.slug, "pid": self._proc.pid, "status": status},
            )

    def _release(self, *, wait: float) -> bool:
        """:func:`_discard` the child, once (whichever of its end and :meth:`close` comes
        first); whether this call did it."""
        with self._reap_lock:
            if self._reaped:
                return False
            self._reaped = True
            _discard(self._proc, self._folder, wait=wait)
            return True

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def alive(self) -> bool:
        """False once the child has ended (the pool then loads the model again)."""
        return not (self._closed or self._dead) and self._proc.poll() is None

    # -- calls -------------------------------------------------------------------------------

    def _crashed(self) -> EngineCrashed:
        self._dead = True
        try:
            status = self._proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            status = None
        else:
            self._reap(status)
        return EngineCrashed(self._end_detail(status))

    def _end_detail(self, status: int | None) -> str:
        how = _describe_exit(status)
        if self._killed_for is not None:
            how = f"was killed: {self._killed_for}"
        return f"the engine process of model {self.slug!r} {how}"

    def _connect(self) -> Connection:
        if self._closed:
            raise EngineCrashed(f"model {self.slug!r} was unloaded")
        try:
            return Client(self._address, family="AF_UNIX", authkey=self._key)
        except (OSError, EOFError):  # EOF: it ended during the handshake
            raise self._crashed() from None

    def _conn(self) -> Connection:
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self._local.conn = self._connect()
        return conn

    def _exchange(self, conn: Connection, message: tuple[Any, ...]) -> Any:
        try:
            conn.send(message)
            reply = conn.recv()
        except (EOFError, OSError):
            conn.close()
            raise self._crashed() from None
        return _result(reply)

    def call(self, *message: Any, timeout: float | None = None) -> Any:
        """One request on this thread's connection; its answer, or what the child raised.
        A child with no answer (connecting included) within ``timeout`` seconds is taken to
        be hung and killed (:meth:`kill`): the call then raises :class:`EngineCrashed`."""
        if timeout is None:
            return self._exchange(self._conn(), message)
        why = f"a {message[0]!r} call had no answer within {timeout:g} s"
        watchdog = threading.Timer(timeout, self.kill, args=(why,))
        watchdog.daemon = True
        watchdog.start()
        try:
            return self._exchange(self._conn(), message)
        finally:
            watchdog.cancel()

    def kill(self, why: str) -> None:
        """End the child at once (SIGKILL; it does not wait): its calls in flight and later
        ones raise :class:`EngineCrashed`, and the pool loads the model again. For a child
        that is hung: otherwise the thread waiting on it would stay blocked for good, and the
        call would go on holding the engine's CPU and memory."""
        self._dead = True
        if self._proc.poll() is None:
            self._killed_for = why
            log.error(
                "killing the engine process",
                extra={"model": self.slug, "pid": self.pid, "why": why},
            )
            with contextlib.suppress(OSError):
                self._proc.kill()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._release(wait=_CLOSE_WAIT)


class IsolatedModel(_EngineProcess, RecognitionModel):
    """The server's proxy for a recognition model loaded in a child process (see the module)."""

    def __init__(self, spawned: _Spawned, *, parallel: int, gather: float) -> None:
        self._parallel = parallel
        self._gather = gather
        super().__init__(spawned)

    def _ended(self, detail: str) -> None:
        # The model's open streams fail at once, not at their next call: a client that
        # paused would otherwise learn it late.
        if self._rounds is not None:
            self._rounds.fail_all(detail)

    def decode_rounds(self) -> DecodeRounds:
        from .runner import DecodeRounds

        return DecodeRounds(self._parallel, gather=self._gather)

    def recognition(self, options: StartOptions) -> Recognition:
        rid, batch = self.call("open", options)
        return _RemoteBatch(self, rid) if batch else _Remote(self, rid)


class IsolatedFileModel(IsolatedModel):
    """A proxy whose model also transcribes files (:class:`FileTranscriber`)."""

    def transcribe(self, pcm: bytes, request: TranscriptionRequest) -> Transcript:
        call = next(self._calls)
        conn = self._conn()
        try:
            conn.send(("transcribe", call, pcm, replace(request, cancel=None)))
            cancel_sent = False
            while not conn.poll(_STOP_POLL):
                if not cancel_sent and request.cancel is not None and request.cancel.is_set():
                    cancel_sent = True
                    with contextlib.closing(self._connect()) as other:
                        self._exchange(other, ("cancel", call))
            reply = conn.recv()
        except (EOFError, OSError):
            conn.close()
            raise self._crashed() from None
        result: Transcript = _result(reply)
        return result


class _Remote:
    """A stream's recognition, living in the child."""

    def __init__(self, model: IsolatedModel, rid: int) -> None:
        self._model = model
        self.rid = rid

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        result: Sequence[EngineUpdate] = self._model.call("accept", self.rid, pcm)
        return result

    def finish(self) -> EngineFinal:
        result: EngineFinal = self._model.call("finish", self.rid)
        return result

    def close(self) -> None:
        if self._model.alive:
            with contextlib.suppress(EngineCrashed):
                self._model.call("close", self.rid)

    def abandon(self) -> None:
        """A call on it passed the decode deadline (the runtime says so, on the event loop):
        the engine process is hung, so it is killed (see :meth:`IsolatedModel.kill`)."""
        self._model.kill("a decode call passed its deadline")


class _RemoteBatch(_Remote):
    """A recognition whose model decodes many streams in one call (sherpa)."""

    def decode_many(self, work: Sequence[Work]) -> None:
        items = [(w.recognition.rid, w.pcm, w.finish) for w in work]  # type: ignore[attr-defined]
        results: list[tuple[list[Any], bool]] = self._model.call("many", items)
        for one, (events, more) in zip(work, results, strict=True):
            one.events.extend(events)
            one.more = more


class IsolatedSpeechModel(_EngineProcess):
    """The server's proxy for a speech (TTS) model loaded in a child process: a
    :class:`~talkies.engines.tts.base.SpeechModel`.

    A synthesis is one connection of its own: the child streams ``("chunk", pcm, steps)``
    messages and ends with the step count or the error. Here a worker thread (the same
    :func:`~talkies.engines.tts.base.start_synthesis` as an in-process model, so the same
    bounded queue, stop flag and ``aclose``) relays them; a reader that stops closes the
    connection, and the child stops generating at its next step. A crash fails the
    synthesis in flight (a 500, or the streamed body cut short) and the next request loads
    the model again.
    """

    def __init__(self, spawned: _Spawned, *, sample_rate: int, streaming: bool) -> None:
        self.sample_rate = sample_rate
        self.streaming = streaming
        # One synthesis at a time, as in the model itself (a second waits here, in its own
        # worker thread, and gives up when its reader leaves).
        self._lock = threading.Lock()
        super().__init__(spawned)

    def voices(self) -> list[str]:
        """Blocking (a call to the child): the event loop calls it from a worker thread."""
        voices: list[str] = self.call("voices", timeout=_CALL_WAIT)
        return voices

    def validate(self, request: SpeechRequest) -> None:
        """Blocking (a call to the child), like :meth:`voices`."""
        self.call("validate", request, timeout=_CALL_WAIT)

    async def synthesize(self, request: SpeechRequest, *, chunk_steps: int = 8) -> SpeechStream:
        if chunk_steps < 1:
            raise ValueError("chunk_steps must be at least 1")
        if self._closed:
            raise RuntimeError(f"model {self.slug!r} was closed")
        await anyio.to_thread.run_sync(self.validate, request)
        job = functools.partial(self._relay, request, chunk_steps)
        return start_synthesis(job, lock=self._lock, max_chunks=1, name=self.slug)

    def _relay(self, request: SpeechRequest, chunk_steps: int, emitter: Emitter) -> None:
        """The worker thread's job: the child's chunks into the stream's queue."""
        with self._connect() as conn:
            steps = 0
            try:
                conn.send(("synthesize", request, chunk_steps))
                while True:
                    while not conn.poll(_STOP_POLL):
                        emitter.check()  # the reader left: closing the connection stops it
                    reply = conn.recv()
                    last = reply[0] != "chunk"  # the end: the step count, or what failed
                    total = int(_result(reply)) if last else reply[2]
                    for _ in range(total - steps):
                        emitter.step()
                    steps = total
                    if last:
                        return
                    emitter.emit(reply[1])
            except (EOFError, OSError):
                raise self._crashed() from None


def _result(reply: tuple[Any, ...]) -> Any:
    """The value of a reply, or the child's exception raised again here."""
    kind = reply[0]
    if kind == "ok":
        return reply[1]
    if kind == "refusal":
        raise Refusal(ErrorCode(reply[1]), reply[2])
    if kind == "cancelled":
        raise TranscriptionCancelled(reply[1])
    if kind == "speech_error":
        raise SpeechError(SpeechErrorKind(reply[1]), reply[2], param=reply[3])
    raise RuntimeError(reply[1])


# -- the child's side --------------------------------------------------------------------------


class _Child:
    """The engine process: the real model and its recognitions, by id."""

    def __init__(self, model: RecognitionModel) -> None:
        self.model = model
        self._recognitions: dict[int, Recognition] = {}
        self._ids = itertools.count(1)
        self._cancels: dict[int, threading.Event] = {}
        self._lock = threading.Lock()

    def serve(self, conn: Connection) -> None:
        """Answer one connection's requests, one at a time, until it closes."""
        with conn:
            for message in _requests(conn):
                try:
                    reply: tuple[Any, ...] = ("ok", self._handle(message))
                except Refusal as exc:
                    reply = ("refusal", exc.code.value, exc.detail)
                except TranscriptionCancelled as exc:
                    reply = ("cancelled", str(exc))
                except Exception as exc:
                    log.exception("engine call failed", extra={"call": message[0]})
                    reply = ("error", f"{type(exc).__name__}: {exc}")
                if not _send(conn, reply):
                    return

    def _handle(self, message: tuple[Any, ...]) -> Any:
        kind = message[0]
        if kind == "open":
            recognition = self.model.recognition(message[1])
            with self._lock:
                rid = next(self._ids)
                self._recognitions[rid] = recognition
            return rid, callable(getattr(recognition, "decode_many", None))
        if kind == "accept":
            return list(self._recognitions[message[1]].accept(message[2]))
        if kind == "finish":
            return self._recognitions[message[1]].finish()
        if kind == "many":
            works = [Work(self._recognitions[rid], pcm, finish) for rid, pcm, finish in message[1]]
            works[0].recognition.decode_many(works)  # type: ignore[attr-defined]
            return [(w.events, w.more) for w in works]
        if kind == "close":
            with self._lock:
                closing = self._recognitions.get(message[1])
                self._recognitions.pop(message[1], None)
            if closing is not None:
                closing.close()
                memory.release()
            return None
        if kind == "transcribe":
            return self._transcribe(message[1], message[2], message[3])
        if kind == "cancel":
            with self._lock:
                event = self._cancels.get(message[1])
            if event is not None:
                event.set()
            return None
        raise ValueError(f"unknown request {kind!r}")

    def _transcribe(self, call: int, pcm: bytes, request: TranscriptionRequest) -> Transcript:
        if not isinstance(self.model, FileTranscriber):
            raise ValueError("this model does not transcribe files")
        cancel = threading.Event()
        with self._lock:
            self._cancels[call] = cancel
        try:
            return self.model.transcribe(pcm, replace(request, cancel=cancel))
        finally:
            with self._lock:
                self._cancels.pop(call, None)

    def close(self) -> None:
        with self._lock:
            recognitions = list(self._recognitions.values())
            self._recognitions.clear()
        for recognition in recognitions:
            with contextlib.suppress(Exception):
                recognition.close()
        self.model.close()


def _speech_failure(exc: Exception) -> tuple[Any, ...]:
    """The reply for what a speech model raised (the child's side of :func:`_result`)."""
    if isinstance(exc, SpeechError):
        return ("speech_error", exc.kind.value, exc.message, exc.param)
    if not isinstance(exc, SynthesisFailed):  # that one was logged where it was raised
        log.exception("speech engine call failed")
    return ("error", f"{type(exc).__name__}: {exc}")


class _SpeechChild:
    """The engine process of a speech model: answers voices, validate and synthesize."""

    def __init__(self, model: SpeechModel) -> None:
        self.model = model

    def serve(self, conn: Connection) -> None:
        """Answer one connection's requests until it closes; a synthesis is its last."""
        with conn:
            for message in _requests(conn):
                kind = message[0]
                if kind == "synthesize":
                    anyio.run(self._synthesize, conn, message[1], message[2])
                    return
                try:
                    if kind == "voices":
                        reply: tuple[Any, ...] = ("ok", self.model.voices())
                    elif kind == "validate":
                        self.model.validate(message[1])
                        reply = ("ok", None)
                    else:
                        raise ValueError(f"unknown request {kind!r}")
                except Exception as exc:
                    reply = _speech_failure(exc)
                if not _send(conn, reply):
                    return

    async def _synthesize(self, conn: Connection, request: SpeechRequest, steps: int) -> None:
        try:
            stream = await self.model.synthesize(request, chunk_steps=steps)
        except Exception as exc:
            _send(conn, _speech_failure(exc))
            return
        reply: tuple[Any, ...] = ("error", "the synthesis was stopped")
        async with stream, anyio.create_task_group() as group:

            async def server_left() -> None:
                # The server closes the connection when its reader stops (or it ended):
                # closing the stream stops the model at its next step.
                await anyio.wait_readable(conn.fileno())
                group.cancel_scope.cancel()

            group.start_soon(server_left)
            try:
                async for chunk in stream:
                    if not _send(conn, ("chunk", chunk, stream.steps)):
                        break
                else:
                    reply = ("ok", stream.steps)
            except Exception as exc:
                reply = _speech_failure(exc)
            group.cancel_scope.cancel()
        _send(conn, reply)

    def close(self) -> None:
        self.model.close()


def _requests(conn: Connection) -> Iterator[tuple[Any, ...]]:
    """The server's requests on ``conn``, until it closes the connection."""
    while True:
        try:
            yield conn.recv()
        except (EOFError, OSError):
            return


def _send(conn: Connection, reply: tuple[Any, ...]) -> bool:
    """Send ``reply``; False when the server's end is gone."""
    try:
        conn.send(reply)
    except OSError:
        return False
    return True


def _hello(payload: dict[str, Any]) -> None:
    sys.stdout.write(_HELLO + json.dumps(payload) + "\n")
    sys.stdout.flush()


def _load_recognition(
    entry: ModelEntry, root: Path, request: dict[str, Any]
) -> RecognitionModel | None:
    """The recognition model, loaded and checked; None once the hello said why not."""
    try:
        model = load_model(entry, root, request["device"])
    except Exception as exc:
        _not_loaded(exc)
        return None
    if not isinstance(model, RecognitionModel):
        _hello({"ok": False, "error": f"executor {entry.executor!r} has no recognitions"})
        return None
    try:  # the load check: one stream decodes half a second of silence to its end
        warm = model.recognition(StartOptions(model=entry.slug))
        warm.accept(bytes(16000))
        warm.finish()
        warm.close()
    except Exception as exc:
        _hello({"ok": False, "error": f"it failed its first decode: {exc!r}"})
        return None
    return model


def _load_speech(entry: ModelEntry, root: Path, request: dict[str, Any]) -> SpeechModel | None:
    """The speech model, loaded; None once the hello said why not."""
    from .tts.loader import load_speech_model

    try:
        return load_speech_model(entry, root, request["device"], Path(request["data_dir"]))
    except Exception as exc:
        _not_loaded(exc)
        return None


def _not_loaded(exc: Exception) -> None:
    """The hello of a load that raised: its client-safe message, else what it was."""
    _hello({"ok": False, "error": str(exc) if isinstance(exc, EngineUnavailable) else repr(exc)})


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    request = json.loads(sys.stdin.buffer.readline())
    from ..logs import configure

    configure(str(request.get("log_level", "INFO")).lower())
    root = Path(request["root"])
    entry, problems = entry_from_json(request["slug"], request["entry"], root)
    if entry is None or problems:
        _hello({"ok": False, "error": f"invalid entry: {'; '.join(problems)}"})
        return 2
    began = time.monotonic()
    if request.get("speech"):
        loaded = _load_speech(entry, root, request)
        if loaded is None:
            return 1
        child: _Child | _SpeechChild = _SpeechChild(loaded)
        ready: dict[str, Any] = {"sample_rate": loaded.sample_rate, "streaming": loaded.streaming}
    else:
        model = _load_recognition(entry, root, request)
        if model is None:
            return 1
        child = _Child(model)
        rounds = model.rounds
        ready = {
            "parallel": rounds.parallel,
            "gather": rounds.gather,
            "files": isinstance(model, FileTranscriber),
        }
    listener = Listener(request["address"], family="AF_UNIX", authkey=bytes.fromhex(request["key"]))

    def accept() -> None:
        while True:
            try:
                conn = listener.accept()
            except OSError:
                return  # the listener was closed
            except Exception:  # a failed handshake (AuthenticationError): not one of ours
                continue
            threading.Thread(target=child.serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, name="talkies-engine-accept", daemon=True).start()
    _hello({"ok": True, **ready, "seconds": round(time.monotonic() - began, 3)})
    os.dup2(2, 1)  # a native library's later prints go to stderr, not into an unread pipe
    sys.stdin.buffer.read()  # until the server closes it, or ends
    listener.close()
    with contextlib.suppress(Exception):
        child.close()
    os._exit(0)  # threads still in a native call must not hold the exit up


if __name__ == "__main__":
    raise SystemExit(main())
