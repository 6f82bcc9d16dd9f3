"""Error codes and WebSocket close codes of the live-ASR contract.

Spec: "Errors and close codes". One enum owns the whole code -> close-code table, so
the mapping cannot drift between the parser, the session and the transports.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

__all__ = ["CloseCode", "ErrorCode", "ProtocolError"]


class CloseCode(IntEnum):
    """WebSocket close codes the server uses."""

    NORMAL = 1000  # normal end or cancel
    GOING_AWAY = 1001  # server shutdown (RFC 6455); not a spec error, no error object
    INVALID = 4400  # invalid control JSON, start object, frame, or duration limit
    UNAUTHORIZED = 4401  # missing or invalid bearer token; no error object
    UNKNOWN_MODEL = 4404
    IDLE_TIMEOUT = 4408
    CONFLICT = 4409  # model cannot stream, or another model is pinned
    LIMIT = 4429  # global or per-model concurrency limit
    SERVER_ERROR = 4500  # backend or internal failure


class ErrorCode(StrEnum):
    """Every ``code`` value an ``error`` event may carry; ``close_code`` gives its close code."""

    INVALID_JSON = "invalid_json"
    INVALID_MESSAGE = "invalid_message"
    INVALID_EVENT = "invalid_event"
    INVALID_FIELD = "invalid_field"
    INVALID_MODEL = "invalid_model"
    INVALID_LANGUAGE = "invalid_language"
    MISSING_FIELD = "missing_field"
    UNKNOWN_FIELD = "unknown_field"
    DUPLICATE_FIELD = "duplicate_field"
    MESSAGE_TOO_LARGE = "message_too_large"
    UNSUPPORTED_ENCODING = "unsupported_encoding"
    UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"
    UNSUPPORTED_CHANNELS = "unsupported_channels"
    INVALID_AUDIO = "invalid_audio"
    EMPTY_AUDIO = "empty_audio"
    FRAME_TOO_LARGE = "frame_too_large"
    UNALIGNED_AUDIO = "unaligned_audio"
    DURATION_LIMIT = "duration_limit"
    UNKNOWN_MODEL = "unknown_model"
    IDLE_TIMEOUT = "idle_timeout"
    STREAMING_NOT_SUPPORTED = "streaming_not_supported"
    MODEL_BUSY = "model_busy"
    CONNECTION_LIMIT = "connection_limit"
    SERVER_ERROR = "server_error"

    @property
    def close_code(self) -> CloseCode:
        return _CLOSE_CODES[self]


# The spec's table, in its order. A test checks it names every member exactly once.
_CLOSE_CODES: dict[ErrorCode, CloseCode] = {
    ErrorCode.INVALID_JSON: CloseCode.INVALID,
    ErrorCode.INVALID_MESSAGE: CloseCode.INVALID,
    ErrorCode.INVALID_EVENT: CloseCode.INVALID,
    ErrorCode.INVALID_FIELD: CloseCode.INVALID,
    ErrorCode.INVALID_MODEL: CloseCode.INVALID,
    ErrorCode.INVALID_LANGUAGE: CloseCode.INVALID,
    ErrorCode.MISSING_FIELD: CloseCode.INVALID,
    ErrorCode.UNKNOWN_FIELD: CloseCode.INVALID,
    ErrorCode.DUPLICATE_FIELD: CloseCode.INVALID,
    ErrorCode.MESSAGE_TOO_LARGE: CloseCode.INVALID,
    ErrorCode.UNSUPPORTED_ENCODING: CloseCode.INVALID,
    ErrorCode.UNSUPPORTED_SAMPLE_RATE: CloseCode.INVALID,
    ErrorCode.UNSUPPORTED_CHANNELS: CloseCode.INVALID,
    ErrorCode.INVALID_AUDIO: CloseCode.INVALID,
    ErrorCode.EMPTY_AUDIO: CloseCode.INVALID,
    ErrorCode.FRAME_TOO_LARGE: CloseCode.INVALID,
    ErrorCode.UNALIGNED_AUDIO: CloseCode.INVALID,
    ErrorCode.DURATION_LIMIT: CloseCode.INVALID,
    ErrorCode.UNKNOWN_MODEL: CloseCode.UNKNOWN_MODEL,
    ErrorCode.IDLE_TIMEOUT: CloseCode.IDLE_TIMEOUT,
    ErrorCode.STREAMING_NOT_SUPPORTED: CloseCode.CONFLICT,
    ErrorCode.MODEL_BUSY: CloseCode.CONFLICT,
    ErrorCode.CONNECTION_LIMIT: CloseCode.LIMIT,
    ErrorCode.SERVER_ERROR: CloseCode.SERVER_ERROR,
}


class ProtocolError(Exception):
    """A rejected input: the code the client sees, a detail for it, and the cause for logs.

    It is raised only inside the parser and caught by the session, which turns it into an
    ``error`` event and a close (the websockets ``fail()`` pattern); it never escapes
    :class:`~talkies.protocol.session.StreamSession`.
    """

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(f"{code.value}: {detail}")
        self.code = code
        self.detail = detail
