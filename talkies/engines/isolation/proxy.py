"""Native speech engines in a process of their own, so that a crash in one never ends the server.

Vosk, sherpa-onnx, whisper.cpp and parakeet.cpp are native libraries, and so are torch and
onnxruntime under the speech models (Qwen3-TTS, Kokoro): a bad model, a bug or an
out-of-memory in them can end the process that called them (a segmentation fault, an
``abort()``, sherpa's ``exit(255)``), with no exception and no cleanup. With
``TALKIES_ENGINE_ISOLATION=process`` (the default) the pool loads each such model in a child
process (``python -m talkies.engines.isolation.child``) and talks to it over local sockets;
the server keeps only a proxy (:class:`IsolatedModel`, or :class:`IsolatedSpeechModel` for a
speech model, whose synthesis streams its chunks over a connection of its own).

- **Same runtime.** The proxy is a :class:`~talkies.engines.base.RecognitionModel` like the
  others: the server's decode rounds (:mod:`talkies.engines.runtime.rounds`) with their byte-bounded
  queues, batching, deadline and slots drive it unchanged. A round thread's ``accept``,
  ``finish`` or ``decode_many`` becomes one request on that thread's own connection to the
  child, where a thread of its own makes the real call (native decoders release the GIL, so
  rounds in parallel stay parallel). A file transcription is one request followed by its
  audio in bounded messages, pulled as the socket takes them; the client leaving sends a
  cancel on a second connection.
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
import logging
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio

from ...config import Settings
from ...protocol import EngineFinal
from ...protocol.messages import StartOptions
from .. import catalogue
from ..base import (
    EngineLost,
    EngineUpdate,
    LoadedModel,
    PcmSource,
    Recognition,
    Transcript,
    TranscriptionRequest,
    Work,
    pcm_chunks,
)
from ..runtime import RecognitionModel
from ..supply.entry import ModelEntry
from ..tts.base import (
    Emitter,
    SpeechRequest,
    SpeechStream,
    start_synthesis,
)
from .spawn import CLOSE_WAIT, Spawned, describe_exit, discard, spawn
from .wire import WIRE_CHUNK_BYTES, value_of

if TYPE_CHECKING:
    from ..runtime.rounds import DecodeRounds

__all__ = [
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


_CALL_WAIT = 30.0  # seconds a speech model's voices/validate call may take: else it is hung
_STOP_POLL = 0.05  # how often a call waiting for the child looks at its cancel or stop flag


class EngineCrashed(EngineLost):
    """The model's engine process ended; the model must be loaded again."""


# -- the server's side -------------------------------------------------------------------------


def isolates(entry: ModelEntry, settings: Settings) -> bool:
    """Whether ``entry`` is loaded in a child process under ``settings``."""
    return settings.engine_isolation == "process" and catalogue.executor_of(entry).isolated


def load_engine(entry: ModelEntry, root: Path, device: str, settings: Settings) -> LoadedModel:
    """What the pool's default loader does: :func:`load_isolated` where :func:`isolates`,
    else :func:`~talkies.engines.catalogue.load_recognition` in this process (for servers that wrap
    the loader, e.g. to add models of their own)."""
    if isolates(entry, settings):
        return load_isolated(entry, root, device)
    return catalogue.load_recognition(entry, root, device)


def load_isolated(
    entry: ModelEntry, root: Path, device: str, *, timeout: float = 300.0
) -> IsolatedModel:
    """Start a child that loads ``entry`` and return its proxy (blocking: the pool calls it
    from the thread that loads the model). A load that fails, crashes or takes longer than
    ``timeout`` seconds is an :class:`EngineUnavailable`."""
    spawned, hello = spawn(entry, root, device, {}, timeout)
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
    spawned, hello = spawn(
        entry, root, device, {"speech": True, "data_dir": str(data_dir)}, timeout
    )
    return IsolatedSpeechModel(
        spawned, sample_rate=int(hello["sample_rate"]), streaming=bool(hello["streaming"])
    )


class _EngineProcess:
    """The server's side of one engine process: its life, its end, and calls to it."""

    def __init__(self, spawned: Spawned) -> None:
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
            discard(self._proc, self._folder, wait=wait)
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
        how = describe_exit(status)
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
        except BaseException:
            # Interrupted between the request and its answer: the answer would be read as
            # the next call's. The connection goes (the next call makes a new one).
            conn.close()
            raise
        return value_of(reply)

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
        self._release(wait=CLOSE_WAIT)


class IsolatedModel(_EngineProcess, RecognitionModel):
    """The server's proxy for a recognition model loaded in a child process (see the module)."""

    def __init__(self, spawned: Spawned, *, parallel: int, gather: float) -> None:
        self._parallel = parallel
        self._gather = gather
        super().__init__(spawned)

    def _ended(self, detail: str) -> None:
        # The model's open streams fail at once, not at their next call: a client that
        # paused would otherwise learn it late.
        if self._rounds is not None:
            self._rounds.fail_all(detail)

    def decode_rounds(self) -> DecodeRounds:
        from ..runtime.rounds import DecodeRounds

        return DecodeRounds(self._parallel, gather=self._gather)

    def recognition(self, options: StartOptions) -> Recognition:
        rid, batch = self.call("open", options)
        return _RemoteBatch(self, rid) if batch else _Remote(self, rid)


class IsolatedFileModel(IsolatedModel):
    """A proxy whose model also transcribes files (:class:`FileTranscriber`).

    A transcription is a request on the calling thread's connection, then its audio as
    messages of at most :data:`~.wire.WIRE_CHUNK_BYTES` each, pulled from the source as the
    socket takes them (a full socket buffer blocks the send: the child reads the next one
    only when its engine asks), then an end marker; the child answers once, when its engine
    is done. A cancel travels on a second connection, sent by a watcher thread, so it is not
    held up behind a send that waits for the socket to drain.
    """

    def transcribe(self, audio: PcmSource, request: TranscriptionRequest) -> Transcript:
        call = next(self._calls)
        conn = self._conn()
        done = threading.Event()
        if request.cancel is not None:
            watcher = threading.Thread(
                target=self._watch_cancel,
                args=(call, request.cancel, done),
                name=f"talkies-cancel-{self.slug}",
                daemon=True,
            )
            watcher.start()
        stopped: Exception | None = None  # what pulling the audio raised
        try:
            conn.send(("transcribe", call, replace(request, cancel=None)))
            chunks = pcm_chunks(audio, WIRE_CHUNK_BYTES)
            while not conn.poll(0):  # an answer before the end: the engine failed
                try:
                    chunk = next(chunks)
                except StopIteration:
                    break
                except Exception as exc:  # the audio stopped coming: the engine stops too
                    stopped = exc
                    self._cancel(call)
                    break
                conn.send(("pcm", chunk))
            conn.send(("end",))
            reply = conn.recv()
        except (EOFError, OSError):
            conn.close()
            raise self._crashed() from None
        except BaseException:
            # Anything else that ends the exchange early (a cancellation the audio source
            # raised past ``except Exception``) leaves the child mid-call on this
            # connection, whose next call would read this one's answer: it goes, and the
            # child, seeing it close, stops the call.
            conn.close()
            raise
        finally:
            done.set()
        if stopped is not None:
            raise stopped  # once the engine has stopped
        result: Transcript = value_of(reply)
        return result

    def _cancel(self, call: int) -> None:
        """Tell the child to stop transcription ``call`` (on a connection of its own)."""
        with (
            contextlib.suppress(EngineCrashed, EOFError, OSError),
            contextlib.closing(self._connect()) as other,
        ):
            self._exchange(other, ("cancel", call))

    def _watch_cancel(self, call: int, cancel: threading.Event, done: threading.Event) -> None:
        """A watcher thread: sends the cancel of ``call`` once ``cancel`` is set, unless the
        call ended first."""
        while not done.is_set():
            if cancel.wait(_STOP_POLL):
                if not done.is_set():
                    self._cancel(call)
                return


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

    def __init__(self, spawned: Spawned, *, sample_rate: int, streaming: bool) -> None:
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
                    total = int(value_of(reply)) if last else reply[2]
                    for _ in range(total - steps):
                        emitter.step()
                    steps = total
                    if last:
                        return
                    emitter.emit(reply[1])
            except (EOFError, OSError):
                raise self._crashed() from None
