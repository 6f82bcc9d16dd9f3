"""The application layer: every route written once (the WebSocket route included), hosted by
the standalone server (h11) and by any ASGI server (:mod:`talkies.transport.asgi`)."""

from .app import WEBSOCKET_PATHS, TalkiesApp, auth_schemes
from .http import bearer_ok
from .websocket import STREAM_PATH, SUBPROTOCOL, websocket_admission

__all__ = [
    "STREAM_PATH",
    "SUBPROTOCOL",
    "WEBSOCKET_PATHS",
    "TalkiesApp",
    "auth_schemes",
    "bearer_ok",
    "websocket_admission",
]
