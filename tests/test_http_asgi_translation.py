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


async def test_a_body_given_as_chunks_is_handed_over_in_order_and_not_kept() -> None:
    """The MCP bridge hands the SDK a large body as the chunks it was read in: one message
    each, ``more_body`` on all but the last, and none of them held here once handed over."""
    chunks = [b"a" * 10, b"b" * 10, b"c" * 5]
    seen: list[tuple[bytes, bool]] = []
    left: list[int] = []

    async def app(scope: Any, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            seen.append((message["body"], message["more_body"]))
            left.append(len(chunks))
            if not message["more_body"]:
                break
        await send_response(send, _request(), Response(status=200, body=b"ok"))

    with anyio.fail_after(5):
        back = await call_asgi(app, _request(), chunks)
    assert back is not None and back.body == b"ok"
    assert seen == [(b"a" * 10, True), (b"b" * 10, True), (b"c" * 5, False)]
    assert left == [2, 1, 0]  # each chunk dropped from the list as it went


async def test_a_trickled_body_meets_the_upload_deadline() -> None:
    """A byte every 0.1 s never stalls (the stall deadline is 1 s here), but the whole body
    must arrive within the upload deadline (TALKIES_UPLOAD_TIMEOUT): a 408 saying which."""
    from talkies.app.http import HttpError

    async def receive() -> Message:
        await anyio.sleep(0.1)
        return {"type": "http.request", "body": b"x", "more_body": True}

    scope = scope_from_request(_request())
    for deadline, expected in ((0.5, "did not arrive within 0.5 s"), (None, "stalled")):
        stall = 1.0 if deadline else 0.05
        back = request_from_scope(
            scope, receive, max_body=100, body_timeout=stall, upload_timeout=deadline
        )
        started = anyio.current_time()
        with pytest.raises(HttpError) as refused:
            await back.body.read()
        assert refused.value.status == 408 and expected in refused.value.message
        if deadline:
            assert 0.5 <= anyio.current_time() - started < 0.8
