"""A checker of the contract's invariants over a session's actions, for tests and fuzzers.

Embedders driving :class:`StreamSession` from their own servers, property tests and the
harnesses under ``fuzz/`` all use it, so one definition of "the session behaved" exists.
Like the rest of the package it is pure; a broken invariant raises :class:`InvariantViolation`.
"""

from __future__ import annotations

from collections.abc import Iterable

from .actions import Action, Close, Feed, Flush, Open, Release, Send
from .errors import CloseCode
from .events import SAMPLE_RATE, Endpoint, Error, Final, Partial, Ready, Stats
from .session import StreamSession
from .table import State

__all__ = ["InvariantViolation", "SessionAudit"]


class InvariantViolation(AssertionError):
    """The session broke a rule of the contract."""


class SessionAudit:
    """Feed it every batch of pulled actions in order; call ``check_end`` when done."""

    def __init__(self) -> None:
        self.opens = 0
        self.releases = 0
        self.flushes = 0
        self.fed_bytes = 0
        self.feeds = 0
        self.revision = 0
        self.closed: Close | None = None
        self.ready = False
        self.terminal: list[str] = []  # final / stats / error, in order
        self.actions: list[Action] = []

    def _fail(self, message: str) -> None:
        raise InvariantViolation(f"{message}; actions so far: {self.actions[-12:]!r}")

    def observe(self, actions: Iterable[Action]) -> None:
        for action in actions:
            self.actions.append(action)
            if self.closed is not None:
                self._fail(f"{action!r} after the close")
            match action:
                case Open():
                    if self.opens:
                        self._fail("a second Open")
                    self.opens += 1
                case Release():
                    self.releases += 1
                    if self.releases > self.opens:
                        self._fail("Release without Open")
                case Feed(pcm=pcm):
                    if not self.ready or self.releases or self.flushes:
                        self._fail("Feed outside the streaming state")
                    if not pcm or len(pcm) % 2:
                        self._fail("Feed of an empty or unaligned frame")
                    self.feeds += 1
                    self.fed_bytes += len(pcm)
                case Flush():
                    if self.flushes or not self.ready or self.releases:
                        self._fail("Flush outside the streaming state")
                    self.flushes += 1
                case Send(event=event):
                    self._observe_event(event)
                case Close():
                    self._observe_close(action)

    def _observe_event(self, event: object) -> None:
        if self.terminal and self.terminal[-1] in ("stats", "error"):
            self._fail(f"{event!r} after {self.terminal[-1]}")
        match event:
            case Ready():
                if self.ready or not self.opens or self.releases:
                    self._fail("ready without an open stream, or twice")
                self.ready = True
            case Partial() | Endpoint() | Final():
                if not self.ready:
                    self._fail("a transcript event before ready")
                if event.revision != self.revision + 1:
                    self._fail(f"revision {event.revision} after {self.revision}")
                self.revision = event.revision
                if isinstance(event, Final):
                    if not self.flushes or "final" in self.terminal:
                        self._fail("final without end, or twice")
                    self.terminal.append("final")
            case Stats():
                self.terminal.append("stats")
                if event.canceled == ("final" in self.terminal):
                    self._fail("stats.canceled disagrees with the presence of final")
                if (
                    event.frames != self.feeds
                    or event.audio_seconds != self.fed_bytes / 2 / SAMPLE_RATE
                ):
                    self._fail("stats disagree with the audio fed to the engine")
            case Error():
                self.terminal.append("error")
        event_json = getattr(event, "to_json", None)
        if event_json is None:
            self._fail(f"not an event: {event!r}")
        else:
            event_json().encode("utf-8")  # serialisable, and encodable for the wire

    def _observe_close(self, close: Close) -> None:
        self.closed = close
        if self.releases != self.opens:
            self._fail("closed while the engine stream is still held")
        last = self.terminal[-1] if self.terminal else None
        if close.code == CloseCode.NORMAL:
            if last != "stats":
                self._fail("close 1000 without stats")
        elif close.code in (CloseCode.UNAUTHORIZED, CloseCode.GOING_AWAY):
            if last is not None:
                self._fail(f"close {int(close.code)} must not follow an event")
        else:
            errors = [a.event for a in self.actions if isinstance(a, Send)]
            if last != "error" or not isinstance(errors[-1], Error):
                self._fail(f"close {int(close.code)} without an error object")
            elif errors[-1].code.close_code != close.code:
                self._fail(f"error {errors[-1].code} closed with {int(close.code)}")

    def check_end(self, session: StreamSession) -> None:
        """The session's own counters agree with what it told the driver."""
        if session.samples * 2 != self.fed_bytes or session.frames != self.feeds:
            self._fail("session counters disagree with the Feed actions")
        if session.stream_held != (self.opens > self.releases):
            self._fail("stream_held disagrees with Open/Release")
        if session.state is State.CLOSED:
            if self.opens != self.releases:
                self._fail("closed without releasing the engine stream")
            if (self.closed is None) != (session.close_code is None):
                self._fail("close_code disagrees with the Close action")
        elif self.closed is not None:
            self._fail("a Close while the session is still open")
