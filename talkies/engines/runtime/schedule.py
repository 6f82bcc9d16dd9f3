"""A model's decode rounds, scheduled on the event loop (:mod:`talkies.engines.runtime`).

:class:`RoundScheduler` decides when a round starts and which streams it takes: at once, spaced
while decoding is cheaper than a thread hop, gathered for a batched decoder, shared between
free round threads once decoding is dear. It sees a stream only through :class:`Member`, the
side of a stream the rounds use (:class:`~talkies.engines.runtime.rounds.ThreadedStream`
implements it), and hands rounds to :mod:`.threads`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, Protocol

import anyio.lowlevel

from ...metrics import DECODE_ROUND_SECONDS, STREAM_LAG_SECONDS, track_lag
from ..base import Work
from .lag import LagGate
from .loop import Callback, Wake, ignore, later
from .threads import InFlight, Round, RoundThreads

__all__ = ["DEFAULT_DECODE_TIMEOUT", "Member", "RoundScheduler"]

log = logging.getLogger("talkies.engines")

# How long one decode call may take before its streams fail (TALKIES_DECODE_TIMEOUT).
DEFAULT_DECODE_TIMEOUT = 30.0

# Decoding time per stream per round above which the ready streams are shared between the
# free round threads rather than given to one: a thread hop costs ~50 us, so a null engine
# (the transport benchmarks) keeps one hop per round, while real decoders use every core.
_SPLIT_SECONDS = 0.001
# The least time between two round starts of a model whose decoding costs less than that
# (0.5 ms cost 1.1-1.4x the bare loop's CPU per paced frame, 0.9 ms 0.9-1.05x: bench/README.md).
_MIN_GAP = 0.0009
# A round of such a model that has run this long is slow: another may start beside it.
_SLOW_ROUND = 0.02


class Member(Protocol):
    """A stream as its model's rounds see it: all on the event loop.

    ``queued``: in the ready list; ``busy``: inside a round; ``ended``: a final or failure was
    produced; ``more``: its decoder holds decodable input (``Work.more``); ``wake_loop``
    schedules a callback on the stream's event loop from any thread.
    """

    queued: bool
    busy: bool
    ended: bool
    more: bool
    wake_loop: Wake

    def token(self) -> anyio.lowlevel.EventLoopToken:
        """The event loop the stream is used from."""
        ...

    def has_work(self) -> bool:
        """Audio queued, the end of its input not yet handed over, or a decoder backlog."""
        ...

    def claim(self) -> Work | None:
        """Leave the ready list; this round's work, if there still is some."""
        ...

    def settle(self, work: Work) -> None:
        """The round is over: its results."""
        ...

    def give_up(self, detail: str) -> None:
        """Its decode call passed the deadline: fail; the hung thread keeps its decoder."""
        ...

    def fail(self, detail: str) -> None:
        """Its engine is gone: fail now unless a round has it or it has ended."""
        ...

    def give_back(self, work: Work) -> None:
        """Its round was given up before its turn: the work goes back to its queue."""
        ...

    def lag(self, now: float) -> float:
        """Seconds its decoder is behind the audio it received (:mod:`.lag`)."""
        ...


class RoundScheduler:
    """The worker-thread rounds of one model: at most ``parallel`` at a time.

    Everything but the decoding itself happens on the event loop, in callbacks.
    """

    def __init__(
        self,
        parallel: int | None = None,
        *,
        gather: float = 0.0,
        timeout: float = DEFAULT_DECODE_TIMEOUT,
    ) -> None:
        self.parallel = max(1, parallel if parallel is not None else (os.cpu_count() or 1))
        self.gather = max(0.0, gather)
        # The rounds in flight, and the deadline check over them.
        self._flight: InFlight[Member] = InFlight(self._abandon, timeout)
        self._threads = RoundThreads("engine-round")
        self._ready: deque[Member] = deque()
        self._running = 0
        self._open: set[Member] = set()
        self._gathering: Callback | None = None  # cancels the pending gather timer
        self._gather_until = 0.0
        self._last_start = 0.0  # when the last round started (or will: see _spaced)
        self._due: Round[Member] | None = None  # a round waiting for its gap, that streams may join
        self._stream_seconds = 0.0  # recent decoding time per stream and round
        self.rounds = 0  # rounds run, for tests and benchmarks
        self.abandoned = 0  # rounds given up at the deadline, for tests
        self.label = ""  # the model's slug: the ``model`` label of the round-time histogram
        self.wake_any: Wake = ignore  # schedules on the streams' event loop (fail_all)
        self._gate = LagGate()  # lagging: new streams refused (max_lag, :mod:`.lag`)
        self._round_lag = 0.0  # the worst lag the streams of the round ending had
        self._lag_histogram: tuple[str, Any] | None = None  # (label, its histogram child)
        track_lag(self)  # the lag gauges of /metrics

    @property
    def max_lag(self) -> float:
        """Seconds of lag over which new streams are refused (TALKIES_STREAM_MAX_LAG, or the
        entry's ``max_lag``; the load pipeline sets it). 0: never."""
        return self._gate.bound

    @max_lag.setter
    def max_lag(self, seconds: float) -> None:
        self._gate.bound = seconds

    def lag(self, now: float | None = None) -> float:
        """The model's lag: the worst current lag of its open streams (0 with none)."""
        at = time.monotonic() if now is None else now
        return max((stream.lag(at) for stream in list(self._open)), default=0.0)

    def lagging(self) -> float | None:
        """Event loop: the model's lag if it is lagging (new streams are refused), else
        None. Hysteresis: it stops at half the bound (:class:`~.lag.LagGate`)."""
        gate = self._gate
        if gate.bound <= 0:
            return None
        lag = self.lag()
        return lag if gate.check(lag) else None

    def lag_state(self) -> tuple[float, bool]:
        """(the model's lag now, whether it was lagging when last checked), for the gauges:
        read from any thread, it decides nothing."""
        return self.lag(), self._gate.lagging

    def note_lag(self, lag: float) -> None:
        """A stream's share of a round ended with its decoder ``lag`` seconds behind: the
        round's worst goes into the histogram when the round ends (once per round, not per
        stream: an observation costs a lock and a search)."""
        self._round_lag = max(self._round_lag, lag)

    def _observe_lag(self) -> None:
        lag, self._round_lag = self._round_lag, 0.0
        cached = self._lag_histogram
        if cached is None or cached[0] != self.label:
            cached = self._lag_histogram = (self.label, STREAM_LAG_SECONDS.labels(self.label))
        cached[1].observe(lag)

    @property
    def timeout(self) -> float:
        """Seconds one decode call may take (TALKIES_DECODE_TIMEOUT; the pool sets it)."""
        return self._flight.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._flight.timeout = seconds

    def register(self, stream: Member) -> None:
        """A stream of this model was opened (it leaves by :meth:`forget`)."""
        self._open.add(stream)

    @property
    def open_streams(self) -> int:
        """Streams opened and not yet closed."""
        return len(self._open)

    # -- event loop callbacks -------------------------------------------------------------------

    def _enqueue(self, stream: Member) -> bool:
        """Put ``stream`` in the ready list if it has work; whether it is there now."""
        if stream.queued:
            return True
        if stream.busy or not stream.has_work():
            return False
        stream.queued = True
        self._ready.append(stream)
        return True

    def fail_all(self, detail: str) -> None:
        """Fail every open stream of the model that is not inside a round (those fail by their
        call): their engine is gone (an engine process that ended, isolation/). Thread-safe:
        it runs on the event loop of the streams, which it knows once one has had audio."""
        self.wake_any(lambda: self._fail_all(detail))

    def _fail_all(self, detail: str) -> None:
        for stream in list(self._open):
            stream.fail(detail)

    def poke(self, stream: Member) -> None:
        """``stream`` got work (audio, its end): queue it; start a round if one may start."""
        due = self._due
        if due is not None:
            if stream.queued or not stream.has_work():
                return
            if self._join(due, stream):  # into the round that waits for its gap
                self._start_due_if_all_in(due)
                return
            self._due = None  # it has begun
        if not self._enqueue(stream) or self._running >= self.parallel:
            return  # a round in progress starts the next one when it ends
        if self._gathering is not None:
            if self._all_ready() or time.monotonic() > self._gather_until:
                self._gathered()  # (the timer of a loop that has gone never fires)
            return
        if self.gather and self._running == 0 and not self._all_ready():
            # Out of idle: give the other streams' audio a moment to arrive, so that one
            # batched call serves them all.
            self._gather_until = time.monotonic() + self.gather + 0.1
            self._gathering = later(stream.token(), self.gather, self._gathered)
            return
        if self._spaced(stream.token()):
            return
        self._start()

    def _join(self, due: Round[Member], stream: Member) -> bool:
        """Event loop: claim ``stream``'s new work into ``due``, the round waiting for its gap,
        if it has not begun (a stream already in it adds its later audio and its end to its
        share); whether it was taken. False once the round has begun: then the stream waits
        for the next."""
        with due.lock:
            if due.sealed:
                return False
            mine = None
            if stream.busy:  # (rare: a second frame within the gap) in this round?
                mine = next((work for each, work in due.batch if each is stream), None)
                if mine is None or stream.more:
                    return True  # in another round, or its decoder's backlog first: that ends it
            work = stream.claim()
            if work is None:
                return True
            if mine is None:
                due.batch.append((stream, work))
            else:
                mine.pcm += work.pcm
                mine.finish = mine.finish or work.finish
            return True

    def _spaced(self, token: anyio.lowlevel.EventLoopToken) -> bool:
        """Whether a round that could start now waits: it is then submitted to start after
        the gap (and streams that get work meanwhile join it), or a timer starts it.

        Only while decoding costs less than a thread hop (the per-stream time of recent
        rounds is under _SPLIT_SECONDS): then the hop is the cost, so rounds start at most
        every _MIN_GAP, and one at a time while the running one is quick (under
        _SLOW_ROUND); under load one hop then serves the audio of many streams, and the
        event loop and a round thread do not take turns at the GIL for every frame. A model
        coming out of idle, or whose open streams all have work, starts at once; a round that
        turns out slow (a hung call) holds the others back for _SLOW_ROUND at most.
        """
        if self.gather or self._stream_seconds >= _SPLIT_SECONDS:
            return False  # (a batched model's own gather decides; a real decoder goes now)
        if not isinstance(token.native_token, asyncio.AbstractEventLoop):
            return False  # elsewhere a timer is a thread: dearer than the hop it saves
        if not self._running:
            start_at = self._last_start + _MIN_GAP
            if start_at <= time.monotonic() or self._all_ready():
                return False
            # The round thread waits for the gap, not the event loop: a loop timer would
            # wait for the selector's next whole millisecond.
            self._start(not_before=start_at)
            return True
        start_at = self._last_start + _SLOW_ROUND
        wait = start_at - time.monotonic()
        if wait <= 0 or self._all_ready():
            return False
        self._gather_until = start_at
        self._gathering = later(token, wait, self._gathered)
        return True

    def _start_due_if_all_in(self, due: Round[Member]) -> None:
        """Every open stream is in the waiting round (or ended): nothing more to wait for."""
        if self._all_ready(busy=True) and due.start_now():
            self._last_start = time.monotonic()  # (the next gap counts from now)

    def _all_ready(self, *, busy: bool = False) -> bool:
        """Whether every open stream has work (or, with ``busy``, is in a round) or ended."""
        return all(s.queued or s.ended or (busy and s.busy) for s in self._open)

    def _stop_waiting(self) -> None:
        """Cancel the pending gather or spacing timer, if any."""
        if self._gathering is not None:
            cancel, self._gathering = self._gathering, None
            cancel()

    def _gathered(self) -> None:
        self._stop_waiting()
        if self._running < self.parallel:
            self._start()

    def forget(self, stream: Member) -> None:
        self._open.discard(stream)
        if self._gathering is not None and self._all_ready():
            self._gathered()
        if self._due is not None:
            self._start_due_if_all_in(self._due)

    def _start(self, not_before: float = 0.0) -> None:
        """Take every ready stream's work into round threads: one, or when decoding costs
        more than a thread hop, as many as are free, sharing the streams. With
        ``not_before``, the one round waits for that time (see ``_spaced``)."""
        shares = 1
        free = self.parallel - self._running
        if free > 1 and len(self._ready) > 1 and self._stream_seconds >= _SPLIT_SECONDS:
            shares = min(free, len(self._ready))
        while shares and self._ready:
            take = -(-len(self._ready) // shares)
            shares -= 1
            batch: list[tuple[Member, Work]] = []
            while self._ready and len(batch) < take:
                stream = self._ready.popleft()
                work = stream.claim()
                if work is not None:
                    batch.append((stream, work))
            if batch:
                self._submit(batch, not_before)

    def _submit(self, batch: list[tuple[Member, Work]], not_before: float = 0.0) -> None:
        self._last_start = max(time.monotonic(), not_before)
        self._running += 1
        self.rounds += 1
        round_ = Round(batch, not_before)
        if not round_.sealed:
            self._due = round_
        self._flight.add(round_, batch[0][0].token())
        wake = batch[0][0].wake_loop

        def done(seconds: float) -> None:  # in the round thread
            wake(lambda: self._finished(round_, seconds))

        self._threads.submit(round_, done)

    def _finished(self, round_: Round[Member], seconds: float) -> None:
        if round_.abandoned:
            return  # given up at the deadline: its streams were settled then
        self._flight.discard(round_)
        self._running -= 1
        if self._due is round_:
            self._due = None
        batch = round_.batch
        DECODE_ROUND_SECONDS.labels(self.label).observe(seconds)
        self._stream_seconds += (seconds / len(batch) - self._stream_seconds) / 4  # recent
        for stream, work in batch:
            stream.settle(work)
        self._observe_lag()
        self._next(batch)

    def _next(self, batch: list[tuple[Member, Work]]) -> None:
        for stream, _ in batch:
            self._enqueue(stream)  # a backlog (Work.more) or audio that came meanwhile
        # Straight on, without gathering: the model is not coming out of idle.
        if not self.gather:
            # A spacing timer waited for the round that just ended (or the gap after it):
            # decide again, anew. (A gather timer is only ever set while no round runs.)
            self._stop_waiting()
        if (
            self._ready
            and self._running < self.parallel
            and self._gathering is None
            and not self._spaced(self._ready[0].token())
        ):
            self._start()

    def _abandon(self, round_: Round[Member], hung: Sequence[Work], finished: set[Work]) -> None:
        """``round_``'s thread is stuck in a call on ``hung``: those streams fail now, the
        others get their results or their work back, and the model's rounds go on without
        that thread."""
        self._running -= 1
        self.abandoned += 1
        stuck = set(hung)
        log.error(
            "engine decode call passed its deadline",
            extra={"model": self.label, "seconds": self.timeout, "streams": len(stuck)},
        )
        detail = f"the speech engine did not answer within {self.timeout:g} s"
        for work in hung:
            # A recognition that can be stopped (one in an engine process: isolation/) is;
            # then its thread returns, instead of staying blocked for good.
            stop = getattr(work.recognition, "abandon", None)
            if callable(stop):
                try:
                    stop()
                except Exception:
                    log.exception("engine failed to stop a hung decode call")
        for stream, work in round_.batch:
            if work in stuck:
                stream.give_up(detail)
            elif work in finished:
                stream.settle(work)
            else:
                stream.give_back(work)
        self._observe_lag()
        self._next(round_.batch)
