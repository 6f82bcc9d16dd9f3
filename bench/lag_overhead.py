"""CPU per decode round that lag accounting (talkies/engines/runtime/lag.py) adds to a stream.

One process per run, alternating: ``lag``, the runtime as shipped, and its peer ``no-lag``,
the same runtime with the lag accounting patched out (the meter a no-op, no clock read for it,
results not stamped, no histogram). A stream of ``--frames`` 20 ms frames goes through
``ThreadedStream`` (an echo recognition: one partial per ``accept``, so a round per frame and
a result per round, the worst case for per-result work) and every result through a
``StreamSession`` to its JSON, as the server's driver does; the CPU time of the process
(``time.process_time``, both threads) per frame is reported, median of ``--runs`` each, and
the ratio.

    PYTHONPATH=. .venv/bin/python bench/lag_overhead.py [--frames 20000] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import timeit
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any


class _Echo:
    def __init__(self) -> None:
        self.n = 0

    def accept(self, pcm: bytes) -> Sequence[Any]:
        from talkies.protocol import EnginePartial

        self.n += 1
        return [EnginePartial(text=str(self.n))]

    def finish(self) -> Any:
        from talkies.protocol import EngineFinal

        return EngineFinal(text="")

    def close(self) -> None:
        return None


class _NoMeter:
    def received(self, size: int, now: float) -> None:
        return None

    def claimed(self, size: int) -> None:
        return None

    def settled(self, more: bool, now: float) -> float:
        return 0.0

    def lag(self, now: float) -> float:
        return 0.0


def _settle_without_lag(self: Any, work: Any) -> None:
    """``ThreadedStream.settle`` as it was before lag accounting (commit b548f95)."""
    from talkies.protocol import EngineFailed, EngineFinal

    self.busy = False
    self.more = work.more
    if any(isinstance(e, EngineFinal | EngineFailed) for e in work.events):
        self.ended = True
        self.more = False
    self._outbox.extend(work.events)
    self._idle.set()
    if work.events or self._closed:
        listener = self._listener
        if listener is not None and not self._closed and listener(self._outbox):
            return
        self._signal.set()


def _patch_out_lag() -> None:
    from talkies.engines.runtime import rounds, schedule

    rounds.LagMeter = _NoMeter  # type: ignore[assignment,misc]
    rounds.time = SimpleNamespace(monotonic=lambda: 0.0)  # type: ignore[assignment]
    rounds.ThreadedStream.settle = _settle_without_lag  # type: ignore[method-assign]
    schedule.RoundScheduler._observe_lag = lambda self: None  # type: ignore[method-assign]


def _one(variant: str, frames: int) -> float:
    import anyio

    if variant == "no-lag":
        _patch_out_lag()
    from talkies.engines.runtime.rounds import DecodeRounds, ThreadedStream
    from talkies.protocol import EngineOpened, Send, StreamSession, TextReceived

    start = {"type": "start", "model": "m", "encoding": "pcm_s16le"}
    start |= {"sample_rate": 16000, "channels": 1}

    async def main() -> float:
        session = StreamSession(now=0.0)
        session.handle(TextReceived(data=json.dumps(start)), now=0.0)
        session.handle(EngineOpened(), now=0.0)
        session.pull_actions()
        rounds = DecodeRounds(parallel=1)
        rounds.label = "bench"
        stream = ThreadedStream(_Echo(), max_buffered_bytes=64000, rounds=rounds)
        frame = bytes(640)
        began = time.process_time()
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                async for event in stream.events():
                    session.handle(event, now=1.0)
                    for action in session.pull_actions():
                        if isinstance(action, Send):
                            action.event.to_json()

            tg.start_soon(consume)
            for _ in range(frames):
                await stream.feed(frame)
                await anyio.sleep(0)
            await stream.flush()
        took = time.process_time() - began
        await stream.aclose()
        return took / frames * 1e6

    return float(anyio.run(main))


def _added_work_setup() -> Any:
    from talkies.engines.runtime.lag import LagMeter
    from talkies.metrics import STREAM_LAG_SECONDS
    from talkies.protocol import EnginePartial, LagRecord
    from talkies.protocol.lag import clean_lag

    meter, record, histogram = LagMeter(), LagRecord(), STREAM_LAG_SECONDS.labels("bench")
    event = EnginePartial(text="12")
    clock = [0.0]

    def work() -> None:
        """What lag accounting does per 20 ms frame decoded in a round of its own."""
        clock[0] += 0.02
        meter.received(640, clock[0])
        meter.claimed(640)
        lag = meter.settled(False, clock[0] + 0.001)
        type(event)(text=event.text, words=event.words, lag=lag)
        histogram.observe(lag)
        seconds = clean_lag(lag)
        assert seconds is not None
        record.add(seconds)

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--one", choices=["lag", "no-lag"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(_one(args.one, args.frames))
        return
    results: dict[str, list[float]] = {"lag": [], "no-lag": []}
    for _ in range(args.runs):
        for variant, values in results.items():
            out = subprocess.run(
                [sys.executable, __file__, "--one", variant, "--frames", str(args.frames)],
                check=True,
                capture_output=True,
                text=True,
            )
            values.append(float(out.stdout))
    for variant, values in results.items():
        shown = ", ".join(f"{v:.1f}" for v in values)
        middle, least = statistics.median(values), min(values)
        print(f"{variant:7} median {middle:6.1f}  min {least:6.1f} us/frame  ({shown})")
    for name, pick in (("median", statistics.median), ("min", min)):
        lag, peer = pick(results["lag"]), pick(results["no-lag"])
        print(
            f"lag / no-lag, {name}s: {lag / peer:.3f}  ({lag - peer:+.1f} us per frame and result)"
        )
    # The added work alone, timed in this process (the least of several repeats: the figure
    # least disturbed by other load on the machine).
    added = min(timeit.repeat(_added_work_setup(), number=20000, repeat=9)) / 20000 * 1e6
    print(f"the added work alone: {added:.2f} us per frame and result")


if __name__ == "__main__":
    main()
