"""A file transcription holds a bounded part of its audio, whatever the file's length (issue 21,
point 3): ffmpeg's PCM goes to the engine through a channel of at most ``CHANNEL_DEPTH`` chunks,
the server's decodes take turns (``TALKIES_FILE_MAX_CONCURRENCY``), Whisper decodes a window
at a time, and base64 audio (MCP) is decoded a slice at a time.

The end-to-end bounds (4 uploads at once of 4 h of audio, resident memory of the server and its
engine process; 4 large MCP calls at once) are the ``upload-long`` and ``mcp-base64-large`` rows
of docs/reliability.md.
"""

from __future__ import annotations

import base64
import io
import os
import random
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import numpy as np
import psutil
import pytest

from talkies import audio
from talkies.app.http import HttpError
from talkies.app.mcp_speech import write_base64
from talkies.app.transcribe import CHANNEL_DEPTH, PcmChannel, transcribe_audio, transcribe_file
from talkies.config import Settings
from talkies.engines.base import (
    LoadedModel,
    PcmSource,
    Transcript,
    TranscriptionRequest,
    pcm_chunks,
)
from talkies.engines.pool import ModelPool
from talkies.engines.runtime import RecognitionModel
from talkies.engines.supply.registry import ModelEntry
from talkies.engines.whisper.files import file_windows

pytestmark = pytest.mark.anyio

SR = 16000
MB = 1024 * 1024


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class TakingTranscriber(RecognitionModel):
    """Takes its audio ``pause`` seconds per chunk; records how much came, how much the
    channel ever held, and how many transcriptions ran at once."""

    def __init__(self, pause: float = 0.0) -> None:
        self.pause = pause
        self.running = 0
        self.most_running = 0
        self.received = 0
        self.most_held = 0
        self.lock = threading.Lock()

    def transcribe(self, audio: PcmSource, request: TranscriptionRequest) -> Transcript:
        with self.lock:
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            size = 0
            for chunk in pcm_chunks(audio, 1 << 20):
                size += len(chunk)
                if isinstance(audio, PcmChannel):
                    self.most_held = max(self.most_held, audio.most_held)
                time.sleep(self.pause)
            with self.lock:
                self.received += size
            return Transcript(text="done", language="en", duration=size / (2 * SR))
        finally:
            with self.lock:
                self.running -= 1


def _pool(tmp_path: Path, model: TakingTranscriber, *, slots: int = 1) -> ModelPool:
    def load(entry: ModelEntry, root: Path, device: str) -> LoadedModel:
        return model

    (tmp_path / "m").mkdir(exist_ok=True)
    entry = ModelEntry(slug="m", executor="vosk", path=tmp_path / "m", max_concurrency=slots)
    settings = Settings(data_dir=tmp_path / "data", engine_isolation="thread")
    return ModelPool({"m": entry}, settings, loader=load, validate=False)


def _ffmpeg(*args: str) -> None:
    command = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y", *args]
    subprocess.run(command, check=True)


@pytest.fixture(scope="module")
def hour_flac(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An hour of quiet noise in FLAC (115 MB of PCM16 once decoded)."""
    path = tmp_path_factory.mktemp("memory") / "hour.flac"
    _ffmpeg(
        "-f", "lavfi", "-i", f"anullsrc=r={SR}:cl=mono", "-t", "3600", "-c:a", "flac", str(path)
    )
    return path


class PeakRss:
    """This process's resident memory, sampled every 10 ms in a thread: its peak over the
    value when sampling began."""

    def __init__(self) -> None:
        self._process = psutil.Process()
        self._stop = threading.Event()
        self.start = self._process.memory_info().rss
        self.peak = self.start
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def growth(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(0, self.peak - self.start)


# -- the channel --------------------------------------------------------------------------------


async def test_the_channel_holds_at_most_its_depth_and_the_chunk_being_put() -> None:
    channel = PcmChannel()
    chunk = bytes(audio.CHUNK_BYTES)
    taken: list[int] = []

    def engine() -> None:
        for piece in channel:
            taken.append(len(piece))
            time.sleep(0.002)  # slower than the decoder

    async def decoder() -> None:
        for _ in range(60):
            await channel.put(chunk)
        channel.close(complete=True)

    async with anyio.create_task_group() as group:
        group.start_soon(decoder)
        await anyio.to_thread.run_sync(engine)
    assert taken == [len(chunk)] * 60
    assert channel.most_held == (CHANNEL_DEPTH + 1) * len(chunk)  # full, and one waiting
    assert channel.held == 0


async def test_a_channel_closed_short_of_its_end_stops_the_engine() -> None:
    from talkies.engines.base import TranscriptionCancelled

    channel = PcmChannel()

    def engine() -> int:
        return sum(len(piece) for piece in channel)

    async with anyio.create_task_group() as group:

        async def decoder() -> None:
            await channel.put(bytes(100))
            channel.close(complete=False)

        group.start_soon(decoder)
        with pytest.raises(TranscriptionCancelled):
            await anyio.to_thread.run_sync(engine)


# -- the file route's path ----------------------------------------------------------------------


async def test_an_hour_of_audio_streams_through_a_bounded_channel(
    tmp_path: Path, hour_flac: Path
) -> None:
    """An hour of FLAC, decoded by ffmpeg straight into an engine slower than it: the engine
    gets all of it, the channel never held more than its bound, and this process grew by far
    less than the 115 MB the PCM would take (before: the whole PCM, then a copy of it)."""
    model = TakingTranscriber(pause=0.0005)
    pool = _pool(tmp_path, model)
    entry = pool.entry("m")
    assert entry is not None
    request = TranscriptionRequest(cancel=threading.Event())
    rss = PeakRss()
    transcript = await transcribe_file(
        pool,
        entry,
        hour_flac,
        request,
        decodes=anyio.CapacityLimiter(1),
        max_seconds=4 * 3600,
        param="file",
    )
    growth = rss.growth()
    assert transcript.duration == pytest.approx(3600.0)
    assert model.received == 3600 * SR * 2
    assert 0 < model.most_held <= (CHANNEL_DEPTH + 1) * audio.CHUNK_BYTES
    assert growth < 30 * MB, f"grew {growth / MB:.1f} MB"
    assert pool.in_use("m") == 0
    await pool.aclose()


async def test_decodes_take_turns_and_the_rest_wait(tmp_path: Path) -> None:
    """Three transcriptions on a model with three slots, one decode turn: one engine runs at
    a time, and all three are served."""
    model = TakingTranscriber(pause=0.01)
    pool = _pool(tmp_path, model, slots=3)
    entry = pool.entry("m")
    assert entry is not None
    turns = anyio.CapacityLimiter(1)

    async def produce(put: Callable[[bytes], Awaitable[None]]) -> None:
        for _ in range(10):
            await put(bytes(3200))

    results: list[str] = []

    async def one() -> None:
        request = TranscriptionRequest(cancel=threading.Event())
        transcript = await transcribe_audio(pool, entry, produce, request, decodes=turns)
        results.append(transcript.text)

    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(one)
        await anyio.sleep(0.05)
        assert pool.in_use("m") == 3  # each holds its slot while it waits for a turn
        assert turns.borrowed_tokens == 1
    assert results == ["done"] * 3
    assert model.most_running == 1
    assert pool.in_use("m") == 0
    await pool.aclose()


async def test_audio_that_fails_partway_stops_the_engine_and_answers_400(tmp_path: Path) -> None:
    model = TakingTranscriber()
    pool = _pool(tmp_path, model)
    entry = pool.entry("m")
    assert entry is not None

    async def produce(put: Callable[[bytes], Awaitable[None]]) -> None:
        await put(bytes(3200))
        raise HttpError(400, "the audio is longer than the limit of 1 seconds")

    request = TranscriptionRequest(cancel=threading.Event())
    with pytest.raises(HttpError) as refused:
        await transcribe_audio(pool, entry, produce, request, decodes=anyio.CapacityLimiter(1))
    assert refused.value.status == 400 and "longer than" in refused.value.message
    assert model.running == 0 and model.received == 0  # it stopped, with no transcript
    assert pool.in_use("m") == 0
    await pool.aclose()


async def test_an_engine_that_fails_stops_the_decoder(tmp_path: Path) -> None:
    """The engine gives up at once: the decoder, blocked on a full channel, is stopped, and
    the request answers 500 without waiting for the rest of the audio."""

    class Failing(TakingTranscriber):
        def transcribe(self, audio: PcmSource, request: TranscriptionRequest) -> Transcript:
            raise RuntimeError("broken model")

    pool = _pool(tmp_path, Failing())
    entry = pool.entry("m")
    assert entry is not None
    handed = 0

    async def produce(put: Callable[[bytes], Awaitable[None]]) -> None:
        nonlocal handed
        while True:  # endless: only a stop ends it
            await put(bytes(3200))
            handed += 1

    request = TranscriptionRequest(cancel=threading.Event())
    with anyio.fail_after(10), pytest.raises(HttpError) as failed:
        await transcribe_audio(pool, entry, produce, request, decodes=anyio.CapacityLimiter(1))
    assert failed.value.status == 500
    assert handed <= CHANNEL_DEPTH
    assert pool.in_use("m") == 0
    await pool.aclose()


# -- Whisper's windows --------------------------------------------------------------------------


def _tone(seconds: float, amplitude: int = 8000) -> np.ndarray:
    t = np.arange(round(seconds * SR)) / SR
    return (amplitude * np.sin(2 * np.pi * 440 * t)).astype("<i2")


def test_whisper_windows_are_bounded_cut_in_pauses_and_lose_nothing() -> None:
    # 1 s of tone, 0.4 s of silence, repeated: the pauses are where a cut may fall.
    unit = np.concatenate([_tone(1.0), np.zeros(round(0.4 * SR), "<i2")])
    samples = np.tile(unit, 30)  # 42 s
    pcm = samples.tobytes()
    chunks = [pcm[i : i + 3333 * 2 + 1] for i in range(0, len(pcm), 3333 * 2 + 1)]  # odd cuts
    windows = list(file_windows(chunks, window_seconds=10.0, search_seconds=3.0))
    assert len(windows) == 5
    rebuilt = np.concatenate([w for _, w in windows])
    assert rebuilt.tobytes() == pcm  # nothing lost, nothing doubled
    position = 0
    for first, window in windows:
        assert first == position
        assert window.size <= 10 * SR
        position += window.size
    for first, window in windows[:-1]:
        end = first + window.size
        assert samples[end - 200 : end + 200].max() == 0  # the cut fell in a pause
        assert window.size >= 7 * SR  # within the search at the end of the window


def test_whisper_windows_of_audio_shorter_than_one_window_is_the_audio() -> None:
    pcm = _tone(25.0).tobytes()
    chunks = [pcm[i : i + 64000] for i in range(0, len(pcm), 64000)]
    ((first, window),) = file_windows(chunks, window_seconds=300.0)
    assert first == 0 and window.tobytes() == pcm
    ((_, empty),) = file_windows([])
    assert empty.size == 0


# -- base64 -------------------------------------------------------------------------------------


def _decoded(text: str, limit: int = 1 << 30) -> bytes:
    out = io.BytesIO()
    write_base64(text, out, limit=limit)
    return out.getvalue()


@pytest.mark.parametrize("size", [1, 2, 3, 4, 1000, 3 * (1 << 20) + 1])
def test_base64_decoded_a_slice_at_a_time_is_the_whole_decode(size: int) -> None:
    data = random.Random(size).randbytes(size)
    text = base64.b64encode(data).decode()
    assert _decoded(text) == data
    # MIME line breaks (76 characters), spaces around, a data: URL
    wrapped = "\r\n".join(text[i : i + 76] for i in range(0, len(text), 76))
    assert _decoded(f"  {wrapped}\n") == data
    assert _decoded(f"data:audio/wav;base64,{wrapped}") == data


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("", 400),
        ("   ", 400),
        ("QUJD!", 400),
        ("QUJ", 400),  # not a whole group
        ("QQ==QUJD", 400),  # padding inside
        ("QQ==" + " " * (1 << 20) + "QUJD", 400),  # padding inside, in another slice
        ("QUJDé", 400),
        ("data:audio/wav,QUJD", 400),  # not base64
        ("data:audio/wav;base64", 400),
        (base64.b64encode(bytes(101)).decode(), 413),
    ],
)
def test_base64_that_is_not_or_too_much_is_refused(text: str, status: int) -> None:
    with pytest.raises(HttpError) as refused:
        _decoded(text, limit=100)
    assert refused.value.status == status


def test_base64_decoding_holds_a_slice_not_the_audio() -> None:
    import tracemalloc

    text = base64.b64encode(random.Random(1).randbytes(24 * MB)).decode()  # 32 MB of text
    tracemalloc.start()
    try:
        with open(os.devnull, "wb") as sink:
            written = write_base64(text, sink, limit=1 << 30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert written == 24 * MB
    assert peak < 8 * MB, f"peak {peak / MB:.1f} MB"  # a few 1 MiB slices, not 24 or 32 MB


# -- large MCP calls ----------------------------------------------------------------------------


async def test_a_large_mcp_call_waits_for_a_turn_before_its_body_is_read(tmp_path: Path) -> None:
    """Calls over LARGE_BODY take turns once that much has arrived (a declared length alone
    takes none), as many as TALKIES_FILE_MAX_CONCURRENCY; a small one never waits."""
    from contextlib import AsyncExitStack

    from talkies.app.files import FileStore
    from talkies.app.http import Body, Request
    from talkies.app.mcp import LARGE_BODY, McpEndpoint

    settings = Settings(data_dir=tmp_path, file_max_concurrency=1)
    endpoint = McpEndpoint(
        settings,
        pool=None,
        files=FileStore(tmp_path / "files"),
        tmp_dir=tmp_path / "tmp",
        decodes=anyio.CapacityLimiter(1),
    )

    def request(size: int, *, declared: bool) -> tuple[Request, list[int]]:
        reads: list[int] = []
        parts = [bytes(256 * 1024)] * (size // (256 * 1024))
        if size % (256 * 1024):
            parts.append(bytes(size % (256 * 1024)))

        async def receive() -> bytes:
            reads.append(1)
            return parts.pop() if parts else b""

        body = Body(receive, limit=1 << 30, declared=size if declared else None)
        return Request(method="POST", path="/mcp", body=body), reads

    async with AsyncExitStack() as first:  # a large call holds the only turn
        big, _ = request(2 * LARGE_BODY, declared=True)
        chunks = await endpoint._read(big, first)
        assert sum(map(len, chunks)) == 2 * LARGE_BODY
        small, _ = request(1000, declared=True)
        async with AsyncExitStack() as turn:
            assert sum(map(len, await endpoint._read(small, turn))) == 1000  # no turn needed
        for declared in (True, False):
            waiting, reads = request(2 * LARGE_BODY, declared=declared)
            waited: list[bool] = []

            async def another_call(waiting: Request = waiting, waited: list[bool] = waited) -> None:
                with anyio.move_on_after(0.3) as timeout:
                    async with AsyncExitStack() as turn:
                        await endpoint._read(waiting, turn)
                waited.append(timeout.cancelled_caught)

            async with anyio.create_task_group() as group:  # a request is a task of its own
                group.start_soon(another_call)
            assert waited == [True]  # it waited for the turn
            # Read only past LARGE_BODY (five 256 KiB chunks), declared or not.
            assert len(reads) == 5
    late, _ = request(2 * LARGE_BODY, declared=True)
    async with AsyncExitStack() as turn:  # the turn is free again
        assert sum(map(len, await endpoint._read(late, turn))) == 2 * LARGE_BODY

    # A client that declares a large body and sends nothing holds no turn meanwhile.
    async def stalled() -> bytes:
        await anyio.sleep_forever()
        return b""

    silent = Request(
        method="POST", path="/mcp", body=Body(stalled, limit=1 << 30, declared=2 * LARGE_BODY)
    )
    async with anyio.create_task_group() as group:
        group.start_soon(endpoint._read, silent, AsyncExitStack())
        await anyio.sleep(0.05)
        after, _ = request(2 * LARGE_BODY, declared=True)
        with anyio.fail_after(5):
            async with AsyncExitStack() as turn:
                assert sum(map(len, await endpoint._read(after, turn))) == 2 * LARGE_BODY
        group.cancel_scope.cancel()


async def test_a_large_mcp_call_that_trickles_its_body_loses_its_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a large call holds a turn, the rest of its body must keep coming at
    LARGE_CALL_MIN_RATE after a grace: a review's client sent just over LARGE_BODY, then a byte
    every 20 s (under the body's stall deadline), and two such held every large call for up
    to TALKIES_UPLOAD_TIMEOUT. Now it gets a 408 and the turn is free."""
    from contextlib import AsyncExitStack

    from talkies.app import mcp
    from talkies.app.files import FileStore
    from talkies.app.http import Body, HttpError, Request

    monkeypatch.setattr(mcp, "LARGE_CALL_GRACE", 0.3)
    settings = Settings(data_dir=tmp_path, file_max_concurrency=1)
    endpoint = mcp.McpEndpoint(
        settings,
        pool=None,
        files=FileStore(tmp_path / "files"),
        tmp_dir=tmp_path / "tmp",
        decodes=anyio.CapacityLimiter(1),
    )
    head = [bytes(256 * 1024)] * 4 + [bytes(16)]  # LARGE_BODY + 16 bytes, at once

    async def trickle() -> bytes:
        if head:
            return head.pop()
        await anyio.sleep(0.2)  # then a byte now and then, forever
        return b"x"

    slow = Request(method="POST", path="/mcp", body=Body(trickle, limit=1 << 30, declared=None))
    began = anyio.current_time()
    with pytest.raises(HttpError) as refused:
        async with AsyncExitStack() as turn:
            await endpoint._read(slow, turn)
    assert refused.value.status == 408 and "KiB/s" in str(refused.value)
    assert anyio.current_time() - began < 3
    parts = [bytes(256 * 1024)] * 8

    async def whole() -> bytes:
        return parts.pop() if parts else b""

    after = Request(method="POST", path="/mcp", body=Body(whole, limit=1 << 30, declared=None))
    with anyio.fail_after(2):  # the turn is free
        async with AsyncExitStack() as turn:
            assert sum(map(len, await endpoint._read(after, turn))) == 8 * 256 * 1024
