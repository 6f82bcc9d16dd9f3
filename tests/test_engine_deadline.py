"""The decode deadline of the engine runtime (talkies/engines/runtime/, TALKIES_DECODE_TIMEOUT).

A decode call that does not return in time fails its stream (EngineFailed: 4500 for the
client), frees it at once, and leaves its recognition to the hung thread, which closes it when
the call returns; the model's other streams keep decoding meanwhile.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from talkies.config import ConfigError, Settings
from talkies.engines.base import EngineEvent, EngineLost, EngineStream
from talkies.engines.pool import ModelPool
from talkies.engines.runtime.rounds import DEFAULT_DECODE_TIMEOUT, DecodeRounds
from talkies.engines.supply.registry import ModelEntry
from talkies.protocol import EngineFailed, EngineFinal
from talkies.protocol.messages import StartOptions

from .conftest import run_server
from .fake_engine import Behaviour, EnergyRecognition, Stats, speech
from .fault_engines import HangModel, RaiseModel
from .wire import drain, open_stream

pytestmark = pytest.mark.anyio

OPTIONS = StartOptions(model="hang-test")
WORD = speech(0.25)  # one word of the energy recognizer


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def hang() -> Iterator[HangModel]:
    model = HangModel(after=len(WORD))  # the first call decodes, the second one blocks
    model.rounds.timeout = 0.3
    yield model
    model.release.set()  # never leave a thread blocked behind a test


async def _events(stream: EngineStream, timeout: float = 5.0) -> list[EngineEvent]:
    out: list[EngineEvent] = []
    with anyio.fail_after(timeout):
        async for event in stream.events():
            out.append(event)
    return out


async def _wait_for(condition: object, timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():  # type: ignore[operator]
            await anyio.sleep(0.01)


def _send(ws: Any, pcm: bytes) -> None:
    for i in range(0, len(pcm), 4000):  # run_server's frame limit is 4096 bytes
        ws.send(pcm[i : i + 4000])


def test_the_default_and_the_setting() -> None:
    assert DEFAULT_DECODE_TIMEOUT == Settings().decode_timeout == 30.0
    assert DecodeRounds().timeout == 30.0
    assert Settings.from_env({"TALKIES_DECODE_TIMEOUT": "2s"}).decode_timeout == 2.0
    assert Settings.from_env({"TALKIES_DECODE_TIMEOUT": "1m"}).decode_timeout == 60.0
    for bad in ("0.5", "2h", "-1", "soon"):
        with pytest.raises(ConfigError, match="TALKIES_DECODE_TIMEOUT"):
            Settings.from_env({"TALKIES_DECODE_TIMEOUT": bad})


async def test_a_hung_call_fails_its_stream_at_the_deadline(hang: HangModel) -> None:
    stream = await hang.open_stream(OPTIONS, max_buffered_bytes=64000)
    await stream.feed(WORD)
    await stream.feed(WORD)  # blocks in the decoder
    await stream.flush()
    started = time.monotonic()
    events = await _events(stream)
    took = time.monotonic() - started
    assert isinstance(events[-1], EngineFailed)
    assert events[-1].detail == "the speech engine did not answer within 0.3 s"
    assert 0.25 <= took < 1.5, took
    assert hang.rounds.abandoned == 1
    # Closing does not wait for the hung thread, and leaves the recognition to it.
    with anyio.fail_after(1):
        await stream.aclose()
    assert hang.stats.closed == 0 and hang.stats.hung == 1
    hang.release.set()
    await _wait_for(lambda: hang.stats.closed == 1)
    assert hang.stats.log == ["call 1", "call 1", "hang 1", "return 1", "close 1"]  # no finish
    assert hang.stats.closed_before_return == 0
    await anyio.sleep(0.1)
    assert hang.stats.calls_after_return == 0 and hang.stats.closed == 1  # never used again


async def test_a_stream_closed_while_hung_is_released_at_the_deadline(hang: HangModel) -> None:
    stream = await hang.open_stream(OPTIONS, max_buffered_bytes=64000)
    await stream.feed(WORD + WORD)
    await stream.feed(WORD)
    await _wait_for(lambda: hang.stats.hung == 1)
    started = time.monotonic()
    with anyio.fail_after(2):
        await stream.aclose()  # waits for the call, but no longer than the deadline
    assert time.monotonic() - started < 1.0
    assert hang.stats.closed == 0
    hang.release.set()
    await _wait_for(lambda: hang.stats.closed == 1)


async def test_the_models_other_streams_keep_decoding(hang: HangModel) -> None:
    hang.rounds.parallel = 1  # one round at a time: the hung one must not hold the others up
    hang.rounds.timeout = 0.5
    stuck = await hang.open_stream(OPTIONS, max_buffered_bytes=64000)
    await stuck.feed(WORD)
    await stuck.feed(WORD)
    await _wait_for(lambda: hang.stats.hung == 1)
    hang.after = 10**9  # streams opened from now on never block
    others = [await hang.open_stream(OPTIONS, max_buffered_bytes=64000) for _ in range(3)]
    for other in others:
        await other.feed(WORD + WORD)
        await other.flush()
    results = [await _events(other) for other in others]
    for events in results:
        assert isinstance(events[-1], EngineFinal) and events[-1].text == "w1 w2"
    assert isinstance((await _events(stuck))[-1], EngineFailed)
    for stream in [stuck, *others]:
        await stream.aclose()
    hang.release.set()
    await _wait_for(lambda: hang.stats.closed == 4)
    assert hang.stats.closed_before_return == hang.stats.calls_after_return == 0


async def test_the_rest_of_a_hung_round_gets_its_results_or_its_work_back() -> None:
    """One round, three streams decoded one by one: the first call returns, the second hangs,
    the third was not reached. Only the second stream fails; the first keeps its results, the
    third's audio is decoded in the next round."""
    model = HangModel(only={2})
    model.rounds.parallel = 1
    model.rounds.timeout = 0.5
    try:
        # A slow stream holds the one round thread while the three others queue behind it,
        # so the next round takes them together, in this order.
        slow = await model.rounds.open(
            lambda: EnergyRecognition(Behaviour(delay=0.3), Stats()), max_buffered_bytes=64000
        )
        await slow.feed(WORD)
        streams = [await model.open_stream(OPTIONS, max_buffered_bytes=64000) for _ in range(3)]
        for stream in streams:
            await stream.feed(WORD)
        await slow.flush()
        assert isinstance((await _events(slow))[-1], EngineFinal)
        await _wait_for(lambda: model.rounds.abandoned == 1)
        assert model.stats.log[:3] == ["call 1", "call 2", "hang 2"]  # 3: not reached
        for stream in streams:
            await stream.flush()
        first, hung, third = [await _events(s) for s in streams]
    finally:
        model.release.set()
    assert [type(e).__name__ for e in first] == ["EnginePartial", "EngineFinal"]
    assert isinstance(hung[-1], EngineFailed)
    assert [type(e).__name__ for e in third] == ["EnginePartial", "EngineFinal"]
    await slow.aclose()
    for stream in streams:
        await stream.aclose()
    await _wait_for(lambda: model.stats.closed == 3)
    assert model.stats.closed_before_return == model.stats.calls_after_return == 0


async def test_an_engine_that_raises_is_4500_and_its_slot_is_freed() -> None:
    model = RaiseModel(after=len(WORD))
    entry = ModelEntry(slug="raise-test", executor="vosk", path=Path("."))
    pool = ModelPool(
        {"raise-test": entry},
        Settings(model_max_concurrency=1),
        loader=lambda *_: model,
        validate=False,
    )
    with run_server(provider=pool) as server:
        for _ in range(2):  # the second stream gets the slot the first one freed
            ws = open_stream(server.url, model="raise-test")
            _send(ws, WORD)
            assert json.loads(ws.recv(timeout=5))["text"] == "w1"
            _send(ws, WORD)  # the next call raises
            events, code, _ = drain(ws)
            assert code == 4500 and events == [
                {
                    "type": "error",
                    "code": "server_error",
                    "detail": "the speech engine failed while decoding",
                }
            ], events
        server.wait_idle()
        assert pool.in_use("raise-test") == 0 and pool.pinned is None
        assert model.stats.opened == model.stats.closed == 2


def test_an_engine_that_ended_says_so() -> None:
    """A decode call that finds its engine gone (EngineLost, e.g. its process was killed)
    tells the stream how it ended, not just that decoding failed."""
    model = RaiseModel(after=len(WORD))
    model.raises = EngineLost("the engine process of model 'raise-test' was killed by SIGKILL")
    entry = ModelEntry(slug="raise-test", executor="vosk", path=Path("."))
    pool = ModelPool({"raise-test": entry}, Settings(), loader=lambda *_: model, validate=False)
    with run_server(provider=pool) as server:
        ws = open_stream(server.url, model="raise-test")
        _send(ws, WORD)
        assert json.loads(ws.recv(timeout=5))["text"] == "w1"
        _send(ws, WORD)
        events, code, _ = drain(ws)
        assert code == 4500 and events[-1]["detail"] == str(model.raises), events
        server.wait_idle()
        assert pool.in_use("raise-test") == 0


@pytest.mark.parametrize(
    ("setting", "own"), [(1.0, None), (30.0, 1.0)], ids=["the-setting", "the-entrys-own"]
)
def test_a_hung_engine_is_4500_at_the_deadline_and_its_slot_is_freed(
    setting: float, own: float | None
) -> None:
    """The deadline is TALKIES_DECODE_TIMEOUT, or the model entry's ``decode_timeout``."""
    model = HangModel(after=len(WORD))
    entry = ModelEntry(slug="hang-test", executor="vosk", path=Path("."), decode_timeout=own)
    pool = ModelPool(
        {"hang-test": entry},
        Settings(model_max_concurrency=1, decode_timeout=setting),
        loader=lambda *_: model,
        validate=False,
    )
    try:
        with run_server(provider=pool) as server:
            ws = open_stream(server.url, model="hang-test")
            _send(ws, WORD)
            assert json.loads(ws.recv(timeout=5))["text"] == "w1"
            _send(ws, WORD)  # the next call hangs
            started = time.monotonic()
            events, code, _ = drain(ws)
            took = time.monotonic() - started
            assert code == 4500 and events[-1] == {
                "type": "error",
                "code": "server_error",
                "detail": "the speech engine did not answer within 1 s",
            }
            assert 0.9 <= took < 3.0, took
            server.wait_idle()
            assert pool.in_use("hang-test") == 0 and pool.pinned is None
            # The model's one slot is free: a next stream is served while the thread hangs.
            model.after = 10**9
            ws = open_stream(server.url, model="hang-test")
            _send(ws, WORD)
            ws.send(json.dumps({"type": "end"}))
            events, code, _ = drain(ws)
            assert code == 1000 and events[-2]["text"] == "w1", events
            assert model.stats.closed == 1 and model.stats.hung == 1  # the hung one: not yet
    finally:
        model.release.set()
    deadline = time.monotonic() + 5
    while model.stats.closed < 2:
        assert time.monotonic() < deadline, model.stats
        time.sleep(0.01)
    assert model.stats.closed_before_return == model.stats.calls_after_return == 0
