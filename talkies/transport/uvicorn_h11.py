"""uvicorn's h11 protocol, answering what it refuses by itself in OpenAI's error shape.

Under uvicorn, h11 parses the request (its head, and a chunked body) before the ASGI app sees
it, and uvicorn answers what h11 refuses with a plain-text 400 of its own ("Invalid HTTP
request received."): a malformed head, a transfer coding other than chunked, a chunk size
that is not hex, a chunk shorter than it declared. The app never hears of these requests, so
only the protocol can change that answer. :class:`TalkiesH11Protocol` is uvicorn's own
``H11Protocol`` with that one answer replaced by the one the standalone server gives (a 400
in OpenAI's error shape, code ``http_error``), so both hosts answer a client's broken framing
alike (docs/reliability.md, rows ``chunk-size-not-hex``, ``chunk-shorter-than-declared``,
``transfer-coding-unknown``). Everything else is uvicorn's.

uvicorn's command line takes only its own names for ``--http``; give the class in Python::

    uvicorn.run(create_app(), http=TalkiesH11Protocol, ...)
    uvicorn.Config(app, http="talkies.transport.uvicorn_h11:TalkiesH11Protocol", ...)

This module needs uvicorn (with h11, uvicorn's default without ``httptools``).
"""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..app.http import error_response

__all__ = ["TalkiesH11Protocol"]


class TalkiesH11Protocol(H11Protocol):
    """uvicorn's h11 protocol whose own 400s are OpenAI-shaped (see the module)."""

    def send_400_response(self, msg: str) -> None:
        # A request whose head was parsed and whose body h11 could not read (the app is
        # already running: its receive() sees the disconnect when the connection closes),
        # or a head h11 could not parse at all.
        cycle = getattr(self, "cycle", None)
        in_body = cycle is not None and cycle.more_body and not cycle.response_complete
        message = "malformed request body" if in_body else "malformed request"
        response = error_response(400, message, code="http_error")
        body = response.body if isinstance(response.body, bytes) else b""
        headers = [
            *response.headers,
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        head_request = in_body and cycle is not None and cycle.scope.get("method") == "HEAD"
        try:
            event = h11.Response(status_code=400, headers=headers, reason=b"Bad Request")
            self.transport.write(self.conn.send(event) or b"")
            if not head_request:  # a HEAD's answer has no body: h11 refuses one
                self.transport.write(self.conn.send(h11.Data(data=body)) or b"")
            self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
        except h11.LocalProtocolError:
            pass  # the app's answer had begun: the close is all that is left to say
        finally:
            self.transport.close()
