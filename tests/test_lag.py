"""Lag arithmetic (issue 24, point 5): the runtime's meter and gate, the session's record and
its extension fields, the setting and the registry field. No clocks: every time is given."""

from __future__ import annotations

import math
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from talkies.config import ConfigError, Settings
from talkies.engines.base import Refusal, RefusalKind
from talkies.engines.runtime.lag import RECOVER, LagGate, LagMeter, lag_detail
from talkies.engines.runtime.rounds import DecodeRounds, ThreadedStream
from talkies.engines.supply.registry import entry_from_json
from talkies.protocol import (
    EngineEndpoint,
    EngineFinal,
    EngineOpened,
    EnginePartial,
    Final,
    LagRecord,
    Partial,
    Send,
    SessionLimits,
    Stats,
    StreamSession,
    TextReceived,
)
from talkies.protocol.lag import clean_lag

from .fake_engine import Behaviour, EnergyRecognition, speech
from .fake_engine import Stats as EngineStats
from .lag_engine import LaggingRecognition
from .wire import START

SECOND = 32000  # bytes of 16 kHz PCM16


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# -- the runtime's meter ----------------------------------------------------------------------


def test_real_time_client_lag_is_the_audio_that_came_while_the_round_ran() -> None:
    meter = LagMeter()
    meter.received(SECOND // 2, now=0.5)  # 0.5 s of audio at t = 0.5
    meter.claimed(SECOND // 2)  # a round takes it, and runs 0.5 s
    for i in range(1, 26):  # 20 ms frames come meanwhile
        meter.received(640, now=0.5 + i * 0.02)
    assert meter.lag(now=1.0) == pytest.approx(0.5)  # (1 s of audio, the oldest 0.5 s old)
    assert meter.settled(more=False, now=1.0) == pytest.approx(0.48)  # what came meanwhile
    meter.claimed(25 * 640)
    assert meter.settled(more=False, now=1.1) == 0.0  # all answered


def test_a_fast_client_is_not_lag() -> None:
    """10 s of audio sent at once: a backlog of audio, but only as old as it is."""
    meter = LagMeter()
    meter.received(10 * SECOND, now=100.0)
    assert meter.lag(now=100.0) == 0.0
    assert meter.lag(now=100.25) == pytest.approx(0.25)
    meter.claimed(5 * SECOND)
    assert meter.settled(more=False, now=100.5) == pytest.approx(0.5)  # the rest, 0.5 s old


def test_a_decoder_that_holds_audio_back_has_not_answered_it() -> None:
    meter = LagMeter()
    meter.received(SECOND, now=0.0)
    meter.claimed(SECOND)
    assert meter.settled(more=True, now=0.3) == pytest.approx(0.3)  # (Work.more: a backlog)
    assert meter.settled(more=False, now=0.4) == 0.0


def test_given_back_work_is_unanswered_again() -> None:
    meter = LagMeter()
    meter.received(SECOND, now=0.0)
    meter.claimed(SECOND)
    meter.claimed(-SECOND)  # its round was given up before its turn
    assert meter.settled(more=False, now=0.2) == pytest.approx(0.2)
    meter.claimed(SECOND)
    assert meter.settled(more=False, now=0.3) == 0.0


def test_arrivals_are_bounded_and_never_understate_the_age() -> None:
    meter = LagMeter()
    for i in range(100_000):  # 2-byte frames, 1 ms apart: a hostile client
        meter.received(2, now=i * 0.001)
    assert len(meter._arrivals) <= 512
    assert meter.lag(now=100.0) == pytest.approx(200_000 / SECOND)  # 6.25 s, from t = 0
    meter.claimed(100_000)  # half of it answered: the rest came from t = 50 s on
    assert meter.settled(more=False, now=100.0) == pytest.approx(100_000 / SECOND)
    oldest = meter._arrivals[0][1]
    assert 50.0 - 0.5 <= oldest <= 50.0  # never younger than it is, at most a marker older


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["receive", "claim", "give_back", "settle", "settle_more"]),
            st.integers(1, 20_000),
            st.floats(0, 2),
        ),
        max_size=60,
    )
)
def test_the_lag_is_never_more_than_the_audio_nor_its_age(
    steps: list[tuple[str, int, float]],
) -> None:
    meter = LagMeter()
    now, received, claimed, first = 0.0, 0, 0, None
    for op, odd_size, gap in steps:
        now += gap
        size = odd_size - odd_size % 2
        if op == "receive" and size:
            meter.received(size, now)
            received += size
            first = now if first is None else first
        elif op == "claim" and claimed + size <= received:
            meter.claimed(size)
            claimed += size
        elif op == "give_back" and size <= claimed:
            meter.claimed(-size)
            claimed -= size
        elif op.startswith("settle"):
            meter.settled(more=op == "settle_more", now=now)
        lag = meter.lag(now)
        assert 0.0 <= lag <= received / SECOND + 1e-9
        assert lag <= (now - first if first is not None else 0.0) + 1e-9


# -- the model's gate -------------------------------------------------------------------------


def test_the_gate_has_hysteresis() -> None:
    gate = LagGate(bound=2.0)
    assert [gate.check(x) for x in (1.0, 2.0, 2.1, 1.5, 1.01, RECOVER * 2.0, 1.5, 2.5)] == [
        False,
        False,
        True,
        True,  # under the bound, not yet caught up
        True,
        False,  # at half of it
        False,
        True,
    ]


def test_a_gate_of_zero_never_refuses() -> None:
    gate = LagGate(bound=0.0)
    assert not gate.check(1e9)


def test_the_detail_names_the_model_the_lag_and_the_bound() -> None:
    detail = lag_detail("vosk-ko", 4.26, 3.0)
    assert "'vosk-ko'" in detail and "4.3 s behind" in detail and "3 s" in detail


# -- the runtime: streams stamp their results, the model refuses ---------------------------------


async def _results(stream: ThreadedStream) -> list[Any]:
    out = []
    async for event in stream.events():
        out.append(event)
    return out


@pytest.mark.anyio
async def test_results_carry_the_lag_and_a_lagging_model_refuses() -> None:
    """A decoder 2.5 times slower than real time, fed in real time (times scaled down)."""
    rounds = DecodeRounds(parallel=1)
    rounds.label = "lagging-test"
    rounds.max_lag = 0.05
    stream = await rounds.open(lambda: LaggingRecognition(2.5), max_buffered_bytes=5 * SECOND)
    chunk = speech(0.02)
    async with anyio.create_task_group() as tg:
        results: list[Any] = []

        async def collect() -> None:
            results.extend(await _results(stream))

        tg.start_soon(collect)
        refused: Refusal | None = None
        for _ in range(40):  # 0.8 s of audio in real time
            await stream.feed(chunk)
            await anyio.sleep(0.02)
            if refused is None and rounds.lagging() is not None:
                with pytest.raises(Refusal) as caught:
                    await rounds.open(
                        lambda: LaggingRecognition(1.0), max_buffered_bytes=5 * SECOND
                    )
                refused = caught.value
        await stream.flush()
    assert refused is not None and refused.kind is RefusalKind.CONNECTION_LIMIT
    assert "'lagging-test' cannot keep its streams real time" in refused.detail
    lags = [e.lag for e in results]
    assert all(isinstance(x, float) and x >= 0 for x in lags), results
    assert max(lags) > 0.05 and isinstance(results[-1], EngineFinal) and lags[-1] == 0.0
    await stream.aclose()
    assert rounds.lagging() is None and rounds.lag() == 0.0  # no stream: caught up
    again = await rounds.open(lambda: LaggingRecognition(1.0), max_buffered_bytes=SECOND)
    await again.aclose()


@pytest.mark.anyio
async def test_a_model_without_a_bound_never_refuses() -> None:
    rounds = DecodeRounds(parallel=1)
    stream = await rounds.open(
        lambda: EnergyRecognition(Behaviour(delay=0.2), EngineStats()), max_buffered_bytes=SECOND
    )
    await stream.feed(speech(0.3))
    await anyio.sleep(0.1)
    assert rounds.max_lag == 0.0 and rounds.lagging() is None
    other = await rounds.open(
        lambda: EnergyRecognition(Behaviour(), EngineStats()), max_buffered_bytes=SECOND
    )
    await other.aclose()
    await stream.aclose()


# -- the session: the extension fields ------------------------------------------------------------


def _streaming(**start: Any) -> StreamSession:
    import json

    session = StreamSession(SessionLimits(), now=0.0)
    session.handle(TextReceived(data=json.dumps({**START, **start})), now=0.0)
    session.handle(EngineOpened(), now=0.0)
    session.pull_actions()
    return session


def _sent(session: StreamSession) -> list[Any]:
    return [a.event for a in session.pull_actions() if isinstance(a, Send)]


def test_transcript_events_carry_the_lag_and_stats_its_percentiles() -> None:
    session = _streaming()
    session.handle(EnginePartial(text="a", lag=0.1234), now=1.0)
    session.handle(EnginePartial(text="a", lag=0.9), now=1.0)  # unchanged: counted, not sent
    session.handle(EngineEndpoint(text="a b", lag=0.2), now=1.0)
    session.handle(TextReceived(data='{"type":"end"}'), now=1.0)
    events = _sent(session)
    session.handle(EngineFinal(text="c", lag=0.0), now=2.0)
    events += _sent(session)
    assert isinstance(events[0], Partial) and events[0].to_dict()["lag"] == 0.123
    assert events[1].to_dict()["lag"] == 0.2
    final, stats = events[-2:]
    assert isinstance(final, Final) and final.to_dict()["lag"] == 0.0
    assert isinstance(stats, Stats)
    assert stats.to_dict()["lag"] == {"p50": 0.12, "p90": 0.9, "p99": 0.9, "max": 0.9, "results": 4}
    assert [k for k in stats.to_dict() if k != "lag"] == [
        "type",
        "audio_seconds",
        "frames",
        "canceled",
    ]


def test_without_a_lag_the_events_are_the_spec_s_own() -> None:
    session = _streaming()
    session.handle(EnginePartial(text="a"), now=1.0)
    session.handle(TextReceived(data='{"type":"cancel"}'), now=1.0)
    partial, stats = _sent(session)
    assert "lag" not in partial.to_dict() and "lag" not in stats.to_dict()
    assert stats.to_dict() == {"type": "stats", "audio_seconds": 0.0, "frames": 0, "canceled": True}


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "0.5"])
def test_a_lag_that_is_not_a_number_is_dropped(bad: Any) -> None:
    session = _streaming()
    session.handle(EnginePartial(text="a", lag=bad), now=1.0)
    (partial,) = _sent(session)
    assert "lag" not in partial.to_dict() and session.lag.count == 0


def test_a_negative_lag_is_zero() -> None:
    assert clean_lag(-0.5) == 0.0 and clean_lag(None) is None and clean_lag(1.23456) == 1.235


def test_a_cancel_reports_the_lag_so_far() -> None:
    session = _streaming(interim_results=False)
    session.handle(EnginePartial(text="a", lag=0.3), now=1.0)
    session.handle(TextReceived(data='{"type":"cancel"}'), now=1.0)
    (stats,) = _sent(session)
    assert stats.to_dict()["lag"]["max"] == 0.3 and stats.to_dict()["lag"]["results"] == 1


@given(st.lists(st.floats(0, 20_000, allow_nan=False), min_size=1, max_size=300))
def test_percentiles_are_ordered_and_close_to_the_exact_ones(values: list[float]) -> None:
    record = LagRecord()
    cleaned = [clean_lag(v) for v in values]
    for v in cleaned:
        assert v is not None
        record.add(v)
    summary = record.summary()
    assert summary is not None and summary.results == len(values)
    assert 0 <= summary.p50 <= summary.p90 <= summary.p99 <= summary.max == max(cleaned)  # type: ignore[type-var]
    ordered = sorted(v for v in cleaned if v is not None)
    for q, got in ((0.5, summary.p50), (0.9, summary.p90), (0.99, summary.p99)):
        exact = ordered[max(1, math.ceil(q * len(ordered))) - 1]
        # Two significant digits above 0.1 s (5% either way), the millisecond below.
        assert abs(got - exact) <= max(0.0011, 0.051 * exact), (q, got, exact)
    assert len(record._counts) <= 100 + 90 * 6  # bounded, however long the stream


# -- the setting and the registry field -----------------------------------------------------------


def test_the_setting() -> None:
    assert Settings().stream_max_lag == 3.0
    assert Settings.from_env({"TALKIES_STREAM_MAX_LAG": "1500ms"}).stream_max_lag == 1.5
    assert Settings.from_env({"TALKIES_STREAM_MAX_LAG": "0"}).max_lag_for(None) == 0.0
    with pytest.raises(ConfigError, match="TALKIES_STREAM_MAX_LAG"):
        Settings.from_env({"TALKIES_STREAM_MAX_LAG": "-1"})
    # An entry's own bound wins; either is lowered to 80% of the stream buffer.
    settings = Settings(stream_max_lag=2.0, stream_max_buffer_seconds=5.0)
    assert settings.max_lag_for(None) == 2.0 and settings.max_lag_for(0.5) == 0.5
    assert settings.max_lag_for(10.0) == 4.0 and settings.max_lag_for(0.0) == 0.0


def test_the_registry_field(tmp_path: Any) -> None:
    entry, problems = entry_from_json(
        "m", {"executor": "vosk", "path": ".", "max_lag": 1.5}, tmp_path
    )
    assert not problems and entry is not None and entry.max_lag == 1.5
    _, problems = entry_from_json("m", {"executor": "vosk", "path": ".", "max_lag": -1}, tmp_path)
    assert problems == ["model 'm': max_lag must be a number of seconds from 0 to 3600"]
    _, problems = entry_from_json("m", {"executor": "vosk", "max_lag": "1"}, tmp_path)
    assert problems == ["model 'm': field 'max_lag' has the wrong JSON type"]
