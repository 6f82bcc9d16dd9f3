"""The app layer's one ASGI translation (talkies/app/asgi.py): each direction is the other's
reverse, so the ASGI host and the MCP bridge agree on what a request and a response are."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from talkies.app.asgi import (
    Message,
    Receive,
    Send,
    call_asgi,
    request_from_scope,
    scope_from_request,
    send_response,
)
from talkies.app.http import Request, Response

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _request() -> Request:
    return Request(
        method="POST",
        path="/mcp/a%20b",
        query="x=1&y=%C3%A9",
        headers=[(b"content-type", b"application/json"), (b"x-twice", b"1"), (b"x-twice", b"2")],
    )


async def test_a_request_survives_the_way_there_and_back() -> None:
    sent = _request()

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    back = request_from_scope(scope_from_request(sent), receive, max_body=10, body_timeout=1.0)
    assert (back.method, back.path, back.query, back.headers) == (
        sent.method,
        sent.path,
        sent.query,
        sent.headers,
    )


async def test_a_response_survives_the_way_there_and_back() -> None:
    body = b'{"ok":true}'
    response = Response(status=202, headers=[(b"content-type", b"application/json")], body=body)

    async def app(scope: Any, receive: Receive, send: Send) -> None:
        assert (await receive())["body"] == b"{}"
        await send_response(send, _request(), response)

    with anyio.fail_after(5):
        back = await call_asgi(app, _request(), b"{}")
    assert back is not None
    # The host frames the body itself: the length send_response added is not passed on.
    assert (back.status, back.headers, back.body) == (202, response.headers, body)


async def test_an_application_that_sends_nothing() -> None:
    async def app(scope: Any, receive: Receive, send: Send) -> None:
        pass

    assert await call_asgi(app, _request(), b"") is None
