"""Speech models in an engine process (talkies/engines/isolation/, IsolatedSpeechModel).

Every test runs a tiny random-weight Qwen3-TTS (tests/modelgen/qwen3.py) on the real
``qwen-tts`` and torch in its real child process: the same PCM as the model in this process,
the model's own refusals, a reader that leaves stopping the child's generation, and a crash
(SIGSEGV, as a native fault in torch would end it) that fails the synthesis in flight, over
HTTP too, while the server goes on and the next request loads the model again.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

pytest.importorskip("torch")

from talkies.config import Settings
from talkies.engines.isolation import proxy as isolated
from talkies.engines.isolation.proxy import EngineCrashed, IsolatedSpeechModel, isolates
from talkies.engines.pool import ModelPool
from talkies.engines.qwen3 import Qwen3SpeechModel, import_qwen_tts
from talkies.engines.supply.registry import ModelEntry
from talkies.engines.tts import SpeechError, SpeechErrorKind, SpeechRequest, SynthesisFailed
from talkies.engines.tts.base import SpeechModel

try:
    import_qwen_tts()
except ImportError as exc:  # pragma: no cover - only without the qwen3 extra
    pytest.skip(f"qwen-tts is not installed: {exc}", allow_module_level=True)

from bench.report_parts import cpu_seconds

from .conftest import run_server
from .modelgen.qwen3 import tiny_qwen3_tts
from .reliability.load import engine_pids, wait_ended

STEP_BYTES = 1920 * 2  # one 12 Hz codec step of s16le at 24 kHz
SHORT, LONG = 24, 400  # codec steps per utterance


def _greedy(steps: int) -> dict[str, Any]:
    generation = {"do_sample": False, "subtalker_dosample": False, "max_new_tokens": steps + 1}
    return {"generation": generation}


@pytest.fixture(scope="module")
def entries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelEntry]:
    folder = tiny_qwen3_tts(tmp_path_factory.mktemp("isolated-qwen3") / "qwen3-tiny")
    return {
        slug: ModelEntry(slug=slug, executor="qwen3_tts", path=folder, options=_greedy(steps))
        for slug, steps in (("qwen3-tiny-random", SHORT), ("qwen3-tiny-long", LONG))
    }


@pytest.fixture
def pool(tmp_path: Path, entries: dict[str, ModelEntry]) -> Iterator[ModelPool]:
    settings = Settings(data_dir=tmp_path, model_max_concurrency=2)
    assert isolates(entries["qwen3-tiny-random"], settings)
    yield ModelPool(entries, settings, validate=False)


def _children() -> set[int]:
    return set(engine_pids(os.getpid()))


def _request(**fields: Any) -> SpeechRequest:
    return SpeechRequest(**{"text": "Hello there.", "voice": "vivian", **fields})


async def _speak(model: SpeechModel, request: SpeechRequest) -> bytes:
    async with await model.synthesize(request) as stream:
        return b"".join([chunk async for chunk in stream])


def test_the_engine_process_speaks_as_the_model_in_this_process(
    pool: ModelPool, tmp_path: Path, entries: dict[str, ModelEntry]
) -> None:
    thread = ModelPool(
        entries, Settings(data_dir=tmp_path, engine_isolation="thread"), validate=False
    )

    async def main() -> tuple[Any, ...]:
        model, release = await pool.acquire("qwen3-tiny-random")
        local, release_local = await thread.acquire("qwen3-tiny-random")
        try:
            assert isinstance(model, IsolatedSpeechModel) and model.pid in _children()
            assert isinstance(local, Qwen3SpeechModel)
            described = (model.sample_rate, model.streaming, local.sample_rate, local.streaming)
            voices = (await anyio.to_thread.run_sync(model.voices), local.voices())
            pcm = (await _speak(model, _request()), await _speak(local, _request()))
        finally:
            release()
            release_local()
            await pool.aclose()
            await thread.aclose()
        return described, voices, pcm

    described, voices, pcm = anyio.run(main)
    assert described == (24000, True, 24000, True)
    assert voices[0] == voices[1] and "vivian" in voices[0]
    assert len(pcm[0]) == SHORT * STEP_BYTES
    assert pcm[0] == pcm[1]  # greedy decoding: the same samples, byte for byte
    assert _children() == set()  # closed with the pool


def test_refusals_come_back_as_the_models_own(pool: ModelPool) -> None:
    async def main() -> list[tuple[SpeechErrorKind, str | None]]:
        model, release = await pool.acquire("qwen3-tiny-random")
        seen = []
        try:
            for bad in (_request(voice="nobody"), _request(language="klingon"), _request(text=" ")):
                with pytest.raises(SpeechError) as raised:
                    await model.synthesize(bad)
                seen.append((raised.value.kind, raised.value.param))
            with pytest.raises(SpeechError):  # the blocking call says the same
                await anyio.to_thread.run_sync(model.validate, _request(voice="nobody"))
        finally:
            release()
            await pool.aclose()
        return seen

    assert anyio.run(main) == [
        (SpeechErrorKind.UNKNOWN_VOICE, "voice"),
        (SpeechErrorKind.INVALID_INPUT, "language"),
        (SpeechErrorKind.INVALID_INPUT, "input"),
    ]


def test_a_reader_that_leaves_stops_the_engine_process(pool: ModelPool) -> None:
    async def main() -> tuple[float, float, int]:
        model, release = await pool.acquire("qwen3-tiny-long")
        assert isinstance(model, IsolatedSpeechModel)
        try:
            stream = await model.synthesize(_request())
            await anext(stream)
            before = cpu_seconds(model.pid)
            await anyio.sleep(0.5)
            busy = cpu_seconds(model.pid) - before  # generating: a core's worth
            await stream.aclose()  # the relay closes its connection; the child stops
            await anyio.sleep(0.3)
            before = cpu_seconds(model.pid)
            await anyio.sleep(1.0)
            idle = cpu_seconds(model.pid) - before
            # And the model is free for the next synthesis (its lock was released).
            pcm = await _speak(model, _request())
        finally:
            release()
            await pool.aclose()
        return busy, idle, len(pcm)

    busy, idle, size = anyio.run(main)
    assert busy > 0.2, busy
    assert idle < 0.1, idle  # 400 steps would take many seconds: it stopped
    assert size == LONG * STEP_BYTES


def test_a_crash_fails_the_synthesis_and_the_next_loads_again(pool: ModelPool) -> None:
    async def main() -> tuple[int, int, bool, int]:
        model, release = await pool.acquire("qwen3-tiny-long")
        assert isinstance(model, IsolatedSpeechModel)
        first = model.pid
        try:
            async with await model.synthesize(_request()) as stream:
                await anext(stream)
                os.kill(first, signal.SIGSEGV)  # as a native fault in torch would end it
                with pytest.raises(SynthesisFailed):
                    async for _ in stream:
                        pass
            alive = model.alive
        finally:
            release()
        again, release = await pool.acquire("qwen3-tiny-long")  # a fresh engine process
        try:
            assert isinstance(again, IsolatedSpeechModel)
            pcm = await _speak(again, _request())
            second = again.pid
        finally:
            release()
            await pool.aclose()
        return first, second, alive, len(pcm)

    first, second, alive, size = anyio.run(main)
    assert not alive and first != second
    assert size == LONG * STEP_BYTES


def test_a_hung_engine_process_is_killed_not_waited_for(
    pool: ModelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(isolated, "_CALL_WAIT", 1.0)

    async def main() -> int:
        model, release = await pool.acquire("qwen3-tiny-random")
        assert isinstance(model, IsolatedSpeechModel)
        try:
            os.kill(model.pid, signal.SIGSTOP)
            with pytest.raises(
                EngineCrashed, match="killed: a 'voices' call had no answer within 1 s"
            ):
                await anyio.to_thread.run_sync(model.voices)
            assert not model.alive
            return model.pid
        finally:
            release()
            await pool.aclose()

    wait_ended(anyio.run(main))


# -- over HTTP ----------------------------------------------------------------------------------


def test_a_crash_before_the_first_chunk_is_a_500_and_the_server_goes_on(
    tmp_path: Path, entries: dict[str, ModelEntry]
) -> None:
    pool = ModelPool(entries, Settings(data_dir=tmp_path, model_max_concurrency=2), validate=False)
    body = {"model": "qwen3-tiny-long", "input": "Hi.", "voice": "vivian", "response_format": "wav"}
    with run_server(provider=pool) as server:
        url = server.http + "/v1/audio/speech"
        # Loads the model in its engine process (torch's import included): seconds, more than
        # httpx's default 5 s timeout on a busy 2-core machine.
        voices = server.http + "/v1/audio/voices?model=qwen3-tiny-long"
        assert httpx.get(voices, timeout=60).is_success
        (pid,) = _children()
        result: dict[str, httpx.Response] = {}
        # A WAV is answered whole: the crash lands before any byte of the response.
        thread = threading.Thread(
            target=lambda: result.update(r=httpx.post(url, json=body, timeout=60))
        )
        thread.start()
        deadline = time.monotonic() + 30
        while server.portal.call(lambda: pool.in_use("qwen3-tiny-long")) == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.3)
        os.kill(pid, signal.SIGSEGV)
        thread.join(60)
        failed = result["r"]
        assert failed.status_code == 500, failed.text
        assert failed.json()["error"]["code"] == "server_error"
        assert httpx.get(server.http + "/healthz").status_code == 200
        assert server.portal.call(lambda: pool.in_use("qwen3-tiny-long")) == 0
        short = {**body, "model": "qwen3-tiny-random"}
        fine = httpx.post(url, json=short, timeout=60)
        assert fine.status_code == 200 and fine.content.startswith(b"RIFF")
        assert pid not in _children()


def test_voices_of_a_model_whose_engine_died_idle_are_asked_of_a_new_one(
    tmp_path: Path, entries: dict[str, ModelEntry]
) -> None:
    # The pool still holds the dead engine (nothing asked it since): /v1/audio/voices used
    # to call it and drop the connection without a response.
    pool = ModelPool(entries, Settings(data_dir=tmp_path, model_max_concurrency=2), validate=False)
    with run_server(provider=pool) as server:
        voices = server.http + "/v1/audio/voices?model=qwen3-tiny-long"
        first = httpx.get(voices, timeout=60)
        assert first.is_success
        (pid,) = _children()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while pid in _children():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        again = httpx.get(voices, timeout=60)
        assert again.status_code == 200, again.text
        assert again.json() == first.json()
        assert pid not in _children() and len(_children()) == 1
