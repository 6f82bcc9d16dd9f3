"""The one table of every ``(state, input)`` transition of a live-ASR session.

h2 and h11 keep their transitions as data; so do we. ``_ALLOWED`` lists what each state
accepts and which states the handler may lead to. Anything not listed is rejected with the
input's rejection code (``_REJECTED``): a missing entry is a protocol error by construction,
never an unhandled case. ``TABLE`` is the total table both expanded; tests walk every cell and
``tools/gen_protocol_docs.py`` draws the state diagram from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType

from .errors import ErrorCode

__all__ = ["TABLE", "Handler", "InputKind", "Rule", "State", "rule_for"]


# StrEnum, not Enum: str's C-level (cached) hash keeps the per-frame table lookup cheap;
# plain Enum hashes in Python code (measured here: 400 ns -> 150 ns per lookup).
class State(StrEnum):
    AWAITING_START = "awaiting_start"  # accepted; waiting for the start message
    OPENING = "opening"  # start was valid; the driver is resolving the model
    STREAMING = "streaming"  # ready was sent; audio flows
    FLUSHING = "flushing"  # end was received; waiting for the final result
    CLOSED = "closed"  # terminal: every later input is ignored


class InputKind(StrEnum):
    """Inputs after message assembly and envelope parsing."""

    TEXT_PART = "text_part"  # a text fragment that is not the message's last
    START = "start"  # a complete text message of type "start"
    END = "end"
    CANCEL = "cancel"
    OTHER_TYPE = "other_type"  # a complete JSON object with any other "type"
    MALFORMED = "malformed"  # a message the assembler or envelope parser rejected
    AUDIO_PART = "audio_part"  # a binary fragment that is not the message's last
    AUDIO = "audio"  # the last (or only) fragment of a binary message
    AUDIO_BATCH = "audio_batch"  # whole binary messages in a row (AudioBatch)
    CUT = "cut"  # a translator's CutRequested (no native message)
    ENGINE_OPENED = "engine_opened"
    ENGINE_PARTIAL = "engine_partial"
    ENGINE_ENDPOINT = "engine_endpoint"
    ENGINE_FINAL = "engine_final"
    ENGINE_FAILED = "engine_failed"
    REFUSED = "refused"
    AUTH_REJECTED = "auth_rejected"
    PEER_GONE = "peer_gone"
    SHUTTING_DOWN = "shutting_down"
    TICK = "tick"


class Handler(StrEnum):
    """Names of the session's handlers; ``REJECT`` fails with the rule's code."""

    START = "start"
    END = "end"
    CANCEL = "cancel"
    BUFFER_TEXT = "buffer_text"
    BUFFER_AUDIO = "buffer_audio"
    AUDIO = "audio"
    AUDIO_BATCH = "audio_batch"
    CUT = "cut"
    OPENED = "opened"
    PARTIAL = "partial"
    ENDPOINT = "endpoint"
    FINAL = "final"
    ENGINE_FAILED = "engine_failed"
    REFUSED = "refused"
    AUTH_REJECTED = "auth_rejected"
    PEER_GONE = "peer_gone"
    SHUTDOWN = "shutdown"
    TICK = "tick"
    MALFORMED = "malformed"  # fail with the code the parser attached to the input
    REJECT = "reject"  # fail with Rule.code
    IGNORE = "ignore"  # no action: late inputs after the session closed


@dataclass(frozen=True, slots=True)
class Rule:
    handler: Handler
    next: frozenset[State]  # every state the handler may leave the session in
    code: ErrorCode | None = None  # only for Handler.REJECT


_S = State
_K = InputKind
_OPEN = (_S.AWAITING_START, _S.OPENING, _S.STREAMING, _S.FLUSHING)
_ENGINE_HELD = (_S.OPENING, _S.STREAMING, _S.FLUSHING)


def _rule(handler: Handler, *states: State) -> Rule:
    return Rule(handler, frozenset(states))


def _allowed() -> dict[tuple[State, InputKind], Rule]:
    t: dict[tuple[State, InputKind], Rule] = {}
    for s in _OPEN:
        # Every open state: fragments of a text message are buffered (the size cap is checked
        # on each), a malformed message fails with its parser code, and the transport's facts
        # and timers are always heard.
        t[s, _K.TEXT_PART] = _rule(Handler.BUFFER_TEXT, s, _S.CLOSED)
        t[s, _K.MALFORMED] = _rule(Handler.MALFORMED, _S.CLOSED)
        t[s, _K.REFUSED] = _rule(Handler.REFUSED, _S.CLOSED)
        t[s, _K.PEER_GONE] = _rule(Handler.PEER_GONE, _S.CLOSED)
        t[s, _K.SHUTTING_DOWN] = _rule(Handler.SHUTDOWN, _S.CLOSED)
        t[s, _K.TICK] = _rule(Handler.TICK, s, _S.CLOSED)
    for s in _ENGINE_HELD:
        t[s, _K.ENGINE_FAILED] = _rule(Handler.ENGINE_FAILED, _S.CLOSED)
        # cancel is honoured wherever an engine stream exists, also while opening or flushing:
        # it is how a client abandons a stream without an error (docs/protocol.md).
        t[s, _K.CANCEL] = _rule(Handler.CANCEL, _S.CLOSED)

    t[_S.AWAITING_START, _K.START] = _rule(Handler.START, _S.OPENING, _S.CLOSED)
    t[_S.AWAITING_START, _K.AUTH_REJECTED] = _rule(Handler.AUTH_REJECTED, _S.CLOSED)

    t[_S.OPENING, _K.ENGINE_OPENED] = _rule(Handler.OPENED, _S.STREAMING)

    t[_S.STREAMING, _K.END] = _rule(Handler.END, _S.FLUSHING, _S.CLOSED)
    t[_S.STREAMING, _K.AUDIO_PART] = _rule(Handler.BUFFER_AUDIO, _S.STREAMING, _S.CLOSED)
    t[_S.STREAMING, _K.AUDIO] = _rule(Handler.AUDIO, _S.STREAMING, _S.CLOSED)
    t[_S.STREAMING, _K.AUDIO_BATCH] = _rule(Handler.AUDIO_BATCH, _S.STREAMING, _S.CLOSED)
    t[_S.STREAMING, _K.CUT] = _rule(Handler.CUT, _S.STREAMING)
    t[_S.STREAMING, _K.ENGINE_PARTIAL] = _rule(Handler.PARTIAL, _S.STREAMING)
    t[_S.STREAMING, _K.ENGINE_ENDPOINT] = _rule(Handler.ENDPOINT, _S.STREAMING)

    # While flushing, the engine may still report hypotheses and endpoints before its final.
    t[_S.FLUSHING, _K.ENGINE_PARTIAL] = _rule(Handler.PARTIAL, _S.FLUSHING)
    t[_S.FLUSHING, _K.ENGINE_ENDPOINT] = _rule(Handler.ENDPOINT, _S.FLUSHING)
    t[_S.FLUSHING, _K.ENGINE_FINAL] = _rule(Handler.FINAL, _S.CLOSED)

    for k in InputKind:
        t[_S.CLOSED, k] = _rule(Handler.IGNORE, _S.CLOSED)
    return t


# What an open state does with an input it does not list: the client's inputs are protocol
# errors (4400); the driver's are bugs in the driver, reported to the client as 4500.
_REJECTED: dict[InputKind, ErrorCode] = {
    _K.TEXT_PART: ErrorCode.INVALID_EVENT,
    _K.START: ErrorCode.INVALID_EVENT,
    _K.END: ErrorCode.INVALID_EVENT,
    _K.CANCEL: ErrorCode.INVALID_EVENT,
    _K.OTHER_TYPE: ErrorCode.INVALID_EVENT,
    _K.MALFORMED: ErrorCode.INVALID_MESSAGE,
    _K.AUDIO_PART: ErrorCode.INVALID_AUDIO,
    _K.AUDIO: ErrorCode.INVALID_AUDIO,
    _K.AUDIO_BATCH: ErrorCode.INVALID_AUDIO,
    _K.CUT: ErrorCode.SERVER_ERROR,  # a translator's bug: it holds cuts until ready
    _K.ENGINE_OPENED: ErrorCode.SERVER_ERROR,
    _K.ENGINE_PARTIAL: ErrorCode.SERVER_ERROR,
    _K.ENGINE_ENDPOINT: ErrorCode.SERVER_ERROR,
    _K.ENGINE_FINAL: ErrorCode.SERVER_ERROR,
    _K.ENGINE_FAILED: ErrorCode.SERVER_ERROR,
    _K.REFUSED: ErrorCode.SERVER_ERROR,
    _K.AUTH_REJECTED: ErrorCode.SERVER_ERROR,
    _K.PEER_GONE: ErrorCode.SERVER_ERROR,
    _K.SHUTTING_DOWN: ErrorCode.SERVER_ERROR,
    _K.TICK: ErrorCode.SERVER_ERROR,
}

ALLOWED: Mapping[tuple[State, InputKind], Rule] = MappingProxyType(_allowed())


def _total() -> dict[tuple[State, InputKind], Rule]:
    table: dict[tuple[State, InputKind], Rule] = {}
    for s in State:
        for k in InputKind:
            rule = ALLOWED.get((s, k))
            if rule is None:
                rule = Rule(Handler.REJECT, frozenset({_S.CLOSED}), _REJECTED[k])
            table[s, k] = rule
    return table


TABLE: Mapping[tuple[State, InputKind], Rule] = MappingProxyType(_total())


def rule_for(state: State, kind: InputKind) -> Rule:
    return TABLE[state, kind]
