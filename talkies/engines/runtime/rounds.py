"""A model's decode rounds and the streams they serve (:mod:`talkies.engines.runtime` describes
the whole runtime: queues, rounds, spacing, results, batching, gathering, deadline)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import anyio
import anyio.lowlevel
import anyio.to_thread

from ...metrics import LAG_REFUSALS
from ...protocol import EngineEndpoint, EngineFailed, EngineFinal, EnginePartial, ErrorCode, Word
from ...protocol.events import SAMPLE_RATE
from ..base import EngineEvent, Recognition, Refusal, ResultListener, Work
from . import memory
from .lag import LagMeter, lag_detail
from .loop import Wake, ignore, waker
from .schedule import DEFAULT_DECODE_TIMEOUT, RoundScheduler

__all__ = ["DEFAULT_DECODE_TIMEOUT", "DecodeRounds", "ThreadedStream"]

log = logging.getLogger("talkies.engines")

_BYTES_PER_SECOND = 2 * SAMPLE_RATE
CANNOT_CUT = "this engine stream cannot close an utterance and go on"


class DecodeRounds(RoundScheduler):
    """The worker-thread rounds of one model: at most ``parallel`` at a time, and the streams
    they serve (:meth:`open`). Everything but the decoding itself happens on the event loop,
    in callbacks (:class:`~talkies.engines.runtime.schedule.RoundScheduler`)."""

    async def open(
        self, create: Callable[[], Recognition], *, max_buffered_bytes: int
    ) -> ThreadedStream:
        """A stream over the recognition ``create()`` makes in a worker thread; whatever it
        raises (a :class:`~talkies.engines.base.Refusal`) propagates."""
        if max_buffered_bytes < 2:
            raise ValueError("max_buffered_bytes must be at least 2")
        lag = self.lagging()
        if lag is not None:  # refused rather than making every stream fall further behind
            LAG_REFUSALS.labels(self.label).inc()
            raise Refusal(ErrorCode.CONNECTION_LIMIT, lag_detail(self.label, lag, self.max_lag))
        # Not abandoned on cancel: a recognition that was made is handed over (and closed by
        # whoever closes the stream), never leaked by a caller that went away meanwhile.
        recognition = await anyio.to_thread.run_sync(create)
        return ThreadedStream(
            recognition, max_buffered_bytes=max_buffered_bytes, rounds=self, create=create
        )


class ThreadedStream:
    """An :class:`~talkies.engines.base.EngineStream` over a :class:`Recognition`.

    Without ``rounds`` the stream has rounds of its own (one at a time). With ``create`` (what
    made ``recognition``) it can :meth:`cut`: the round that takes the audio before a cut
    ends with the recognition's ``finish()`` and a new recognition from ``create`` in its
    place (:func:`~.threads._replace`), in the same stream, so the model's slot and the
    pool's pin stay held; its final becomes the cut's endpoint, and the new recognition's word
    times are shifted by the audio the ones before it heard.
    """

    def __init__(
        self,
        recognition: Recognition,
        *,
        max_buffered_bytes: int,
        rounds: DecodeRounds | None = None,
        create: Callable[[], Recognition] | None = None,
    ) -> None:
        if max_buffered_bytes < 2:
            raise ValueError("max_buffered_bytes must be at least 2")
        self._rec = recognition
        self._max = max_buffered_bytes
        self._rounds = rounds if rounds is not None else DecodeRounds(parallel=1)
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._flush = False  # end requested
        self._create = create
        self._cuts: deque[int] = deque()  # cuts requested: bytes of _pending before each
        self._fed = 0  # bytes given to the current recognition
        self._shift = 0.0  # seconds of audio the recognitions before it heard
        self._finish_given = False  # the end was handed to a round
        self.more = False  # the decoder holds decodable input (Work.more)
        self.ended = False  # a final or failure was produced: nothing more to decode
        self._closed = False
        self.queued = False  # in the model's ready list
        self.busy = False  # inside a round
        self._abandoned = False  # its recognition stayed with a hung round thread
        self._loop_token: anyio.lowlevel.EventLoopToken | None = None
        self.wake_loop: Wake = ignore
        self._outbox: deque[EngineEvent] = deque()
        self._listener: ResultListener | None = None  # see listen()
        self._signal = anyio.Event()  # results, or close
        self._room = anyio.Event()  # the queue drained
        self._idle = anyio.Event()  # not inside a round (for aclose)
        self._idle.set()
        self._lag = LagMeter()  # runtime/lag.py
        self._settled_lag = 0.0  # the lag its last round ended with
        self._claimed_at = 0.0  # when its round in progress took its work
        self._rounds.register(self)

    @property
    def recognition(self) -> Recognition:
        return self._rec

    @property
    def buffered_bytes(self) -> int:
        return self._pending_bytes

    def lag(self, now: float) -> float:
        """Seconds the decoder is behind the audio received (:mod:`.lag`): the lag its last
        round ended with, or while a round runs longer than that, how long it has run (of
        the audio still unanswered); 0 once ended."""
        if self.ended or self._closed:
            return 0.0
        running = now - self._claimed_at if self.busy else 0.0
        return max(self._settled_lag, min(self._lag.lag(now), running))

    # -- the rounds' side -------------------------------------------------------------------

    def token(self) -> anyio.lowlevel.EventLoopToken:
        if self._loop_token is None:  # the loop this stream is used from (first feed/flush)
            self._loop_token = anyio.lowlevel.current_token()
            self.wake_loop = waker(self._loop_token)
            self._rounds.wake_any = self.wake_loop  # (for fail_all: the streams' loop)
        return self._loop_token

    def has_work(self) -> bool:
        if self.ended or self._closed:
            return False
        return (
            self.more
            or bool(self._pending)
            or bool(self._cuts)
            or (self._flush and not self._finish_given)
        )

    def claim(self) -> Work | None:
        """Leave the ready list; this round's work, if there still is some."""
        self.queued = False
        if not self.has_work():
            return None
        renew = None
        if self.more:
            pcm, finish = b"", False  # the decoder's backlog first; the queue waits
        else:
            pcm = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending.clear()
            if self._cuts:  # the audio before the first cut, then the cut
                cut = self._cuts.popleft()
                pcm, rest = pcm[:cut], pcm[cut:]
                if rest:
                    self._pending.append(rest)
                self._cuts = deque(c - cut for c in self._cuts)
                finish, renew = True, self._create
            else:
                finish = self._flush and not self._finish_given
                self._finish_given = self._finish_given or finish
            self._pending_bytes -= len(pcm)
            self._room.set()
            self._lag.claimed(len(pcm))
            self._fed += len(pcm)
        self.busy = True
        self._claimed_at = time.monotonic()
        if self._idle.is_set():
            self._idle = anyio.Event()
        return Work(self._rec, pcm, finish, renew=renew)

    def settle(self, work: Work) -> None:
        """The round is over: its results."""
        self.busy = False
        self.more = work.more
        lag = self._settled_lag = self._lag.settled(work.more, time.monotonic())
        self._rounds.note_lag(lag)
        events = work.events
        shift = self._shift
        cut = work.renew is not None
        for i, event in enumerate(events):
            if isinstance(event, EngineFailed) or (event.lag is not None and not cut and not shift):
                continue
            # What the session sends on. (A new event: dataclasses.replace costs twice as much.)
            words = _shifted(event.words, shift) if shift else event.words
            stamp = lag if event.lag is None else event.lag
            if cut and type(event) is EngineFinal:
                events[i] = EngineEndpoint(text=event.text, words=words, lag=stamp, cut=True)
            elif type(event) is EnginePartial:
                events[i] = EnginePartial(
                    text=event.text, words=words, lag=stamp, stable=event.stable
                )
            else:
                events[i] = type(event)(text=event.text, words=words, lag=stamp)
        if cut:  # the recognition that goes on (the old one, if making a new one failed)
            self._rec = work.recognition
            self._shift += self._fed / _BYTES_PER_SECOND
            self._fed = 0
        if any(isinstance(e, EngineFinal | EngineFailed) for e in events):
            self.ended = True
            self.more = False
        self._outbox.extend(events)
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

    def give_up(self, detail: str) -> None:
        """Its decode call passed the deadline: fail, and leave the recognition to the round
        thread that holds it (closed when the call returns, never used again)."""
        self.busy = False
        self._abandoned = True
        self._idle.set()
        self._end_failed(detail)

    def fail(self, detail: str) -> None:
        """Its engine is gone: unless a round has it (whose call fails by itself) or it has
        ended, it fails now rather than at its next feed or flush."""
        if not (self.busy or self.ended or self._closed):
            self._end_failed(detail)

    def _end_failed(self, detail: str) -> None:
        """Nothing more to decode: an EngineFailed for the consumer."""
        self.ended = True
        self.more = False
        self._outbox.append(EngineFailed(detail=detail))
        self._signal.set()

    def give_back(self, work: Work) -> None:
        """Its round was given up before its turn: the work goes back to the front of the
        queue, as if never claimed."""
        self.busy = False
        size = len(work.pcm)
        if size:
            self._pending.appendleft(work.pcm)
            self._pending_bytes += size
            self._lag.claimed(-size)
            self._fed -= size
            self._cuts = deque(c + size for c in self._cuts)
        if work.renew is not None:
            self._cuts.appendleft(size)
        elif work.finish:
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
        if not (self._closed or self._flush or self.ended):
            self._lag.received(len(pcm), time.monotonic())  # received now, queued or not
        # A frame always fits into an empty queue (config checks frame <= buffer), so waiting
        # only while something is queued cannot deadlock.
        while self._pending and self._pending_bytes + len(pcm) > self._max and not self._closed:
            if self._room.is_set():
                self._room = anyio.Event()
            await self._room.wait()
        if self._closed or self._flush or self.ended:
            return
        self._pending.append(pcm)
        self._pending_bytes += len(pcm)
        self.token()
        self._rounds.poke(self)

    async def flush(self) -> None:
        self._flush = True
        self.token()
        self._rounds.poke(self)

    async def cut(self) -> None:
        if self._closed or self._flush or self.ended:
            return
        if self._create is None:
            self._end_failed(CANNOT_CUT)
            return
        self._cuts.append(self._pending_bytes)
        self.token()
        self._rounds.poke(self)

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
        self._rounds.forget(self)
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


def _shifted(words: tuple[Word, ...], seconds: float) -> tuple[Word, ...]:
    return tuple(replace(w, start=w.start + seconds, end=w.end + seconds) for w in words)


def _close(recognition: Recognition) -> None:
    """Worker thread: free a stream's decoder, then give the memory it held back to the
    system (:mod:`talkies.engines.runtime.memory`)."""
    recognition.close()
    memory.release()
