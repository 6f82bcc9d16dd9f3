"""The rejection table of docs/protocol.md, over the wire, with the websockets client.

Rows whose input is a client message are sent by a real client to the real server; rows whose
input is a driver fact (refusals, engine failures, ticks, auth) have their own wire tests in
test_transport_stream.py. Every case must get its error object and exact close code, and leave
no slot held.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection

from .conftest import RunningServer, run_server
from .fake_engine import FakeProvider
from .protocol_helpers import LIMITS, start_text
from .test_protocol_rejections import rejection_rows
from .wire import START, drain, masked, open_stream, raw_connect, read_close, ws_connect

DRIVER_INPUTS = ("tick(", "refused(", "auth_rejected(", "engine_", "shutting_down(")
STATES = ["awaiting_start", "opening", "streaming", "flushing"]


class Wire:
    """The notation of the docs table, as messages sent by a websockets client."""

    def __init__(self) -> None:
        self.messages: list[Any] = []

    def namespace(self) -> dict[str, Any]:
        m = self.messages
        return {
            "MAX_FRAME": LIMITS.max_frame_bytes,
            "MAX_SAMPLES": LIMITS.max_samples,
            "text": lambda s: m.append(("text", s)),
            "raw": lambda b: m.append(("raw", b)),
            "frags": lambda *parts: m.append(("frags", list(parts))),
            "start": lambda **changes: m.append(("text", start_text(**changes))),
            "big_text": lambda n: m.append(
                ("text", json.dumps({"type": "end", "p": "x" * (n - 24)}))
            ),
            "binary": lambda n: m.append(("binary", b"\x01" * n)),
            # Consecutive binary messages: the server's channel turns them into an AudioBatch.
            "batch": lambda *ns: [m.append(("binary", b"\x01" * n)) for n in ns],
            "bfrags": lambda *ns: m.append(("frags", [b"\x01" * n for n in ns])),
            "fill": lambda samples: [
                m.append(("binary", bytes(min(LIMITS.max_frame_bytes, 2 * samples - off))))
                for off in range(0, 2 * samples, LIMITS.max_frame_bytes)
            ],
        }

    def send(self, ws: ClientConnection) -> None:
        # The server may refuse early (mid-message, say) and close: drain() reads why.
        with contextlib.suppress(ConnectionClosed):
            self._send(ws)

    def _send(self, ws: ClientConnection) -> None:
        for kind, payload in self.messages:
            if kind == "text":
                # surrogatepass: a lone surrogate goes out as the (invalid) bytes it stands for.
                ws.send(payload.encode("utf-8", "surrogatepass"), text=True)
            elif kind == "raw":
                ws.send(payload, text=True)
            elif kind in ("frags", "binary"):
                ws.send(payload)


def _cases() -> Iterator[Any]:
    for state, source, code, close in rejection_rows():
        if source.startswith(DRIVER_INPUTS) or "_open(" in source:
            continue
        for st in STATES if state == "any" else [state]:
            yield pytest.param(st, source, code, int(close), id=f"{st}:{source}")


CASES = list(_cases())


@pytest.fixture(scope="module")
def wire_server() -> Iterator[RunningServer]:
    with run_server(provider=FakeProvider(slow_delay=0.4), stream_max_connections=64) as s:
        yield s


def _connect_in(state: str, server: RunningServer) -> ClientConnection:
    if state == "awaiting_start":
        return ws_connect(server.url)
    if state == "opening":
        ws = ws_connect(server.url)
        ws.send(json.dumps({**START, "model": "slow-open-test"}))
        return ws
    if state == "streaming":
        return open_stream(server.url)
    ws = open_stream(server.url, model="slow-test")
    ws.send(json.dumps({"type": "end"}))  # the fake engine takes 0.4 s to flush
    return ws


def test_most_of_the_table_goes_over_the_wire() -> None:
    assert len(CASES) >= 100


@pytest.mark.parametrize(("state", "source", "code", "close"), CASES)
def test_rejection_over_the_wire(
    wire_server: RunningServer, state: str, source: str, code: str, close: int
) -> None:
    wire = Wire()
    eval(source, wire.namespace())  # the docs table's notation
    ws = _connect_in(state, wire_server)
    wire.send(ws)
    events, got, reason = drain(ws)
    assert [(e["type"], e["code"]) for e in events] == [("error", code)]
    assert (got, reason) == (close, code)
    wire_server.wait_idle()


@pytest.mark.parametrize(
    ("frames", "codes", "close"),
    [
        # A text message left unfinished, then a binary one: RFC 6455 forbids interleaving,
        # so the WebSocket layer refuses it (1002) before the contract sees a message.
        ([masked(0x1, b'{"type":', fin=False), masked(0x2, b"\x00\x00")], [], 1002),
        # A binary message refused at its first fragment, before ready.
        ([masked(0x2, b"\x00" * 640, fin=False)], ["invalid_audio"], 4400),
    ],
)
def test_unfinished_messages_over_a_raw_socket(
    wire_server: RunningServer, frames: list[bytes], codes: list[str], close: int
) -> None:
    sock, rest = raw_connect(wire_server.port)
    sock.sendall(b"".join(frames))
    texts, got = read_close(sock, rest)
    assert [json.loads(t)["code"] for t in texts] == codes
    assert got == close
    sock.close()
    wire_server.wait_idle()


def test_frame_refused_before_its_payload_arrives(wire_server: RunningServer) -> None:
    """A frame claiming 10 MB is refused after the first chunk, not after reading 10 MB."""
    sock, rest = raw_connect(wire_server.port)
    start = json.dumps(START).encode()
    sock.sendall(masked(0x1, start))
    texts, _ = [], None
    buf = rest
    while b"ready" not in buf:
        buf += sock.recv(4096)
    # Claim 10 MB, send 8 KiB of it, and stop: the server must answer now.
    sock.sendall(masked(0x2, b"\x00" * 8192, length=10_000_000)[: 14 + 8192])
    texts, close = read_close(sock)
    assert [json.loads(t)["code"] for t in texts] == ["frame_too_large"]
    assert close == 4400
    sock.close()
    wire_server.wait_idle()
