"""Frames per second through the bare protocol core, beside two WebSocket parsers in one run.

    python bench/protocol.py [--frames 200000] [--frame-bytes 640] [--repeat 3]

What is measured, on one core, best of ``--repeat`` runs:
- talkies: ``StreamSession.handle(BinaryReceived(...))`` per frame, creating each input object
  and draining actions every 64 frames: the whole per-frame cost a transport pays to the core.
- wsproto: the same number of masked 640-byte binary frames parsed by wsproto's server
  connection (the framing layer the anyio transport uses), fed 64 frames per call.
- websockets: the same frames through the ``websockets`` sans-IO ``ServerProtocol`` (its
  framing has a C speedup for unmasking).
Ratios are talkies / peer: above 1 means the core costs less per frame than parsing the frame.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from talkies.protocol import (
    BinaryReceived,
    EngineOpened,
    SessionLimits,
    StreamSession,
    TextReceived,
)

BATCH = 64
HANDSHAKE = (
    b"GET /v1/audio/transcriptions/stream HTTP/1.1\r\nHost: localhost\r\n"
    b"Upgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


def masked_frame(payload: bytes, key: bytes = b"\x37\xfa\x21\x3d") -> bytes:
    n = len(payload)
    if n < 126:
        header = struct.pack("!BB", 0x82, 0x80 | n)
    elif n < 65536:
        header = struct.pack("!BBH", 0x82, 0x80 | 126, n)
    else:
        header = struct.pack("!BBQ", 0x82, 0x80 | 127, n)
    body = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    return header + key + body


def bench_talkies(frames: int, frame: bytes) -> float:
    s = StreamSession(SessionLimits(max_duration_seconds=86400), now=0.0)
    start = {"type": "start", "model": "m", "encoding": "pcm_s16le"}
    start |= {"sample_rate": 16000, "channels": 1}
    s.handle(TextReceived(data=json.dumps(start)), 0.0)
    s.handle(EngineOpened(), 0.0)
    s.pull_actions()
    handle, pull = s.handle, s.pull_actions
    t0 = time.perf_counter()
    for i in range(frames):
        handle(BinaryReceived(data=frame), 1.0)
        if i % BATCH == 0:
            pull()
    pull()
    elapsed = time.perf_counter() - t0
    assert s.frames == frames, s.outcome
    return frames / elapsed


def bench_wsproto(frames: int, frame: bytes) -> float:
    from wsproto import ConnectionType, WSConnection
    from wsproto.events import AcceptConnection, BytesMessage, Request

    ws = WSConnection(ConnectionType.SERVER)
    ws.receive_data(HANDSHAKE)
    for event in ws.events():
        assert isinstance(event, Request)
    ws.send(AcceptConnection())
    chunk = masked_frame(frame) * BATCH
    seen = 0
    t0 = time.perf_counter()
    for _ in range(frames // BATCH):
        ws.receive_data(chunk)
        for event in ws.events():
            if isinstance(event, BytesMessage) and event.message_finished:
                seen += 1
    elapsed = time.perf_counter() - t0
    assert seen == frames // BATCH * BATCH
    return seen / elapsed


def bench_websockets(frames: int, frame: bytes) -> float:
    from websockets.frames import Frame
    from websockets.server import ServerProtocol

    proto = ServerProtocol(max_size=None)
    proto.receive_data(HANDSHAKE)
    (request,) = proto.events_received()
    proto.send_response(proto.accept(request))
    proto.data_to_send()
    chunk = masked_frame(frame) * BATCH
    seen = 0
    t0 = time.perf_counter()
    for _ in range(frames // BATCH):
        proto.receive_data(chunk)
        for event in proto.events_received():
            if isinstance(event, Frame) and event.fin:
                seen += 1
    elapsed = time.perf_counter() - t0
    assert seen == frames // BATCH * BATCH
    return seen / elapsed


def best(fn: Callable[[int, bytes], float], frames: int, frame: bytes, repeat: int) -> float:
    return max(fn(frames, frame) for _ in range(repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--frame-bytes", type=int, default=640)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    frame = bytes(range(256)) * (args.frame_bytes // 256) + bytes(args.frame_bytes % 256)
    import websockets
    import wsproto

    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus")
    print(f"{args.frames} frames of {args.frame_bytes} bytes, best of {args.repeat}")
    ours = best(bench_talkies, args.frames, frame, args.repeat)
    peers = {
        f"wsproto {wsproto.__version__} frame parsing": best(
            bench_wsproto, args.frames, frame, args.repeat
        ),
        f"websockets {websockets.__version__} sans-IO frame parsing": best(
            bench_websockets, args.frames, frame, args.repeat
        ),
    }
    print(f"{'talkies StreamSession (validate + account + Feed)':58s} {ours:>12,.0f} frames/s")
    for name, rate in peers.items():
        print(f"{name:58s} {rate:>12,.0f} frames/s   talkies/peer = {ours / rate:.2f}x")


if __name__ == "__main__":
    main()
