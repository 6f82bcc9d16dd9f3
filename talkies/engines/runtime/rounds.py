"""The one engine-stream runtime: a byte-bounded queue in, events out, decoding in rounds.

Every live stream of every engine runs here (``shared/design.md``, "One engine runtime"):

- **Queue.** Each stream (:class:`ThreadedStream`) queues audio in a queue bounded in bytes
  (``TALKIES_STREAM_MAX_BUFFER_SECONDS`` of PCM). A full queue makes ``feed`` wait, so the
  transport stops reading the socket and a slow decoder slows the client's TCP window instead
  of growing the server's memory.
- **Rounds.** Decoding happens in rounds on worker threads (:class:`DecodeRounds`, one per
  model). A stream that gets work (audio, the end of its input) joins the model's ready list;
  if fewer than ``parallel`` rounds are running, a round starts at once: it takes every ready
  stream's :class:`~talkies.engines.base.Work` (its queued audio, whether its input ends) to
  one worker thread, and when it is done the event loop gives every stream its results and
  starts the next round with the streams that have work by then. So a thread hop is paid per
  round, not per stream or frame: under load one hop serves many streams, and an idle server
  answers a single stream with a single hop. Once decoding costs more than a hop (over 1 ms
  per stream and round), the ready streams are shared between the free round threads, so
  one-by-one decoders use every core. Rounds are started from ``feed``/``flush`` and
  from the previous round's completion, all on the event loop: no task leads them, so a
  round never waits for some stream's task to be scheduled, nor dies with it.
- **Spacing.** While decoding costs less than the hop (a cheap decoder: under 1 ms per
  stream and round), the hop is the whole cost, and under load a round per frame made the
  event loop and a round thread take turns at the GIL thousands of times a second. Then
  rounds start at most every 0.9 ms, one at a time while the running one is quick, so one
  hop serves the audio of every stream that came meanwhile; a model out of idle, or whose
  open streams all have work, starts at once, and a round that turns out slow (a hung call)
  holds the others back for 20 ms at most. The gap is waited for in the round thread: the
  next round is handed to it when the last one ends, and streams that get audio meanwhile
  join it until it is due (an event-loop timer would wake at the selector's next whole
  millisecond, not at the gap). Not for a model that gathers (sherpa: its own ``max_wait``
  batches), nor off asyncio (a timer there is a thread). Measured in bench/README.md
  ("Transport efficiency").
- **Results.** A consumer may :meth:`ThreadedStream.listen`: the results are then offered to
  it in the callback that ends the round (the transport answers a partial there, writing
  to the socket at once), and ``events()`` wakes only for what it leaves.
- **Batching.** In a round, recognitions that offer ``decode_many``
  (:class:`~talkies.engines.base.BatchRecognition`: sherpa) are decoded together, one call
  per recognition type; the others one by one, with ``accept`` and ``finish``. A batched
  decoder may keep decodable input for later (``Work.more``): the stream then goes again in
  the next round without new audio, and its queue, not the decoder, absorbs the backlog.
- **Gathering.** With ``gather`` > 0 (sherpa's ``max_wait``), a round that would start from
  idle first waits up to that long for every open stream of the model to have work, so one
  batched call serves them all rather than the first one alone.
- **Opening.** A stream's recognition is created in a worker thread (:meth:`DecodeRounds.open`):
  a Vosk recognizer takes ~70 ms, which on the event loop would stall every connection.
- **Deadline.** A decode call (``accept``, ``finish``, ``decode_many``) that has not returned
  after ``timeout`` seconds (``TALKIES_DECODE_TIMEOUT``, 30 s) is given up on: its streams get
  an EngineFailed (4500 ``server_error``), so their slots are freed and their clients
  answered; the round's other streams get their results (calls that returned) or their work
  back (calls not yet made), and the model's other rounds go on in fresh threads. The hung
  thread keeps the recognitions of that call and closes them when the call finally returns;
  they are never used again. Python cannot stop a thread, so it is abandoned, not killed.

The runtime passes events through as the decoders report them: dropping unchanged partials
and empty endpoints is the protocol session's job alone (``docs/protocol.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from ...metrics import DECODE_ROUND_SECONDS
from ...protocol import EngineFailed, EngineFinal
from ..base import EngineEvent, Recognition, ResultListener, Work
from . import memory
from .threads import _Round, _RoundThreads

__all__ = ["DEFAULT_DECODE_TIMEOUT", "DecodeRounds", "ThreadedStream"]

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

_Callback = Callable[[], None]
_Wake = Callable[[_Callback], None]


def _waker(token: anyio.lowlevel.EventLoopToken) -> _Wake:
    """Schedule a callback on the event loop of ``token`` from any thread, without waiting
    for it where the backend allows (asyncio, trio)."""
    native = token.native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        loop = native

        def on_asyncio(callback: _Callback) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(callback)

        return on_asyncio
    run_sync_soon = getattr(native, "run_sync_soon", None)
    if callable(run_sync_soon):

        def on_trio(callback: _Callback) -> None:
            with contextlib.suppress(Exception):  # trio.RunFinishedError: the run is over
                run_sync_soon(callback)

        return on_trio

    def blocking(callback: _Callback) -> None:
        with contextlib.suppress(Exception):  # the loop is gone
            anyio.from_thread.run_sync(callback, token=token)

    return blocking


def _later(token: anyio.lowlevel.EventLoopToken, delay: float, callback: _Callback) -> _Callback:
    """Run ``callback`` on the event loop after ``delay`` seconds; returns a cancel function."""
    native = token.native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        return native.call_later(delay, callback).cancel
    timer = threading.Timer(delay, _waker(token), (callback,))
    timer.daemon = True
    timer.start()
    return timer.cancel


class DecodeRounds:
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
        # Seconds one decode call may take (TALKIES_DECODE_TIMEOUT; the pool sets it).
        self.timeout = timeout
        self._rounds: set[_Round] = set()  # in flight
        self._watching: _Callback | None = None  # the deadline check's timer, if set
        self._watch_at = 0.0  # when it fires
        self._threads = _RoundThreads("engine-round")
        self._ready: deque[ThreadedStream] = deque()
        self._running = 0
        self._open: set[ThreadedStream] = set()
        self._gathering: _Callback | None = None  # cancels the pending gather timer
        self._gather_until = 0.0
        self._last_start = 0.0  # when the last round started (or will: see _spaced)
        self._due: _Round | None = None  # a round waiting for its gap, that streams may join
        self._stream_seconds = 0.0  # recent decoding time per stream and round
        self.rounds = 0  # rounds run, for tests and benchmarks
        self.abandoned = 0  # rounds given up at the deadline, for tests
        self.label = ""  # the model's slug: the ``model`` label of the round-time histogram
        self._wake_any: _Wake = _ignore  # schedules on the streams' event loop (fail_all)

    @property
    def open_streams(self) -> int:
        """Streams opened and not yet closed."""
        return len(self._open)

    async def open(
        self, create: Callable[[], Recognition], *, max_buffered_bytes: int
    ) -> ThreadedStream:
        """A stream over the recognition ``create()`` makes in a worker thread; whatever it
        raises (a :class:`~talkies.engines.base.Refusal`) propagates."""
        if max_buffered_bytes < 2:
            raise ValueError("max_buffered_bytes must be at least 2")
        # Not abandoned on cancel: a recognition that was made is handed over (and closed by
        # whoever closes the stream), never leaked by a caller that went away meanwhile.
        recognition = await anyio.to_thread.run_sync(create)
        return ThreadedStream(recognition, max_buffered_bytes=max_buffered_bytes, rounds=self)

    # -- event loop callbacks -------------------------------------------------------------------

    def _enqueue(self, stream: ThreadedStream) -> bool:
        """Put ``stream`` in the ready list if it has work; whether it is there now."""
        if stream._queued:
            return True
        if stream._busy or not stream._has_work():
            return False
        stream._queued = True
        self._ready.append(stream)
        return True

    def fail_all(self, detail: str) -> None:
        """Fail every open stream of the model that is not inside a round (those fail by their
        call): their engine is gone (an engine process that ended, isolated.py). Thread-safe:
        it runs on the event loop of the streams, which it knows once one has had audio."""
        self._wake_any(lambda: self._fail_all(detail))

    def _fail_all(self, detail: str) -> None:
        for stream in list(self._open):
            stream._fail(detail)

    def _poke(self, stream: ThreadedStream) -> None:
        """``stream`` got work (audio, its end): queue it; start a round if one may start."""
        due = self._due
        if due is not None:
            if stream._queued or not stream._has_work():
                return
            if due.join(stream):  # into the round that waits for its gap
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
            self._gathering = _later(stream._token(), self.gather, self._gathered)
            return
        if self._spaced(stream._token()):
            return
        self._start()

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
        self._gathering = _later(token, wait, self._gathered)
        return True

    def _start_due_if_all_in(self, due: _Round) -> None:
        """Every open stream is in the waiting round (or ended): nothing more to wait for."""
        if self._all_ready(busy=True) and due.start_now():
            self._last_start = time.monotonic()  # (the next gap counts from now)

    def _all_ready(self, *, busy: bool = False) -> bool:
        """Whether every open stream has work (or, with ``busy``, is in a round) or ended."""
        return all(s._queued or s._ended or (busy and s._busy) for s in self._open)

    def _stop_waiting(self) -> None:
        """Cancel the pending gather or spacing timer, if any."""
        if self._gathering is not None:
            cancel, self._gathering = self._gathering, None
            cancel()

    def _gathered(self) -> None:
        self._stop_waiting()
        if self._running < self.parallel:
            self._start()

    def _forget(self, stream: ThreadedStream) -> None:
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
            batch: list[tuple[ThreadedStream, Work]] = []
            while self._ready and len(batch) < take:
                stream = self._ready.popleft()
                work = stream._claim()
                if work is not None:
                    batch.append((stream, work))
            if batch:
                self._submit(batch, not_before)

    def _submit(self, batch: list[tuple[ThreadedStream, Work]], not_before: float = 0.0) -> None:
        self._last_start = max(time.monotonic(), not_before)
        self._running += 1
        self.rounds += 1
        round_ = _Round(batch, not_before)
        if not round_.sealed:
            self._due = round_
        self._rounds.add(round_)
        if self._watching is None or time.monotonic() > self._watch_at + 1.0:
            # (a check whose loop has gone never runs: one overdue by a second is replaced)
            self._watch_later(batch[0][0]._token(), self.timeout)
        wake = batch[0][0]._wake_loop

        def done(seconds: float) -> None:  # in the round thread
            wake(lambda: self._finished(round_, seconds))

        self._threads.submit(round_, done)

    def _finished(self, round_: _Round, seconds: float) -> None:
        if round_.abandoned:
            return  # given up at the deadline: its streams were settled then
        self._rounds.discard(round_)
        self._running -= 1
        if self._due is round_:
            self._due = None
        batch = round_.batch
        DECODE_ROUND_SECONDS.labels(self.label).observe(seconds)
        self._stream_seconds += (seconds / len(batch) - self._stream_seconds) / 4  # recent
        for stream, work in batch:
            stream._settle(work)
        self._next(batch)

    def _next(self, batch: list[tuple[ThreadedStream, Work]]) -> None:
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
            and not self._spaced(self._ready[0]._token())
        ):
            self._start()

    # -- the decode deadline ----------------------------------------------------------------

    def _watch_later(self, token: anyio.lowlevel.EventLoopToken, delay: float) -> None:
        self._watch_at = time.monotonic() + delay
        self._watching = _later(token, delay, self._watch)

    def _watch(self) -> None:
        """The deadline check, on the event loop: give up every round whose current call has
        run ``timeout`` seconds; come back when the next one could have. One timer per model,
        not per round: it lapses once no round is in flight."""
        self._watching = None
        now = time.monotonic()
        due = now + self.timeout
        for round_ in list(self._rounds):
            with round_.lock:
                running = bool(round_.current)
                started = round_.step_started
                late = running and now - started >= self.timeout
                if late:
                    round_.abandoned = True
                    hung = round_.current
                    finished = set(round_.finished)
            if late:
                self._abandon(round_, hung, finished)
            elif running:
                due = min(due, started + self.timeout)
        if self._rounds:
            token = next(iter(self._rounds)).batch[0][0]._token()
            self._watch_later(token, max(0.001, due - now))

    def _abandon(self, round_: _Round, hung: Sequence[Work], finished: set[Work]) -> None:
        """``round_``'s thread is stuck in a call on ``hung``: those streams fail now, the
        others get their results or their work back, and the model's rounds go on without
        that thread."""
        self._rounds.discard(round_)
        self._running -= 1
        self.abandoned += 1
        stuck = set(hung)
        log.error(
            "engine decode call passed its deadline",
            extra={"model": self.label, "seconds": self.timeout, "streams": len(stuck)},
        )
        detail = f"the speech engine did not answer within {self.timeout:g} s"
        for work in hung:
            # A recognition that can be stopped (one in an engine process: isolated.py) is;
            # then its thread returns, instead of staying blocked for good.
            stop = getattr(work.recognition, "abandon", None)
            if callable(stop):
                try:
                    stop()
                except Exception:
                    log.exception("engine failed to stop a hung decode call")
        for stream, work in round_.batch:
            if work in stuck:
                stream._abandon(detail)
            elif work in finished:
                stream._settle(work)
            else:
                stream._give_back(work)
        self._next(round_.batch)


class ThreadedStream:
    """An :class:`~talkies.engines.base.EngineStream` over a :class:`Recognition`.

    Without ``rounds`` the stream has rounds of its own (one at a time).
    """

    def __init__(
        self,
        recognition: Recognition,
        *,
        max_buffered_bytes: int,
        rounds: DecodeRounds | None = None,
    ) -> None:
        if max_buffered_bytes < 2:
            raise ValueError("max_buffered_bytes must be at least 2")
        self._rec = recognition
        self._max = max_buffered_bytes
        self._rounds = rounds if rounds is not None else DecodeRounds(parallel=1)
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._flush = False  # end requested
        self._finish_given = False  # the end was handed to a round
        self._more = False  # the decoder holds decodable input (Work.more)
        self._ended = False  # a final or failure was produced: nothing more to decode
        self._closed = False
        self._queued = False  # in the model's ready list
        self._busy = False  # inside a round
        self._abandoned = False  # its recognition stayed with a hung round thread
        self._loop_token: anyio.lowlevel.EventLoopToken | None = None
        self._wake_loop: _Wake = _ignore
        self._outbox: deque[EngineEvent] = deque()
        self._listener: ResultListener | None = None  # see listen()
        self._signal = anyio.Event()  # results, or close
        self._room = anyio.Event()  # the queue drained
        self._idle = anyio.Event()  # not inside a round (for aclose)
        self._idle.set()
        self._rounds._open.add(self)

    @property
    def recognition(self) -> Recognition:
        return self._rec

    @property
    def buffered_bytes(self) -> int:
        return self._pending_bytes

    # -- the rounds' side -------------------------------------------------------------------

    def _token(self) -> anyio.lowlevel.EventLoopToken:
        if self._loop_token is None:  # the loop this stream is used from (first feed/flush)
            self._loop_token = anyio.lowlevel.current_token()
            self._wake_loop = _waker(self._loop_token)
            self._rounds._wake_any = self._wake_loop  # (for fail_all: the streams' loop)
        return self._loop_token

    def _has_work(self) -> bool:
        if self._ended or self._closed:
            return False
        return self._more or bool(self._pending) or (self._flush and not self._finish_given)

    def _claim(self) -> Work | None:
        """Leave the ready list; this round's work, if there still is some."""
        self._queued = False
        if not self._has_work():
            return None
        if self._more:
            pcm, finish = b"", False  # the decoder's backlog first; the queue waits
        else:
            pcm = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending.clear()
            self._pending_bytes = 0
            self._room.set()
            finish = self._flush and not self._finish_given
            self._finish_given = self._finish_given or finish
        self._busy = True
        if self._idle.is_set():
            self._idle = anyio.Event()
        return Work(self._rec, pcm, finish)

    def _settle(self, work: Work) -> None:
        """The round is over: its results."""
        self._busy = False
        self._more = work.more
        if any(isinstance(e, EngineFinal | EngineFailed) for e in work.events):
            self._ended = True
            self._more = False
        self._outbox.extend(work.events)
        self._idle.set()
        if work.events or self._closed:
            listener = self._listener
            if listener is not None and not self._closed:
                try:
                    if listener(self._outbox):
                        return  # all taken, on the spot
                except Exception:  # a bug in the consumer: events() still gets the rest
                    log.exception("engine result listener failed")
            self._signal.set()

    def _abandon(self, detail: str) -> None:
        """Its decode call passed the deadline: fail, and leave the recognition to the round
        thread that holds it (closed when the call returns, never used again)."""
        self._busy = False
        self._abandoned = True
        self._idle.set()
        self._end_failed(detail)

    def _fail(self, detail: str) -> None:
        """Its engine is gone: unless a round has it (whose call fails by itself) or it has
        ended, it fails now rather than at its next feed or flush."""
        if not (self._busy or self._ended or self._closed):
            self._end_failed(detail)

    def _end_failed(self, detail: str) -> None:
        """Nothing more to decode: an EngineFailed for the consumer."""
        self._ended = True
        self._more = False
        self._outbox.append(EngineFailed(detail=detail))
        self._signal.set()

    def _give_back(self, work: Work) -> None:
        """Its round was given up before its turn: the work goes back to the front of the
        queue, as if never claimed."""
        self._busy = False
        if work.pcm:
            self._pending.appendleft(work.pcm)
            self._pending_bytes += len(work.pcm)
        if work.finish:
            self._finish_given = False
        self._idle.set()

    # -- the event loop's side ----------------------------------------------------------------

    def listen(self, listener: ResultListener) -> None:
        """Offer results to ``listener`` first, on the event loop, as soon as a round ends:
        it takes what it can from the front of the queue it is given and says whether it took
        everything (``events()`` is woken only for what it left). It lets the consumer answer
        a partial within the round's callback, without a task switch."""
        self._listener = listener

    async def feed(self, pcm: bytes) -> None:
        # A frame always fits into an empty queue (config checks frame <= buffer), so waiting
        # only while something is queued cannot deadlock.
        while self._pending and self._pending_bytes + len(pcm) > self._max and not self._closed:
            if self._room.is_set():
                self._room = anyio.Event()
            await self._room.wait()
        if self._closed or self._flush or self._ended:
            return
        self._pending.append(pcm)
        self._pending_bytes += len(pcm)
        self._token()
        self._rounds._poke(self)

    async def flush(self) -> None:
        self._flush = True
        self._token()
        self._rounds._poke(self)

    async def events(self) -> AsyncIterator[EngineEvent]:
        while True:
            while self._outbox:
                event = self._outbox.popleft()
                yield event
                if isinstance(event, EngineFinal | EngineFailed):
                    return
            if self._closed:
                return
            if self._signal.is_set():
                self._signal = anyio.Event()
                continue
            await self._signal.wait()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._rounds._forget(self)
        self._room.set()
        self._signal.set()
        # Shielded: closing native resources must complete even if our caller is cancelled,
        # and must wait for a round that is using this decoder, never run beside it.
        with anyio.CancelScope(shield=True):
            await self._idle.wait()  # bounded by the decode deadline
            if self._abandoned:
                return  # the hung round thread closes it when its call returns
            try:
                await anyio.to_thread.run_sync(_close, self._rec)
            except Exception:
                log.exception("engine failed to close a stream")


def _close(recognition: Recognition) -> None:
    """Worker thread: free a stream's decoder, then give the memory it held back to the
    system (:mod:`talkies.engines.runtime.memory`)."""
    recognition.close()
    memory.release()


def _ignore(callback: _Callback) -> None:
    return None
