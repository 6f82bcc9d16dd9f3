"""The engine process: ``python -m talkies.engines.isolation.child`` (see
:mod:`talkies.engines.isolation`).

It reads a JSON request on stdin, loads the model, listens on a Unix socket in a private folder
(authenticated with the random key the request carries), and answers one line on stdout:
ready, with what the model can do, or why it failed. It then answers the proxy's calls
(:mod:`.proxy`), each connection in a thread of its own, until its stdin closes: the server
unloading the model, or the server itself ending (even killed), so no child outlives its
server. It ignores SIGINT and SIGTERM: a Ctrl-C or a signal to the whole process group lets
the server drain its streams before it closes the engines.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

import anyio

from ...protocol.messages import StartOptions
from ..base import (
    EngineUnavailable,
    FileTranscriber,
    PcmSource,
    Recognition,
    Transcript,
    TranscriptionCancelled,
    TranscriptionRequest,
    Work,
)
from ..catalogue import load_recognition as load_model
from ..catalogue import load_speech
from ..runtime import RecognitionModel, memory
from ..supply.registry import ModelEntry, entry_from_json
from ..tts.base import SpeechModel, SpeechRequest
from .wire import HELLO, reply_for, requests, send

log = logging.getLogger("talkies.engines")

_EARLY_CANCELS = 1024


class _Child:
    """The engine process: the real model and its recognitions, by id."""

    def __init__(self, model: RecognitionModel) -> None:
        self.model = model
        self._recognitions: dict[int, Recognition] = {}
        self._ids = itertools.count(1)
        self._cancels: dict[int, threading.Event] = {}
        # Cancels that came before their call was registered (a large request is still being
        # read on its own connection): the call starts cancelled. Bounded: a cancel for a
        # call that already ended is forgotten after _EARLY_CANCELS more.
        self._early: OrderedDict[int, None] = OrderedDict()
        self._lock = threading.Lock()

    def serve(self, conn: Connection) -> None:
        """Answer one connection's requests, one at a time, until it closes."""
        with conn:
            for message in requests(conn):
                if message[0] == "transcribe":  # its audio follows on this connection
                    if not self.transcribe(conn, message[1], message[2]):
                        return
                    continue
                try:
                    reply: tuple[Any, ...] = ("ok", self._handle(message))
                except Exception as exc:
                    reply = reply_for(exc)
                if not send(conn, reply):
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
        if kind == "cancel":
            with self._lock:
                event = self._cancels.get(message[1])
                if event is None:
                    self._early[message[1]] = None
                    while len(self._early) > _EARLY_CANCELS:
                        self._early.popitem(last=False)
            if event is not None:
                event.set()
            return None
        raise ValueError(f"unknown request {kind!r}")

    def transcribe(self, conn: Connection, call: int, request: TranscriptionRequest) -> bool:
        """Transcription ``call``: its audio read from ``conn`` as the engine asks for it
        (``("pcm", chunk)`` messages up to ``("end",)``), one answer, then whatever audio the
        server sent before it saw an early answer, up to its end marker. False when the
        server is gone."""
        audio = _WireAudio(conn)
        try:
            reply: tuple[Any, ...] = ("ok", self._transcribe(call, audio, request))
        except Exception as exc:
            reply = reply_for(exc)
        sent = send(conn, reply)
        memory.release()  # the engine's state of a long file, freed: back to the system
        return sent and audio.drain()

    def _transcribe(self, call: int, audio: PcmSource, request: TranscriptionRequest) -> Transcript:
        if not isinstance(self.model, FileTranscriber):
            raise ValueError("this model does not transcribe files")
        cancel = threading.Event()
        with self._lock:
            self._cancels[call] = cancel
            if call in self._early:
                del self._early[call]
                cancel.set()
        try:
            return self.model.transcribe(audio, replace(request, cancel=cancel))
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


class _WireAudio:
    """A transcription's audio as the server sends it: ``("pcm", chunk)`` messages, then
    ``("end",)``. Iterated by the engine; each chunk is read when the engine asks for it."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._ended = False

    def __iter__(self) -> Iterator[bytes]:
        while not self._ended:
            chunk = self._next()
            if chunk is None:
                return
            yield chunk

    def _next(self) -> bytes | None:
        try:
            message = self._conn.recv()
        except (EOFError, OSError):
            self._ended = True
            raise TranscriptionCancelled("the server closed the connection") from None
        if message[0] == "pcm":
            chunk: bytes = message[1]
            return chunk
        self._ended = True  # ("end",)
        return None

    def drain(self) -> bool:
        """Read what is left up to the end marker; False when the server is gone."""
        try:
            while not self._ended:
                self._next()
        except TranscriptionCancelled:
            return False
        return True


class _SpeechChild:
    """The engine process of a speech model: answers voices, validate and synthesize."""

    def __init__(self, model: SpeechModel) -> None:
        self.model = model

    def serve(self, conn: Connection) -> None:
        """Answer one connection's requests until it closes; a synthesis is its last."""
        with conn:
            for message in requests(conn):
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
                    reply = reply_for(exc)
                if not send(conn, reply):
                    return

    async def _synthesize(self, conn: Connection, request: SpeechRequest, steps: int) -> None:
        try:
            stream = await self.model.synthesize(request, chunk_steps=steps)
        except Exception as exc:
            send(conn, reply_for(exc))
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
                    if not send(conn, ("chunk", chunk, stream.steps)):
                        break
                else:
                    reply = ("ok", stream.steps)
            except Exception as exc:
                reply = reply_for(exc)
            group.cancel_scope.cancel()
        send(conn, reply)

    def close(self) -> None:
        self.model.close()


def _hello(payload: dict[str, Any]) -> None:
    sys.stdout.write(HELLO + json.dumps(payload) + "\n")
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
    try:
        return load_speech(entry, root, request["device"], Path(request["data_dir"]))
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
    from ...logs import configure

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
