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
