"""A checker of the contract's invariants over a session's actions, for tests and fuzzers.

Embedders driving :class:`StreamSession` from their own servers, property tests and the
harnesses under ``fuzz/`` all use it, so one definition of "the session behaved" exists.
Like the rest of the package it is pure; a broken invariant raises :class:`InvariantViolation`.

Two ways to use it:

* drive the session yourself, pass every batch of pulled actions, in order, to
  :meth:`SessionAudit.observe` and call :meth:`SessionAudit.check_end` after each batch
  (or once, at the end);
* or let :meth:`SessionAudit.step` deliver each input: it also checks that ``handle`` never
  raises and that the session answered that input as the spec says.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, NoReturn

from .actions import Action, Close, Cut, Feed, Flush, Open, Release, Send
from .errors import CloseCode, ErrorCode, ProtocolError
from .events import SAMPLE_RATE, Endpoint, Error, Final, Partial, Ready, Stats
from .inputs import (
    AudioBatch,
    AuthRejected,
    BinaryReceived,
    CutRequested,
    EngineEndpoint,
    EngineFailed,
    EngineFinal,
    EngineOpened,
    EnginePartial,
    Input,
    PeerGone,
    Refused,
    ShuttingDown,
    Tick,
)
from .messages import StartOptions
from .session import StreamSession
from .table import State

__all__ = ["InvariantViolation", "SessionAudit", "check_event_json"]

# The idle timer runs while the client is the one expected to talk (spec: 4408).
_IDLE_STATES = frozenset({State.AWAITING_START, State.STREAMING})
# Engine answers and the states in which they are expected; elsewhere they are server_error.
_ENGINE_STATES: dict[type, frozenset[State]] = {
    EngineOpened: frozenset({State.OPENING}),
    EngineFinal: frozenset({State.FLUSHING}),
    EnginePartial: frozenset({State.STREAMING, State.FLUSHING}),
    EngineEndpoint: frozenset({State.STREAMING, State.FLUSHING}),
}
_STATE_ERROR = "internal state error"  # the session's detail when a handler broke the table


class InvariantViolation(AssertionError):
    """The session broke a rule of the contract."""


def _reject_constant(name: str) -> NoReturn:
    raise InvariantViolation(f"event JSON contains the non-JSON constant {name}")


def check_event_json(event: object) -> dict[str, Any]:
    """``event.to_json()`` is strict JSON, encodes as UTF-8 (a text frame) and is ``to_dict()``.

    Returns the decoded object.
    """
    to_json = getattr(event, "to_json", None)
    if to_json is None:
        raise InvariantViolation(f"not an event: {event!r}")
    name = type(event).__name__
    text = to_json()
    if not isinstance(text, str):
        raise InvariantViolation(f"{name}.to_json() returned {type(text).__name__}, not str")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvariantViolation(f"{name} JSON cannot be sent as UTF-8: {text!r}") from exc
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:
        raise InvariantViolation(f"{name}.to_json() is not JSON: {text!r}") from exc
    if not isinstance(obj, dict) or obj.get("type") != getattr(event, "type", None):
        raise InvariantViolation(f"{name} JSON has the wrong type field: {text!r}")
    if obj != event.to_dict():  # type: ignore[attr-defined]
        raise InvariantViolation(f"to_json() and to_dict() disagree for {event!r}")
    return obj


class SessionAudit:
    """Feed it every batch of pulled actions in order; call ``check_end`` when done.

    One audit per session. :meth:`step` does both for one input, and more.
    """

    def __init__(self) -> None:
        self.opens = 0
        self.releases = 0
        self.flushes = 0
        self.fed_bytes = 0
        self.feeds = 0
        self.largest_feed = 0
        self.revision = 0
        self.options: StartOptions | None = None  # of the Open
        self.closed: Close | None = None
        self.ended = False  # the session was seen CLOSED (PeerGone closes without a Close)
        self.ready = False
        self.terminal: list[str] = []  # final / stats / error, in order
        self.error: Error | None = None
        self.actions: list[Action] = []
        self._want_stats = False  # a final was sent: stats must come next
        self._want_close: Close | None = None  # an error or stats was sent: this must come next
        self._start_deadline: float | None = None  # the session's, as first seen

    def _fail(self, message: str) -> NoReturn:
        raise InvariantViolation(f"{message}; actions so far: {self.actions[-12:]!r}")

    # -- the actions ---------------------------------------------------------------------------

    def observe(self, actions: Iterable[Action]) -> None:
        for action in actions:
            self.actions.append(action)
            if self.closed is not None or self.ended:
                self._fail(f"{action!r} after the close")
            if self._want_stats:
                if not (isinstance(action, Send) and isinstance(action.event, Stats)):
                    self._fail("final not followed directly by stats")
                self._want_stats = False
            elif self._want_close is not None:
                if action != self._want_close:
                    self._fail(f"the last event is not followed directly by {self._want_close}")
                self._want_close = None
            match action:
                case Open(options=options):
                    if self.opens:
                        self._fail("a second Open")
                    self.opens += 1
                    self.options = options
                case Release():
                    self.releases += 1
                    if self.releases > self.opens:
                        self._fail("Release without Open")
                case Feed(pcm=pcm, frames=frames):
                    if not self.ready or self.releases or self.flushes:
                        self._fail("Feed outside the streaming state")
                    if not pcm or len(pcm) % 2 or frames < 1 or len(pcm) < 2 * frames:
                        self._fail("Feed of an empty or unaligned frame")
                    self.feeds += frames  # client frames, however many Feed actions hold them
                    self.fed_bytes += len(pcm)
                    # Per frame: a Feed of n joined frames may hold n times the frame limit.
                    self.largest_feed = max(self.largest_feed, -(-len(pcm) // frames))
                case Flush():
                    if self.flushes or not self.ready or self.releases:
                        self._fail("Flush outside the streaming state")
                    self.flushes += 1
                case Cut():
                    if self.flushes or not self.ready or self.releases:
                        self._fail("Cut outside the streaming state")
                case Send(event=event):
                    self._observe_event(event)
                case Close():
                    self._observe_close(action)
                case _:
                    self._fail(f"not an action: {action!r}")

    def _observe_event(self, event: object) -> None:
        check_event_json(event)
        options = self.options
        match event:
            case Ready(model=model):
                if self.ready or not self.opens or self.releases:
                    self._fail("ready without an open stream, or twice")
                assert options is not None
                if model != options.model:
                    self._fail(f"ready for {model!r}, but the start asked for {options.model!r}")
                self.ready = True
            case Partial() | Endpoint() | Final():
                if not self.ready:
                    self._fail("a transcript event before ready")
                assert options is not None
                if event.revision != self.revision + 1:
                    self._fail(f"revision {event.revision} after {self.revision}")
                self.revision = event.revision
                if event.audio_seconds != self.fed_bytes / 2 / SAMPLE_RATE:
                    self._fail(f"{event.type}.audio_seconds disagrees with the audio fed")
                if event.words and not options.word_timestamps:
                    self._fail("words sent although word_timestamps is false")
                if isinstance(event, Partial) and not options.interim_results:
                    self._fail("a partial sent although interim_results is false")
                if isinstance(event, Final):
                    if not self.flushes or "final" in self.terminal:
                        self._fail("final without end, or twice")
                    self.terminal.append("final")
                    self._want_stats = True
            case Stats():
                self.terminal.append("stats")
                if event.canceled == ("final" in self.terminal):
                    self._fail("stats.canceled disagrees with the presence of final")
                if (
                    event.frames != self.feeds
                    or event.audio_seconds != self.fed_bytes / 2 / SAMPLE_RATE
                ):
                    self._fail("stats disagree with the audio fed to the engine")
                self._want_close = Close(code=CloseCode.NORMAL, reason="")
            case Error(code=code):
                if not isinstance(code, ErrorCode):
                    self._fail(f"error code {code!r} is not an ErrorCode")
                self.terminal.append("error")
                self.error = event
                self._want_close = Close(code=code.close_code, reason=code.value)
            case _:
                self._fail(f"not an event: {event!r}")

    def _observe_close(self, close: Close) -> None:
        self.closed = close
        if not isinstance(close.code, CloseCode):
            self._fail(f"close code {close.code!r} is not a CloseCode")
        if self.releases != self.opens:
            self._fail("closed while the engine stream is still held")
        last = self.terminal[-1] if self.terminal else None
        if close.code == CloseCode.NORMAL:
            if last != "stats":
                self._fail("close 1000 without stats")
        elif close.code in (CloseCode.UNAUTHORIZED, CloseCode.GOING_AWAY):
            if last is not None:
                self._fail(f"close {int(close.code)} must not follow an event")
        elif last != "error" or self.error is None:
            self._fail(f"close {int(close.code)} without an error object")
        elif self.error.code.close_code != close.code:
            self._fail(f"error {self.error.code} closed with {int(close.code)}")

    # -- the session's own view ----------------------------------------------------------------

    def check_end(self, session: StreamSession) -> None:
        """The session's own state agrees with what it told the driver."""
        if self._want_stats or self._want_close is not None:
            self._fail("the batch ended between a last event and what must follow it")
        if session.samples * 2 != self.fed_bytes or session.frames != self.feeds:
            self._fail("session counters disagree with the Feed actions")
        if session.samples > session.limits.max_samples:
            self._fail(f"{session.samples} samples exceed the duration limit")
        if self.largest_feed > session.limits.max_frame_bytes:
            self._fail(f"a Feed averaging {self.largest_feed} bytes a frame exceeds the limit")
        if session.revision != self.revision:
            self._fail(f"session revision {session.revision}, last sent {self.revision}")
        if session.options != self.options:
            self._fail(f"session.options {session.options} but Open({self.options})")
        if session.stream_held != (self.opens > self.releases):
            self._fail("stream_held disagrees with Open/Release")
        deadline = session.deadline
        if (deadline is not None) != (session.state in _IDLE_STATES):
            self._fail(f"deadline {deadline} in state {session.state}")
        # The start deadline is fixed when the connection is accepted; no input moves it, and
        # before start the timer never runs past it (a trickled start cannot hold a slot).
        if self._start_deadline is None:
            self._start_deadline = session.start_deadline
        elif session.start_deadline != self._start_deadline:
            self._fail(f"start deadline moved from {self._start_deadline}")
        if session.state is State.AWAITING_START and not (
            deadline is not None and deadline <= session.start_deadline
        ):
            self._fail(f"deadline {deadline} after the start deadline {session.start_deadline}")
        self._check_error(session.error)
        if session.state is State.CLOSED:
            self.ended = True
            if self.opens != self.releases:
                self._fail("closed without releasing the engine stream")
            if session.outcome is None:
                self._fail("closed without an outcome")
            code = self.closed.code if self.closed is not None else None
            if session.close_code != code:
                self._fail(f"close_code {session.close_code} but the Close action sent {code}")
        elif self.closed is not None:
            self._fail("a Close while the session is still open")

    def _check_error(self, error: ProtocolError | None) -> None:
        sent = self.error.code if self.error is not None else None
        if error is None or sent is None:
            if error is not None or sent is not None:
                self._fail(f"session.error {error!r} but the error event sent {sent}")
            return
        if error.code != sent:
            self._fail(f"session.error is {error.code}, the error event {sent}")
        cause = error.__cause__
        if error.code is ErrorCode.SERVER_ERROR and not isinstance(cause, ProtocolError | None):
            message = f"a handler bug, contained as server_error: {cause!r}"
            raise InvariantViolation(message) from cause

    # -- driving one input ---------------------------------------------------------------------

    def step(self, session: StreamSession, event: Input, now: float) -> list[Action]:
        """Deliver ``event`` at ``now``, audit its actions and the session; return the actions.

        Besides :meth:`observe` and :meth:`check_end`: ``handle`` never raises, and the answer
        to this input is the one the spec gives it (a tick closes with ``idle_timeout`` exactly
        when the deadline has passed; ``AuthRejected`` before start is a bare close 4401;
        ``PeerGone`` closes without a close frame; ``ShuttingDown`` closes 1001; ``Refused`` and
        engine failures close with their code; engine answers out of place are
        ``server_error`` and in place never fail; audio outside streaming is ``invalid_audio``).
        """
        state, deadline, error_before = session.state, session.deadline, session.error
        try:
            session.handle(event, now)
        except Exception as exc:
            raise InvariantViolation(f"handle({event!r}) raised {exc!r}") from exc
        actions = session.pull_actions()
        self.observe(actions)
        self.check_end(session)
        if state is not State.CLOSED:
            self._check_answer(session, event, actions, now=now, state=state, deadline=deadline)
            error = session.error
            if (
                error is not None
                and error is not error_before
                and error.detail == _STATE_ERROR
                and getattr(event, "detail", None) != _STATE_ERROR
            ):
                self._fail(f"{event!r} in {state} left a state the transition table forbids")
        return actions

    def _check_answer(
        self,
        session: StreamSession,
        event: Input,
        actions: list[Action],
        *,
        now: float,
        state: State,
        deadline: float | None,
    ) -> None:
        """The answer to ``event``, delivered at ``now`` in ``state`` (idle ``deadline``)."""
        code = next(
            (a.event.code for a in actions if isinstance(a, Send) and isinstance(a.event, Error)),
            None,
        )
        closed = session.state is State.CLOSED
        wrong = f"{event!r} in {state} gave {actions!r}"
        match event:
            case Tick():
                if deadline is not None and now >= deadline:
                    if code is not ErrorCode.IDLE_TIMEOUT:
                        self._fail(f"{wrong}, not idle_timeout (deadline {deadline}, now {now})")
                elif actions:
                    self._fail(f"{wrong} before the deadline {deadline} (now {now})")
            case AuthRejected():
                if state is State.AWAITING_START:
                    if actions != [Close(code=CloseCode.UNAUTHORIZED, reason="")]:
                        self._fail(f"{wrong}, not a bare close 4401")
                elif code is not ErrorCode.SERVER_ERROR:
                    self._fail(wrong)
            case PeerGone():
                if not closed or any(not isinstance(a, Release) for a in actions):
                    self._fail(f"{wrong}: it must close without a close frame")
            case ShuttingDown():
                if not closed or actions[-1:] != [Close(code=CloseCode.GOING_AWAY, reason="")]:
                    self._fail(f"{wrong}, not close 1001")
            case Refused():
                if code is not event.code:
                    self._fail(wrong)
            case EngineFailed():
                if code is not ErrorCode.SERVER_ERROR:
                    self._fail(wrong)
            case CutRequested():
                expected = state is State.STREAMING
                if code is not (None if expected else ErrorCode.SERVER_ERROR):
                    self._fail(wrong)
                if expected and actions != [Cut()]:
                    self._fail(f"a cut while streaming gave {actions!r}")
            case EngineOpened() | EngineFinal() | EnginePartial() | EngineEndpoint():
                expected = state in _ENGINE_STATES[type(event)]
                if code is not (None if expected else ErrorCode.SERVER_ERROR):
                    self._fail(wrong)
            case BinaryReceived(data=data, final=final):
                if state is not State.STREAMING:
                    if code not in (ErrorCode.INVALID_AUDIO, ErrorCode.INVALID_MESSAGE):
                        self._fail(f"{wrong}: audio is accepted only while streaming")
                elif final and not closed:
                    if len(actions) != 1 or not isinstance(actions[0], Feed):
                        self._fail(f"an accepted frame gave {actions!r}")
                    if data and actions[0].pcm[-len(data) :] != data:
                        self._fail("the fed frame does not end with the received bytes")
            case AudioBatch(frames=frames):
                if state is not State.STREAMING:
                    if code not in (ErrorCode.INVALID_AUDIO, ErrorCode.INVALID_MESSAGE):
                        self._fail(f"{wrong}: audio is accepted only while streaming")
                elif not closed:
                    fed = [a for a in actions if isinstance(a, Feed)]
                    joined = b"".join(frames)
                    if len(actions) != len(fed) or b"".join(f.pcm for f in fed) != joined:
                        self._fail(f"an accepted batch gave {actions!r}")
