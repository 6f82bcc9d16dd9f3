"""``StreamSession``: one live-ASR WebSocket connection as a pure state machine.

Spec: "Live ASR over WebSocket". The session never sees a socket, a clock or a thread. A
driver (the anyio server, the ASGI adapter, a test, a fuzzer) feeds it inputs with
``handle(input, now)`` and executes the actions it pulls with ``pull_actions()``. The same
inputs always give the same actions.

Transitions live in :mod:`.table`; this module holds the handlers the table names. Every
failure goes through ``_fail`` (error event, release, close) and nothing raises out of
``handle``: a handler bug becomes ``server_error`` with the exception kept for the logs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from .actions import Action, Close, Cut, Feed, Flush, Open, Release, Send
from .errors import CloseCode, ErrorCode, ProtocolError
from .events import (
    SAMPLE_RATE,
    Endpoint,
    Error,
    Final,
    Partial,
    Ready,
    Stats,
    TranscriptEvent,
    Word,
)
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
    TextReceived,
    Tick,
)
from .lag import LagRecord, clean_lag
from .messages import (
    MAX_CONTROL_BYTES,
    Envelope,
    MessageType,
    StartOptions,
    check_control,
    parse_envelope,
    parse_start,
)
from .table import Handler, InputKind, Rule, State, rule_for

__all__ = ["SessionLimits", "StreamSession"]

_T = TypeVar("_T", bound=TranscriptEvent)

# Module constants: attribute access on an Enum class is slow, and this is the per-frame path.
_AUDIO = InputKind.AUDIO
_AUDIO_PART = InputKind.AUDIO_PART
_AUDIO_BATCH = InputKind.AUDIO_BATCH
_AWAITING_START = State.AWAITING_START
_STREAMING = State.STREAMING
_CLIENT_INPUTS = (BinaryReceived, TextReceived, AudioBatch, CutRequested)

_ENVELOPE_KINDS = {
    MessageType.START: InputKind.START,
    MessageType.END: InputKind.END,
    MessageType.CANCEL: InputKind.CANCEL,
    MessageType.OTHER: InputKind.OTHER_TYPE,
}

_DRIVER_KINDS: dict[type, InputKind] = {
    CutRequested: InputKind.CUT,
    EngineOpened: InputKind.ENGINE_OPENED,
    EnginePartial: InputKind.ENGINE_PARTIAL,
    EngineEndpoint: InputKind.ENGINE_ENDPOINT,
    EngineFinal: InputKind.ENGINE_FINAL,
    EngineFailed: InputKind.ENGINE_FAILED,
    Refused: InputKind.REFUSED,
    AuthRejected: InputKind.AUTH_REJECTED,
    PeerGone: InputKind.PEER_GONE,
    ShuttingDown: InputKind.SHUTTING_DOWN,
    Tick: InputKind.TICK,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class SessionLimits:
    """The per-connection limits of the contract, in the session's own units."""

    max_frame_bytes: int = 65536  # TALKIES_STREAM_MAX_FRAME_BYTES
    max_duration_seconds: float = 4 * 3600.0  # TALKIES_STREAM_MAX_DURATION
    idle_timeout_seconds: float = 30.0  # TALKIES_STREAM_IDLE_TIMEOUT
    # TALKIES_STREAM_START_TIMEOUT: a connection must have sent a valid start this soon
    # after it was accepted, however its messages trickle in (closed like an idle one, 4408).
    start_timeout_seconds: float = 5.0

    def __post_init__(self) -> None:
        if self.max_frame_bytes < 2:
            raise ValueError("max_frame_bytes must be at least 2")
        for name in ("max_duration_seconds", "idle_timeout_seconds", "start_timeout_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number")

    @property
    def max_samples(self) -> int:
        return math.floor(self.max_duration_seconds * SAMPLE_RATE)


def _clean_text(text: str) -> str:
    """Engine text is sent as UTF-8: replace lone surrogates rather than fail to encode."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")
    return text


_HandlerFn = Callable[[Rule, Input, object], None]


class StreamSession:
    """The protocol state of one live-ASR connection."""

    def __init__(self, limits: SessionLimits | None = None, *, now: float) -> None:
        self.limits = limits if limits is not None else SessionLimits()
        self.state = State.AWAITING_START
        self.options: StartOptions | None = None
        self.frames = 0  # accepted binary messages
        self.samples = 0  # accepted samples
        self.revision = 0  # of the last transcript event sent
        self.close_code: CloseCode | None = None
        self.error: ProtocolError | None = None  # why the session failed, for logs
        self.outcome: str | None = None  # how it ended: "end", "cancel", an error code, ...
        self._max_samples = self.limits.max_samples
        self._actions: list[Action] = []
        self._idle_since = now
        self._now = now
        # Fixed when the connection is accepted: unlike the idle deadline, no client message
        # moves it (fragments of a start that never ends would otherwise hold the connection).
        self.start_deadline = now + self.limits.start_timeout_seconds
        self._stream_held = False
        self._text_parts: bytearray | None = None
        self._audio_parts: list[bytes] | None = None
        self._audio_size = 0
        self._hypothesis: tuple[str, tuple[Word, ...]] = ("", ())
        self._stable: int | None = None  # the partial's stable prefix (EnginePartial.stable)
        self.lag = LagRecord()  # the lag the engine's results carried, for stats
        self._handlers: dict[Handler, _HandlerFn] = {
            h: getattr(self, f"_on_{h.value}") for h in Handler
        }

    # -- the driver's interface --------------------------------------------------------------

    def handle(self, event: Input, now: float) -> None:
        """Consume one input at time ``now`` (seconds on any monotonic clock)."""
        kind, payload = self._classify(event)
        if isinstance(event, _CLIENT_INPUTS) and getattr(event, "frame_end", True):
            # The idle timeout runs between client messages and frames, not bytes of a frame.
            self._idle_since = now
        self._now = now
        rule = rule_for(self.state, kind)
        try:
            self._handlers[rule.handler](rule, event, payload)
        except ProtocolError as exc:
            self._fail(exc)
        except Exception as exc:  # a bug in a handler: contain it, keep the cause
            failure = ProtocolError(ErrorCode.SERVER_ERROR, "internal error")
            failure.__cause__ = exc
            self._fail(failure)
        if self.state not in rule.next:
            # The table promised otherwise: treat it as an internal error, not a silent drift.
            self._fail(ProtocolError(ErrorCode.SERVER_ERROR, "internal state error"))

    def pull_actions(self) -> list[Action]:
        """Return and forget the actions produced since the last call, in order."""
        actions, self._actions = self._actions, []
        return actions

    @property
    def deadline(self) -> float | None:
        """When the driver should deliver the next :class:`Tick`, or None for no timer.

        The idle timeout (spec: 4408) runs between client messages while the client is the
        one expected to talk: before start and while streaming. It is paused while the server
        opens the model or flushes, which are the server's time, not the client's. Before
        start, the start deadline applies too, whichever comes first: a connection that has
        not sent a valid start within the start timeout is closed like an idle one.
        """
        state = self.state
        if state is _AWAITING_START:
            return min(self._idle_since + self.limits.idle_timeout_seconds, self.start_deadline)
        if state is _STREAMING:
            return self._idle_since + self.limits.idle_timeout_seconds
        return None

    @property
    def audio_seconds(self) -> float:
        return self.samples / SAMPLE_RATE

    @property
    def stream_held(self) -> bool:
        """True between ``Open`` and its ``Release``."""
        return self._stream_held

    # -- assembly: fragments to messages, bytes to envelopes ---------------------------------

    def _classify(self, event: Input) -> tuple[InputKind, object]:
        """The input's kind for the table, and what its handler needs (bytes, an envelope).

        Client messages that fail assembly or envelope parsing are ``MALFORMED`` and carry
        their ``ProtocolError``; whether that ends the session is the table's decision.
        """
        try:
            return self._assemble(event)
        except ProtocolError as exc:
            return InputKind.MALFORMED, exc

    def _assemble(self, event: Input) -> tuple[InputKind, object]:
        if type(event) is AudioBatch:
            if self._text_parts is not None or self._audio_parts is not None:
                raise ProtocolError(
                    ErrorCode.INVALID_MESSAGE, "whole messages inside an unfinished message"
                )
            return _AUDIO_BATCH, None
        if isinstance(event, BinaryReceived):
            if self._text_parts is not None:
                raise ProtocolError(
                    ErrorCode.INVALID_MESSAGE, "binary message inside an unfinished text message"
                )
            return (_AUDIO if event.final else _AUDIO_PART), None
        if isinstance(event, TextReceived):
            return self._classify_text(event)
        return _DRIVER_KINDS[type(event)], None

    def _classify_text(self, event: TextReceived) -> tuple[InputKind, object]:
        if self._audio_parts is not None:
            raise ProtocolError(
                ErrorCode.INVALID_MESSAGE, "text message inside an unfinished binary message"
            )
        buffered = len(self._text_parts) if self._text_parts is not None else 0
        data = event.data
        if isinstance(data, str):
            # Each character is at least one UTF-8 byte: refuse a huge str before encoding it.
            if len(data) > MAX_CONTROL_BYTES - buffered:
                raise _too_large()
            # surrogatepass: a lone surrogate becomes bytes that fail strict UTF-8 decoding
            # below, so it is reported as invalid_json like any other undecodable text.
            data = data.encode("utf-8", "surrogatepass")
        if len(data) > MAX_CONTROL_BYTES - buffered:
            raise _too_large()
        if not event.final:
            return InputKind.TEXT_PART, data
        if self._text_parts is not None:
            self._text_parts += data
            data = bytes(self._text_parts)
            self._text_parts = None
        envelope = parse_envelope(data)
        return _ENVELOPE_KINDS[envelope.type], envelope

    # -- handlers named by the table ----------------------------------------------------------

    def _on_start(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(payload, Envelope)
        options = parse_start(payload.body)
        self.options = options
        self.state = State.OPENING
        self._stream_held = True
        self._actions.append(Open(options=options))

    def _on_end(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(payload, Envelope)
        check_control(payload)
        self.state = State.FLUSHING
        self._actions.append(Flush())

    def _on_cancel(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(payload, Envelope)
        check_control(payload)
        self._finish((self._stats(canceled=True),), CloseCode.NORMAL, "cancel")

    def _on_buffer_text(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(payload, bytes)
        if self._text_parts is None:
            self._text_parts = bytearray(payload)
        else:
            self._text_parts += payload

    def _on_buffer_audio(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(event, BinaryReceived)
        data = event.data
        self._check_frame_size(self._audio_size + len(data))
        if self._audio_parts is None:
            self._audio_parts = []
        if data:  # empty fragments add nothing: kept, they would grow memory without bound
            self._audio_parts.append(data)
            self._audio_size += len(data)

    def _on_audio(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(event, BinaryReceived)
        pcm = event.data
        if self._audio_parts is not None:
            self._check_frame_size(self._audio_size + len(pcm))
            self._audio_parts.append(pcm)
            pcm = b"".join(self._audio_parts)
            self._audio_parts = None
            self._audio_size = 0
        samples = self.samples + (len(pcm) >> 1)
        error = self._frame_error(len(pcm), samples)
        if error is not None:
            raise error
        self.samples = samples
        self.frames += 1
        self._actions.append(Feed(pcm=pcm))

    def _on_audio_batch(self, rule: Rule, event: Input, payload: object) -> None:
        # The same checks as _on_audio, frame by frame; the accepted prefix is fed even when
        # a later frame fails, exactly as if the frames had come one input at a time.
        assert isinstance(event, AudioBatch)
        frames = event.frames
        sizes = [len(f) for f in frames]
        error = None
        if (
            sizes
            and min(sizes) > 0
            and max(sizes) <= self.limits.max_frame_bytes
            and not any(size & 1 for size in sizes)
            and self.samples + (sum(sizes) >> 1) <= self._max_samples
        ):
            accepted = len(frames)  # the common case, checked for the whole batch at once
        else:
            samples = self.samples
            accepted = 0
            for size in sizes:
                samples += size >> 1
                error = self._frame_error(size, samples)
                if error is not None:
                    break
                accepted += 1
        if accepted:
            self.samples += sum(sizes[:accepted]) >> 1
            self.frames += accepted
            pcm = bytes(frames[0]) if accepted == 1 else b"".join(frames[:accepted])
            self._actions.append(Feed(pcm=pcm, frames=accepted))
        if error is not None:
            raise error

    def _frame_error(self, size: int, samples: int) -> ProtocolError | None:
        """Why a whole frame of ``size`` bytes is refused (``samples``: the total with it)."""
        if size > self.limits.max_frame_bytes:
            return self._too_large_frame()
        if size == 0:
            return ProtocolError(ErrorCode.EMPTY_AUDIO, "audio frames must not be empty")
        if size & 1:
            return ProtocolError(
                ErrorCode.UNALIGNED_AUDIO,
                f"audio frame of {size} bytes is not a whole number of 16-bit samples",
            )
        if samples > self._max_samples:
            return ProtocolError(
                ErrorCode.DURATION_LIMIT,
                f"audio exceeds the limit of {self.limits.max_duration_seconds:g} seconds",
            )
        return None

    def _check_frame_size(self, size: int) -> None:
        # Spec: frames are "no larger than TALKIES_STREAM_MAX_FRAME_BYTES"; checked on each
        # fragment, before it is buffered.
        if size > self.limits.max_frame_bytes:
            raise self._too_large_frame()

    def _too_large_frame(self) -> ProtocolError:
        return ProtocolError(
            ErrorCode.FRAME_TOO_LARGE,
            f"audio frame exceeds the limit of {self.limits.max_frame_bytes} bytes",
        )

    def _on_opened(self, rule: Rule, event: Input, payload: object) -> None:
        assert self.options is not None
        self.state = State.STREAMING
        self._idle_since = self._now  # the client's clock starts when it is told to talk
        self._actions.append(Send(event=Ready(model=self.options.model)))

    def _on_partial(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(event, EnginePartial)
        assert self.options is not None
        text, words = _clean_text(event.text), self._words(event.words)
        lag = self._lag(event.lag)
        stable = None if event.stable is None else max(0, min(event.stable, len(text)))
        if (text, words) == self._hypothesis and stable == self._stable:
            return  # an unchanged hypothesis is not a revision
        self._hypothesis, self._stable = (text, words), stable
        if self.options.interim_results:
            self._actions.append(Send(event=self._event(Partial, text, words, lag, stable=stable)))

    def _on_endpoint(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(event, EngineEndpoint)
        text, words = _clean_text(event.text), self._words(event.words)
        lag = self._lag(event.lag)
        previous, self._hypothesis, self._stable = self._hypothesis, ("", ()), None
        if event.cut:  # a translator counts on one answer per cut, empty or not
            self._actions.append(Send(event=self._event(Endpoint, text, words, lag, cut=True)))
            return
        if not text and not words and previous == ("", ()):
            # An empty utterance after an empty hypothesis tells the client nothing: silence.
            return
        self._actions.append(Send(event=self._event(Endpoint, text, words, lag)))

    def _on_final(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(event, EngineFinal)
        text, words = _clean_text(event.text), self._words(event.words)
        lag = self._lag(event.lag)
        final = self._event(Final, text, words, lag)
        self._finish((final, self._stats(canceled=False)), CloseCode.NORMAL, "end")

    def _on_engine_failed(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(event, EngineFailed)
        raise ProtocolError(ErrorCode.SERVER_ERROR, _clean_text(event.detail))

    def _on_refused(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(event, Refused)
        raise ProtocolError(event.code, _clean_text(event.detail))

    def _on_auth_rejected(self, rule: Rule, event: Input, payload: object) -> None:
        # Spec: "A rejected bearer token closes the upgrade with 4401 and no error object."
        self._finish((), CloseCode.UNAUTHORIZED, "unauthorized")

    def _on_peer_gone(self, rule: Rule, event: Input, payload: object) -> None:
        self._finish((), None, "peer_gone")

    def _on_shutdown(self, rule: Rule, event: Input, payload: object) -> None:
        self._finish((), CloseCode.GOING_AWAY, "shutdown")

    def _on_tick(self, rule: Rule, event: Input, payload: object) -> None:
        deadline = self.deadline
        if deadline is None or self._now < deadline:
            return
        if self.state is _AWAITING_START and self._now >= self.start_deadline:
            raise ProtocolError(
                ErrorCode.IDLE_TIMEOUT,
                f"no start message within {self.limits.start_timeout_seconds:g} seconds",
            )
        raise ProtocolError(
            ErrorCode.IDLE_TIMEOUT,
            f"no message from the client for {self.limits.idle_timeout_seconds:g} seconds",
        )

    def _on_malformed(self, rule: Rule, event: Input, payload: object) -> None:
        assert isinstance(payload, ProtocolError)
        raise payload

    def _on_reject(self, rule: Rule, event: Input, payload: object) -> None:
        assert rule.code is not None
        raise ProtocolError(rule.code, _REJECT_DETAILS[rule.code])

    def _on_ignore(self, rule: Rule, event: Input, payload: object) -> None:
        return

    def _on_cut(self, rule: Rule, event: Input, payload: object) -> None:
        self._actions.append(Cut())

    # -- helpers ---------------------------------------------------------------------------

    def _words(self, words: tuple[Word, ...]) -> tuple[Word, ...]:
        assert self.options is not None
        if not self.options.word_timestamps:
            return ()
        if all(w.word.isascii() for w in words):
            return words
        return tuple(replace(w, word=_clean_text(w.word)) for w in words)

    def _lag(self, seconds: float | None) -> float | None:
        """A result's lag as its event carries it; every result counts towards stats, sent
        or not (an unchanged partial still says how far behind the decoder was)."""
        lag = clean_lag(seconds)
        if lag is not None:
            self.lag.add(lag)
        return lag

    def _stats(self, *, canceled: bool) -> Stats:
        return Stats(
            audio_seconds=self.audio_seconds,
            frames=self.frames,
            canceled=canceled,
            lag=self.lag.summary(),
        )

    def _event(
        self,
        cls: type[_T],
        text: str,
        words: tuple[Word, ...],
        lag: float | None,
        **extension: Any,
    ) -> _T:
        """The next revision's transcript event (``extension``: a partial's ``stable``, an
        endpoint's ``cut``)."""
        self.revision += 1
        return cls(
            revision=self.revision,
            text=text,
            words=words,
            audio_seconds=self.audio_seconds,
            lag=lag,
            **extension,
        )

    def _fail(self, error: ProtocolError) -> None:
        if self.state is State.CLOSED:
            return
        self.error = error
        self._finish(
            (Error(code=error.code, detail=error.detail),), error.code.close_code, error.code.value
        )

    def _finish(
        self,
        events: tuple[Final | Stats | Error, ...],
        code: CloseCode | None,
        outcome: str,
    ) -> None:
        """The one exit: release the engine stream once, send the last events, close."""
        if self._stream_held:
            self._stream_held = False
            self._actions.append(Release())
        for ev in events:
            self._actions.append(Send(event=ev))
        if code is not None:
            reason = "" if code is CloseCode.NORMAL or not events else outcome
            self._actions.append(Close(code=code, reason=reason))
        self.close_code = code
        self.outcome = outcome
        self.state = State.CLOSED
        self._text_parts = None
        self._audio_parts = None
        self._audio_size = 0


def _too_large() -> ProtocolError:
    return ProtocolError(
        ErrorCode.MESSAGE_TOO_LARGE,
        f"control message exceeds the limit of {MAX_CONTROL_BYTES} bytes",
    )


_REJECT_DETAILS: dict[ErrorCode, str] = {
    ErrorCode.INVALID_EVENT: "this message is not allowed in the stream's current state",
    ErrorCode.INVALID_AUDIO: "audio is accepted only after ready and before end",
    ErrorCode.INVALID_MESSAGE: "malformed message",
    ErrorCode.SERVER_ERROR: "internal error",
}
