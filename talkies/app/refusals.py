"""The one place where what engines and the pool refuse becomes what a client receives.

Engines and the pool refuse in one vocabulary, :class:`~talkies.engines.base.Refusal` (a
:class:`~talkies.engines.base.RefusalKind`, a detail written for the client, the field at
fault); :class:`~talkies.engines.base.EngineUnavailable` is a model that cannot be served at
all. A live stream gets the contract's error code and so its close code
(:func:`stream_refusal`); an HTTP request gets a status and an OpenAI-shaped error
(:func:`http_error`). Like httpcore's ``map_exceptions``, the tables are data, read once.
"""

from __future__ import annotations

from ..engines.base import EngineUnavailable, Refusal, RefusalKind
from ..protocol import ErrorCode, Refused
from .http import HttpError

__all__ = ["HTTP_STATUSES", "http_error", "stream_refusal"]

# kind -> (HTTP status, the error's ``code``, the ``param`` when the refusal names no field)
HTTP_STATUSES: dict[RefusalKind, tuple[int, str, str | None]] = {
    RefusalKind.UNKNOWN_MODEL: (404, "model_not_found", "model"),
    RefusalKind.STREAMING_NOT_SUPPORTED: (400, "streaming_not_supported", "model"),
    RefusalKind.MODEL_BUSY: (409, "model_busy", "model"),
    RefusalKind.CONNECTION_LIMIT: (429, "model_full", "model"),
    RefusalKind.INVALID_LANGUAGE: (400, "invalid_language", "language"),
    RefusalKind.MODEL_IN_USE: (409, "model_in_use", None),
    RefusalKind.INVALID_INPUT: (400, "invalid_input", None),
    RefusalKind.UNKNOWN_VOICE: (400, "unknown_voice", None),
    RefusalKind.UNSUPPORTED: (400, "unsupported", None),
}


def http_error(exc: Refusal | EngineUnavailable) -> HttpError:
    """The HTTP answer to a refusal (a 500 ``server_error`` for a model that cannot be
    served: its message is written for the client, its cause was logged)."""
    if isinstance(exc, EngineUnavailable):
        return HttpError(500, str(exc), code="server_error")
    status, code, param = HTTP_STATUSES[exc.kind]
    return HttpError(status, exc.detail, code=code, param=exc.field or param)


def stream_refusal(exc: Refusal) -> Refused:
    """The session input for a stream the provider would not open: the contract's error
    code of the same name (its close code follows from it, :mod:`talkies.protocol.errors`).
    A kind that only requests have is the server's fault on a stream."""
    return Refused(code=exc.code or ErrorCode.SERVER_ERROR, detail=exc.detail)
