"""The thread side of the engine runtime (:mod:`talkies.engines.runtime.rounds`): the threads that
run a model's decode rounds, a round's steps, and the bookkeeping the decode deadline reads."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import anyio.lowlevel

from ...protocol import EngineFailed
from ..base import EngineLost, Work
from .loop import Callback, later

log = logging.getLogger("talkies.engines")

DECODE_FAILED = "the speech engine failed while decoding"
# A round thread with nothing to do for this long ends: an idle or unloaded model keeps none.
_IDLE_SECONDS = 10.0

Done = Callable[[float], None]
S = TypeVar("S")  # what a round's works belong to: the runtime's streams
Late = Callable[["Round[S]", Sequence[Work], set[Work]], None]


class Round(Generic[S]):
    """One round in flight, shared by the event loop and its round thread.

    The thread takes the round in steps (one stream's ``accept``/``finish``, or one
    ``decode_many`` call), recording under ``lock`` which step runs since when. The deadline
    check (:meth:`DecodeRounds._watch`) reads that under the same lock and may give the round
    up (``abandoned``): from then on the thread makes no further call, and the works of the
    step it is in are its own to close.

    A round may be submitted before it is due (``not_before``, a ``time.monotonic()``): its
    thread then waits until then, and until it seals the round (``sealed``, under ``lock``),
    the event loop may still add streams to ``batch``
    (:class:`~talkies.engines.runtime.schedule.RoundScheduler` does). The wait is the thread's
    own timed wait, precise to tens of microseconds, where an event-loop timer would round it
    up to the selector's millisecond.
    """

    __slots__ = (
        "_not_before",
        "abandoned",
        "batch",
        "current",
        "due",
        "finished",
        "lock",
        "sealed",
        "step_started",
    )

    def __init__(self, batch: list[tuple[S, Work]], not_before: float = 0.0) -> None:
        self.batch = batch
        self.lock = threading.Lock()
        self.current: Sequence[Work] = ()  # the works of the call in progress
        self.step_started = 0.0  # time.monotonic() when it began
        self.finished: set[Work] = set()  # works whose calls returned
        self.abandoned = False
        self.sealed = not_before <= 0.0  # no stream joins any more
        self.due = threading.Condition(self.lock) if not self.sealed else None
        self._not_before = not_before

    def start_now(self) -> bool:
        """Event loop: nothing more to wait for (every open stream is in); whether the round
        was still waiting."""
        if self.due is None:
            return False
        with self.due:
            waiting = not self.sealed
            self._not_before = 0.0
            self.due.notify()
        return waiting

    def wait_until_due(self) -> None:
        """Round thread: wait for ``not_before`` (or :meth:`start_now`), then seal the round."""
        if self.due is None:
            return
        with self.due:
            while (left := self._not_before - time.monotonic()) > 0:
                self.due.wait(left)
            self.sealed = True


class InFlight(Generic[S]):
    """A model's rounds in flight, and the deadline check over them, on the event loop.

    One timer per model, not per round: it lapses once no round is in flight. When a round's
    current call has run ``timeout`` seconds, the round is marked ``abandoned`` and ``late``
    is called with it, the works of the hung call, and the works whose calls returned.
    """

    def __init__(self, late: Late[S], timeout: float) -> None:
        self.timeout = timeout
        self._late = late
        self._rounds: set[Round[S]] = set()
        self._watching: Callback | None = None  # the check's timer, if set
        self._watch_at = 0.0  # when it fires
        self._token: anyio.lowlevel.EventLoopToken | None = None

    def add(self, round_: Round[S], token: anyio.lowlevel.EventLoopToken) -> None:
        """``round_`` was submitted from the event loop of ``token``."""
        self._rounds.add(round_)
        self._token = token
        if self._watching is None or time.monotonic() > self._watch_at + 1.0:
            # (a check whose loop has gone never runs: one overdue by a second is replaced)
            self._watch_later(self.timeout)

    def discard(self, round_: Round[S]) -> None:
        self._rounds.discard(round_)

    def _watch_later(self, delay: float) -> None:
        assert self._token is not None
        self._watch_at = time.monotonic() + delay
        self._watching = later(self._token, delay, self._watch)

    def _watch(self) -> None:
        """Give up every round whose current call has run ``timeout`` seconds; come back when
        the next one could have."""
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
                self._rounds.discard(round_)
                self._late(round_, hung, finished)
            elif running:
                due = min(due, started + self.timeout)
        if self._rounds:
            self._watch_later(max(0.001, due - now))


class RoundThreads:
    """The threads that run one model's rounds (at most ``parallel`` busy at once).

    Not ``anyio.to_thread.run_sync``: a round is started from plain event-loop callbacks, and
    its end must start the next one without waiting for any task to be scheduled.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Round[Any], Done]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job, less the jobs queued for them
        self._started = 0

    def submit(self, batch: Round[Any], done: Done) -> None:
        """Decode ``batch`` in a round thread, then call ``done(seconds it took)`` there."""
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                self._started += 1
                name = f"{self._name}-{self._started}"
                threading.Thread(target=self._run, name=name, daemon=True).start()
        self._jobs.put((batch, done))

    def _run(self) -> None:
        while True:
            try:
                batch, done = self._jobs.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._idle:  # more threads wait than jobs are queued: leave
                        self._idle -= 1
                        return
                continue  # a job is queued for a waiting thread: this one
            batch.wait_until_due()
            started = time.perf_counter()
            try:
                _decode_round(batch)
            except BaseException:  # the decoders' own errors are caught inside
                log.exception("engine decode round failed")
                for _, work in batch.batch:
                    work.events.append(EngineFailed(detail=DECODE_FAILED))
                    work.more = False
            took = time.perf_counter() - started
            with self._lock:
                self._idle += 1
            done(took)


def _decode_round(round_: Round[Any]) -> None:
    """Round thread: every stream of the round; a failure is its stream's alone (or its
    batched call's). Each call is a step the deadline check can see (:class:`Round`)."""
    groups: dict[type, list[Work]] = {}
    for _, work in round_.batch:
        if callable(getattr(work.recognition, "decode_many", None)):
            groups.setdefault(type(work.recognition), []).append(work)
            continue
        if not _begin(round_, (work,)):
            return
        recognition = work.recognition
        try:
            if work.pcm:
                work.events.extend(recognition.accept(work.pcm))
            if work.finish:
                if work.pcm and not _renew(round_):
                    return
                work.events.append(recognition.finish())
        except Exception as exc:
            log.exception("engine failed while decoding")
            work.events.append(EngineFailed(detail=_detail(exc)))
        if not _end(round_):
            return
        _replace(work)
    for items in groups.values():
        if not _begin(round_, items):
            return
        try:
            items[0].recognition.decode_many(items)  # type: ignore[attr-defined]
        except Exception as exc:
            log.exception("engine failed while decoding a batch", extra={"streams": len(items)})
            for work in items:
                work.events.append(EngineFailed(detail=_detail(exc)))
                work.more = False
        if not _end(round_):
            return
        for work in items:
            _replace(work)


def _replace(work: Work) -> None:
    """Round thread, after a cut's ``finish``: the new recognition first (if making it fails,
    the stream fails and keeps the old one for its close), then the old one closed."""
    if work.renew is None or not work.finish:
        return
    if any(isinstance(event, EngineFailed) for event in work.events):
        return
    old = work.recognition
    try:
        work.recognition = work.renew()
    except Exception as exc:
        log.exception("engine failed to open a stream after a cut")
        work.events.append(EngineFailed(detail=_detail(exc)))
        return
    try:
        old.close()
    except Exception:
        log.exception("engine failed to close a stream")


def _detail(exc: Exception) -> str:
    """What a stream whose decode call raised ``exc`` is told: the engine's end when it ended
    (the same words the stream hears when the end is learnt between calls), else only that
    decoding failed (an engine's own exception text is for the log, not the client)."""
    return str(exc) if isinstance(exc, EngineLost) else DECODE_FAILED


def _begin(round_: Round[Any], works: Sequence[Work]) -> bool:
    """Round thread: about to call the decoders of ``works``; False if the round was given up
    (the works not yet decoded went back to their streams)."""
    with round_.lock:
        if round_.abandoned:
            return False
        round_.current = works
        round_.step_started = time.monotonic()
        return True


def _end(round_: Round[Any]) -> bool:
    """Round thread: the call of the current step returned. If the deadline passed meanwhile,
    its streams have failed and their recognitions are this thread's to close; False then."""
    with round_.lock:
        works, round_.current = round_.current, ()
        if not round_.abandoned:
            round_.finished.update(works)
            return True
    _close_abandoned(works)
    return False


def _renew(round_: Round[Any]) -> bool:
    """Round thread: between a stream's ``accept`` and ``finish``, each call has a deadline of
    its own; False (and the recognition closed) if the first one passed it."""
    with round_.lock:
        if not round_.abandoned:
            round_.step_started = time.monotonic()
            return True
        works, round_.current = round_.current, ()
    _close_abandoned(works)
    return False


def _close_abandoned(works: Sequence[Work]) -> None:
    for work in works:
        try:
            work.recognition.close()
        except Exception:
            log.exception("engine failed to close a stream")
    log.warning("a decode call that passed its deadline returned; its streams are closed")
