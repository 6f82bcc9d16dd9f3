"""HTTP/1.1 routes and limits: httpx, and raw sockets where a client would be too polite."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from talkies.transport.http import HttpLimits
from talkies.transport.server import ServerOptions

from .conftest import RunningServer, run_server


def test_healthz(server: RunningServer) -> None:
    r = httpx.get(server.http + "/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    assert httpx.head(server.http + "/healthz").status_code == 200
    assert httpx.post(server.http + "/healthz").status_code == 405


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nope", 404),
        ("GET", "/v1/audio/transcriptions/stream", 426),
        ("POST", "/v1/audio/transcriptions/stream", 405),
        ("DELETE", "/v1/audio/transcriptions/stream", 405),
    ],
)
def test_routes(server: RunningServer, method: str, path: str, status: int) -> None:
    r = httpx.request(method, server.http + path)
    assert r.status_code == status
    assert r.json()["error"]["message"]
    if status == 426:
        assert r.headers["upgrade"] == "websocket"
    if status == 405:
        assert r.headers["allow"] == "GET, HEAD"


def test_auth_on_http_routes() -> None:
    with run_server(auth_token="tok") as server:
        assert httpx.get(server.http + "/healthz").status_code == 200
        r = httpx.get(server.http + "/nope")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert httpx.get(server.http + "/nope?token=tok").status_code == 401
        ok = httpx.get(server.http + "/nope", headers={"Authorization": "Bearer tok"})
        assert ok.status_code == 404


def test_keep_alive_and_pipelining(server: RunningServer) -> None:
    with httpx.Client() as client:
        for _ in range(5):
            assert client.get(server.http + "/healthz").status_code == 200
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    sock.sendall(request * 3 + b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    assert data.count(b"HTTP/1.1 200") == 3 and data.count(b"HTTP/1.1 404") == 1
    sock.close()


def test_request_with_body_to_a_bodiless_route(server: RunningServer) -> None:
    r = httpx.post(server.http + "/nope", content=b"x" * 100_000)
    assert r.status_code == 404


def test_too_many_headers_and_huge_heads() -> None:
    with run_server() as server:
        headers = {f"x-h{i}": "v" for i in range(101)}
        assert httpx.get(server.http + "/healthz", headers=headers).status_code == 431
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 431")
        sock.close()


def test_garbage_gets_400(server: RunningServer) -> None:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    sock.sendall(b"\x16\x03\x01 this is not http\r\n\r\n")
    assert sock.recv(100).startswith(b"HTTP/1.1 400")
    sock.close()


def test_slow_request_head_is_cut_off() -> None:
    options = ServerOptions(http=HttpLimits(head_timeout=0.5, keepalive_timeout=0.5))
    with run_server(options=options) as server:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        data = sock.recv(100)
        assert data.startswith(b"HTTP/1.1 408")
        assert time.monotonic() - started < 4
        # An idle keep-alive connection is closed quietly.
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(1000)
        assert first.startswith(b"HTTP/1.1 200")
        assert sock.recv(100) == b""
        # A connection that never says anything holds nothing either.
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        assert sock.recv(100).startswith(b"HTTP/1.1 408")


def test_websocket_version_and_key_are_checked(server: RunningServer) -> None:
    base = {"Upgrade": "websocket", "Connection": "Upgrade"}
    r = httpx.get(
        server.http + "/v1/audio/transcriptions/stream",
        headers={**base, "Sec-WebSocket-Version": "8", "Sec-WebSocket-Key": "x"},
    )
    assert r.status_code == 426 and r.headers["sec-websocket-version"] == "13"
    r = httpx.get(
        server.http + "/v1/audio/transcriptions/stream",
        headers={**base, "Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "short"},
    )
    assert r.status_code == 400


def test_status_lines_carry_reason_phrases(server: RunningServer) -> None:
    for request, status_line in [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 OK\r\n"),
        (b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 404 Not Found\r\n"),
        (b"POST /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 405 Method Not Allowed\r\n"),
    ]:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(request)
            assert sock.recv(65536).startswith(status_line)
    from .wire import raw_connect

    sock, _ = raw_connect(server.port)  # asserts the 101 line itself; check its reason here
    sock.close()
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(
            b"GET /v1/audio/transcriptions/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n\r\n"
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 101 Switching Protocols\r\n")


def _chunked_request(body_chunks: bytes) -> list[bytes | str]:
    """The body chunks the app reads of a chunked POST whose bytes all arrived in one read
    (the error's message in place of a chunk when the body is refused)."""
    import anyio
    import h11

    from talkies.app.http import HttpError
    from talkies.transport.h11app import build_request
    from talkies.transport.http import HttpLimits

    conn = h11.Connection(h11.SERVER)
    head = b"POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
    conn.receive_data(head + body_chunks)
    request = conn.next_event()
    assert isinstance(request, h11.Request)

    class NoSocket:  # everything was received already: the socket is never read
        async def receive(self, max_bytes: int = 65536) -> bytes:
            raise AssertionError("read the socket")

        async def send(self, item: bytes) -> None:
            raise AssertionError("sent")

    async def go() -> list[bytes | str]:
        built = build_request(
            conn, NoSocket(), request, limits=HttpLimits(), max_body=1 << 20, peer=None
        )  # type: ignore[arg-type]
        out: list[bytes | str] = []
        try:
            async for chunk in built.body.chunks():
                out.append(chunk)
        except HttpError as exc:
            out.append(str(exc))
        return out

    return anyio.run(go)


def test_a_body_of_one_byte_chunks_reaches_the_app_as_one_chunk() -> None:
    # One chunk per byte would be one disk write and one thread hop per byte of an upload
    # (about 90 us of CPU each: 17 s for a 200 kB file).
    body = b"".join(b"1\r\n" + bytes([65 + k % 26]) + b"\r\n" for k in range(5000)) + b"0\r\n\r\n"
    chunks = _chunked_request(body)
    assert len(chunks) == 1 and len(chunks[0]) == 5000
    # A malformed chunk after good ones: their data first, then the refusal, as before.
    broken = _chunked_request(b"1\r\nA\r\n1\r\nB\r\nzz\r\n")
    assert broken[0] == b"AB" and len(broken) == 2 and "malformed request body" in broken[1]
