"""The HTTP application layer: routes written once, hosted by the standalone server (h11)
and by any ASGI server (:mod:`talkies.transport.asgi`)."""

from .app import STREAM_PATH, SUBPROTOCOL, TalkiesApp, bearer_ok, websocket_admission

__all__ = ["STREAM_PATH", "SUBPROTOCOL", "TalkiesApp", "bearer_ok", "websocket_admission"]
