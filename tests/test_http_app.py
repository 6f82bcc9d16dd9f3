"""Admission, routing and limits, identical on both hosts (talkies' own server and uvicorn)."""

from __future__ import annotations

import socket

import httpx
import pytest

from .http_hosts import TOKEN, UPLOAD_CAP, HttpHost

pytestmark = pytest.mark.usefixtures("http_data")


def _raw(host: HttpHost, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", host.port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_health_needs_no_token(host: HttpHost) -> None:
    r = httpx.get(host.url + "/healthz")
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    head = httpx.head(host.url + "/healthz")
    assert head.status_code == 200 and head.content == b""
    post = httpx.post(host.url + "/healthz")
    assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"
    assert post.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/models"),
        ("GET", "/nope"),
        ("POST", "/v1/audio/transcriptions"),
        ("GET", "/v1/files"),
        ("PUT", "/v1/files/a.wav"),
    ],
)
def test_everything_else_needs_the_token(host: HttpHost, method: str, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = httpx.request(method, host.url + path, headers=headers)
        assert r.status_code == 401, (headers, r.status_code)
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json() == {
            "error": {
                "message": "missing or invalid bearer token",
                "type": "authentication_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }
    # Tokens are never taken from the URL.
    r = httpx.request(method, host.url + path + f"?token={TOKEN}&api_key={TOKEN}")
    assert r.status_code == 401


@pytest.mark.parametrize(
    ("method", "path", "status", "allow"),
    [
        ("GET", "/nope", 404, None),
        ("GET", "/v1/audio/transcriptions", 405, "POST"),
        ("DELETE", "/v1/models", 405, "GET, HEAD"),
        ("POST", "/v1/models/whisper-base-en", 405, "DELETE, GET, HEAD"),
        ("POST", "/v1/audio/transcriptions/stream", 405, "GET, HEAD"),
        ("GET", "/v1/audio/transcriptions/stream", 426, None),
        ("POST", "/v1/files", 405, "GET, HEAD"),
        ("POST", "/v1/files/a.wav", 405, "DELETE, GET, HEAD, PUT"),
    ],
)
def test_routes_and_methods(
    host: HttpHost, method: str, path: str, status: int, allow: str | None
) -> None:
    r = httpx.request(method, host.url + path, headers=host.headers)
    assert r.status_code == status
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert r.headers.get("allow") == allow
    if status == 426:
        assert r.headers["upgrade"] == "websocket"


def test_status_lines_carry_reason_phrases(host: HttpHost) -> None:
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    for request, line in [
        (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 200 OK\r\n"),
        (b"GET /nope HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n", b"HTTP/1.1 404 Not Found\r\n"),
        (b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 401 Unauthorized\r\n"),
    ]:
        assert _raw(host, request).startswith(line)


def test_declared_body_over_the_cap_is_refused_before_it_is_read(host: HttpHost) -> None:
    head = (
        b"PUT /v1/files/big.bin HTTP/1.1\r\nHost: x\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {UPLOAD_CAP + 1}\r\n\r\n".encode()
    )
    # Only the head is sent: the answer must come without the body.
    response = _raw(host, head)
    assert response.startswith(b"HTTP/1.1 413 ")


def test_streamed_body_over_the_cap_is_cut_off(host: HttpHost) -> None:
    def body() -> object:
        for _ in range(UPLOAD_CAP // 65536 + 2):
            yield b"x" * 65536

    with host.client() as client:
        r = client.put("/v1/files/cap/big.bin", content=body())
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert client.get("/v1/files/cap/big.bin").status_code == 404
    leftovers = [p for p in (host.data_dir / "files").rglob("*") if p.is_file()]
    assert not [p for p in leftovers if "cap" in p.parts], leftovers
