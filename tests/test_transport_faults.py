"""Misbehaving clients: vanishing at every moment, never reading, connection churn."""

from __future__ import annotations

import json
import socket
import time

import pytest

from .conftest import RunningServer, run_server
from .fake_engine import FakeProvider, speech
from .wire import START, drain, masked, open_stream, raw_connect, read_close, ws_connect


def _started(server: RunningServer, model: str = "tiny-test") -> socket.socket:
    sock, rest = raw_connect(server.port)
    sock.sendall(masked(0x1, json.dumps({**START, "model": model}).encode()))
    buf = rest
    while b"ready" not in buf:
        chunk = sock.recv(4096)
        assert chunk, buf
        buf += chunk
    return sock


def test_client_vanishes_mid_handshake(server: RunningServer) -> None:
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"GET /v1/audio/transcriptions/stream HTTP/1.1\r\nHost: x\r\nUpgr")
    server.wait_connections(1)  # the server holds it while the head is incomplete...
    sock.close()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.close()
    # ...and lets go of both once they are gone: a server stuck on them would fail here.
    server.wait_connections(0)
    server.wait_idle()


def test_client_vanishes_mid_frame(server: RunningServer) -> None:
    sock = _started(server)
    sock.sendall(masked(0x2, speech(0.1))[:500])  # header and part of the payload
    sock.close()
    server.wait_idle()


def test_client_vanishes_after_end_while_flushing() -> None:
    provider = FakeProvider(slow_delay=0.5)
    with run_server(provider=provider) as server:
        sock = _started(server, "slow-test")
        sock.sendall(masked(0x2, speech(0.1)) + masked(0x1, b'{"type":"end"}'))
        time.sleep(0.1)
        sock.close()
        server.wait_idle()
        assert provider.stats.closed == provider.stats.opened == 1


def test_client_vanishes_while_the_model_opens() -> None:
    provider = FakeProvider(slow_delay=0.5)
    with run_server(provider=provider) as server:
        sock, _ = raw_connect(server.port)
        sock.sendall(masked(0x1, json.dumps({**START, "model": "slow-open-test"}).encode()))
        time.sleep(0.1)
        sock.close()
        server.wait_idle()
        time.sleep(0.6)  # the open would have finished by now: nothing may be left open
        assert provider.stats.closed == provider.stats.opened


def test_client_close_frame_is_answered_and_tcp_closed(server: RunningServer) -> None:
    sock = _started(server)
    sock.sendall(masked(0x8, (1000).to_bytes(2, "big")))
    _texts, code = read_close(sock)
    assert code == 1000
    assert sock.recv(10) == b""  # then EOF: the server closed TCP at once
    server.wait_idle()


def test_server_closes_tcp_when_the_client_never_answers_its_close() -> None:
    from talkies.transport.server import ServerOptions

    with run_server(options=ServerOptions(close_timeout=0.3)) as server:
        sock, rest = raw_connect(server.port)
        sock.sendall(masked(0x1, b"not json"))
        _texts, code = read_close(sock, rest)
        assert code == 4400
        sock.settimeout(3)
        assert sock.recv(10) == b""  # EOF after the close timeout, without our close frame
        server.wait_idle()


def test_client_that_never_reads_cannot_make_the_server_buffer() -> None:
    """Audio pushed without reading stops being accepted: the server's intake is bounded."""
    provider = FakeProvider(max_buffered_bytes=64000, slow_delay=0.2)
    with run_server(provider=provider, stream_idle_timeout=2.0) as server:
        sock = _started(server, "slow-test")
        sock.setblocking(False)
        frame = masked(0x2, speech(0.1))
        accepted = 0
        stalled_since = None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                accepted += sock.send(frame)
                stalled_since = None
            except BlockingIOError:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 1.0:
                    break
                time.sleep(0.01)
            except OSError:
                break
        # 20 s at full speed would be gigabytes; socket buffers plus the engine queue are a
        # few megabytes at most.
        assert accepted < 32 * 1024 * 1024, accepted
        sock.close()
        server.wait_idle(timeout=15)


def test_hundred_connections_opened_and_dropped_leave_no_slot() -> None:
    with run_server(stream_max_connections=8) as server:
        for i in range(100):
            if i % 3 == 0:
                sock = socket.create_connection(("127.0.0.1", server.port))
                sock.close()
            elif i % 3 == 1:
                sock, _ = raw_connect(server.port)
                sock.close()
            else:
                sock = _started(server)
                sock.sendall(masked(0x2, speech(0.1)))
                sock.close()
        server.wait_idle()
        # And the server still serves.
        ws = open_stream(server.url)
        ws.send(json.dumps({"type": "end"}))
        assert drain(ws)[1] == 1000
        server.wait_idle()


@pytest.mark.parametrize("opcode", [0x3, 0xB])  # reserved opcodes
def test_websocket_protocol_errors_close_1002(server: RunningServer, opcode: int) -> None:
    sock, rest = raw_connect(server.port)
    sock.sendall(masked(opcode, b"x"))
    assert read_close(sock, rest)[1] == 1002
    server.wait_idle()


def test_permessage_deflate_is_not_negotiated(server: RunningServer) -> None:
    ws = ws_connect(server.url)  # the websockets client offers permessage-deflate
    assert ws.response is not None
    assert ws.response.headers.get("Sec-WebSocket-Extensions") is None
    ws.close()
    server.wait_idle()
