"""The servers under test, each run in its own process by ``ingest.py`` and ``paced.py``.

    python bench/servers.py {talkies,talkies-inline,bare,starlette,websockets} [--mode ...]

Every server binds 127.0.0.1 on a free port, prints ``PORT <n>`` on stdout once it accepts
connections, and serves ``/v1/audio/transcriptions/stream`` until it gets SIGTERM.

The peers speak a minimal counting protocol that the load generators can drive like talkies:
a text ``{"type":"start",...}`` gets ``{"type":"ready"}``; binary messages are counted; a text
``{"type":"end"}`` gets ``{"type":"stats","frames":N}`` and a close with 1000. In ``--mode
echo`` each binary message is also answered with ``{"type":"partial","text":"<k>"}``, ``k``
being the little-endian uint32 in the message's first four bytes (what ``paced.py`` sends).

talkies runs the real :class:`~talkies.transport.server.Server` behind the real
:class:`~talkies.engines.runtime.rounds.ThreadedStream`, with a null recognition (``count``) or one
that returns a partial per ``accept`` carrying the last frame's counter (``echo``).
``talkies-inline`` is a diagnostic variant: the same recognitions called on the event loop by
a minimal engine stream (no worker-thread hop, no queue bound), to price ThreadedStream's hop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import struct
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STREAM_PATH = "/v1/audio/transcriptions/stream"
KINDS = ("talkies", "talkies-inline", "bare", "starlette", "websockets")
READY = json.dumps({"type": "ready"})


READ_SIZE = 262144  # talkies.transport.http.HttpLimits.read_size


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def announce(port: int) -> None:
    print(f"PORT {port}", flush=True)


def counter_of(data: bytes) -> int:
    return int(struct.unpack_from("<I", data)[0]) if len(data) >= 4 else -1


def echo_text(data: bytes) -> str:
    return f'{{"type":"partial","text":"{counter_of(data)}"}}'


def stats_text(frames: int) -> str:
    return json.dumps({"type": "stats", "frames": frames})


# -- talkies ----------------------------------------------------------------------------------


def run_talkies(mode: str, frame_bytes: int, *, inline: bool = False) -> None:
    import anyio

    from talkies.config import Settings
    from talkies.engines.base import EngineEvent, EngineStream, EngineUpdate, Recognition
    from talkies.engines.runtime import RecognitionModel
    from talkies.logs import configure
    from talkies.protocol import EngineFinal, EnginePartial
    from talkies.protocol.messages import StartOptions
    from talkies.transport.server import Server

    class NullRecognition:
        def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
            return []

        def finish(self) -> EngineFinal:
            return EngineFinal(text="")

        def close(self) -> None:
            pass

    class CounterRecognition(NullRecognition):
        """One partial per accept(): the counter of the last whole frame in the batch."""

        def __init__(self) -> None:
            self._total = 0
            self._tail = b""
            self._last = -1

        def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
            self._total += len(pcm)
            self._tail = (self._tail + pcm)[-2 * frame_bytes :]
            start = (self._total // frame_bytes - 1) * frame_bytes  # last whole frame
            offset = start - (self._total - len(self._tail))
            if start < 0 or offset < 0 or start == self._last:
                return []
            self._last = start
            return [EnginePartial(text=str(counter_of(self._tail[offset : offset + 4])))]

    class InlineStream:
        """Diagnostic only: the recognition called on the event loop, no thread hop, no bound."""

        def __init__(self, rec: NullRecognition) -> None:
            self._rec = rec
            self._pending: list[bytes] = []
            self._flush = False
            self._closed = False
            self._data = anyio.Event()

        async def feed(self, pcm: bytes) -> None:
            if not (self._closed or self._flush):
                self._pending.append(pcm)
                self._data.set()

        async def flush(self) -> None:
            self._flush = True
            self._data.set()

        async def events(self) -> AsyncIterator[EngineEvent]:
            while not self._closed:
                if self._pending:
                    batch = b"".join(self._pending)
                    self._pending.clear()
                    for update in self._rec.accept(batch):
                        yield update
                elif self._flush:
                    yield self._rec.finish()
                    return
                else:
                    if self._data.is_set():
                        self._data = anyio.Event()
                    await self._data.wait()

        async def aclose(self) -> None:
            if not self._closed:
                self._closed = True
                self._data.set()
                self._rec.close()

    class Model(RecognitionModel):
        """The product path: one model, its streams decoded in combined worker rounds."""

        def recognition(self, options: StartOptions) -> Recognition:
            return CounterRecognition() if mode == "echo" else NullRecognition()

    model = Model()

    class Provider:
        async def open_stream(self, options: StartOptions) -> EngineStream:
            if inline:
                return InlineStream(CounterRecognition() if mode == "echo" else NullRecognition())
            return await model.open_stream(options, max_buffered_bytes=5 * 32000)

    configure("info")
    settings = Settings(
        host="127.0.0.1",
        port=0,
        stream_max_connections=1024,
        stream_idle_timeout=600,
        stream_max_duration=86400,
    )
    server = Server(settings, Provider())

    from _serve import serve_until_signal  # bench/ is this script's folder

    serve_until_signal(server)


# -- (a) a bare anyio + wsproto loop -------------------------------------------------------------


def run_bare(mode: str) -> None:
    import anyio
    import anyio.abc
    import h11
    from wsproto.connection import Connection, ConnectionState, ConnectionType
    from wsproto.events import BytesMessage, CloseConnection, Message, TextMessage
    from wsproto.utilities import generate_accept_token

    echo = mode == "echo"

    async def handle(stream: anyio.abc.SocketStream) -> None:
        try:
            await serve_one(stream)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        finally:
            await anyio.aclose_forcefully(stream)

    async def serve_one(stream: anyio.abc.SocketStream) -> None:
        http = h11.Connection(h11.SERVER)
        event = http.next_event()
        while event is h11.NEED_DATA:
            http.receive_data(await stream.receive(READ_SIZE))
            event = http.next_event()
        if not isinstance(event, h11.Request):
            return
        key = dict(event.headers).get(b"sec-websocket-key", b"")
        headers = [
            (b"upgrade", b"websocket"),
            (b"connection", b"Upgrade"),
            (b"sec-websocket-accept", generate_accept_token(key)),
        ]
        await stream.send(http.send(h11.InformationalResponse(status_code=101, headers=headers)))
        ws = Connection(ConnectionType.SERVER, trailing_data=http.trailing_data[0])
        frames = 0
        first: bytes | None = None  # echo: the start of the message being received
        while True:
            out = bytearray()  # echo: the replies to everything one read brought, sent at once
            for ev in ws.events():
                if isinstance(ev, BytesMessage):
                    if echo and first is None:
                        first = bytes(ev.data[:4])
                    if ev.message_finished:
                        frames += 1
                        if echo:
                            out += ws.send(Message(data=echo_text(first or b"")))
                            first = None
                    continue
                if out:  # keep the order: replies so far go out before anything else
                    await stream.send(bytes(out))
                    out.clear()
                if isinstance(ev, TextMessage):
                    kind = json.loads(ev.data).get("type")
                    if kind == "start":
                        await stream.send(ws.send(Message(data=READY)))
                    elif kind == "end":
                        reply = ws.send(Message(data=stats_text(frames)))
                        reply += ws.send(CloseConnection(code=1000))
                        await stream.send(reply)
                elif isinstance(ev, CloseConnection):
                    if ws.state is ConnectionState.REMOTE_CLOSING:
                        await stream.send(ws.send(ev.response()))
                    return
            if out:
                await stream.send(bytes(out))
            # The same read size as talkies (HttpLimits.read_size), so only the layers on
            # top of wsproto differ.
            ws.receive_data(await stream.receive(READ_SIZE))

    async def main() -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        announce(listener.extra(anyio.abc.SocketAttribute.local_port))
        await listener.serve(handle)

    anyio.run(main)


# -- (b) uvicorn + Starlette over wsproto --------------------------------------------------------


def run_starlette(mode: str) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import WebSocketRoute
    from starlette.websockets import WebSocket

    echo = mode == "echo"

    async def endpoint(ws: WebSocket) -> None:
        await ws.accept()
        frames = 0
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            if data is not None:
                frames += 1
                if echo:
                    await ws.send_text(echo_text(data))
                continue
            kind = json.loads(message.get("text") or "{}").get("type")
            if kind == "start":
                await ws.send_text(READY)
            elif kind == "end":
                await ws.send_text(stats_text(frames))
                await ws.close(1000)
                return

    app = Starlette(routes=[WebSocketRoute(STREAM_PATH, endpoint)])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app,
        ws="wsproto",
        http="h11",
        loop="asyncio",
        lifespan="off",
        log_level="warning",
        ws_ping_interval=None,
        ws_max_size=16 * 1024 * 1024,
        backlog=4096,
    )
    announce(sock.getsockname()[1])
    uvicorn.Server(config).run(sockets=[sock])


# -- (c) the websockets library ------------------------------------------------------------------


def run_websockets(mode: str) -> None:
    from websockets.asyncio.server import ServerConnection, serve

    echo = mode == "echo"

    async def handler(ws: ServerConnection) -> None:
        frames = 0
        async for message in ws:
            if isinstance(message, bytes):
                frames += 1
                if echo:
                    await ws.send(echo_text(message))
                continue
            kind = json.loads(message).get("type")
            if kind == "start":
                await ws.send(READY)
            elif kind == "end":
                await ws.send(stats_text(frames))
                await ws.close(1000)
                return

    async def main() -> None:
        async with serve(
            handler,
            "127.0.0.1",
            0,
            ping_interval=None,
            max_size=None,
            compression=None,
            backlog=4096,
        ) as server:
            announce(next(iter(server.sockets)).getsockname()[1])
            await asyncio.Future()

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=[*KINDS])
    parser.add_argument("--mode", choices=["count", "echo"], default="count")
    parser.add_argument("--frame-bytes", type=int, default=640)
    args = parser.parse_args()
    raise_fd_limit()
    if args.kind in ("talkies", "talkies-inline"):
        run_talkies(args.mode, args.frame_bytes, inline=args.kind == "talkies-inline")
    elif args.kind == "bare":
        run_bare(args.mode)
    elif args.kind == "starlette":
        run_starlette(args.mode)
    else:
        run_websockets(args.mode)


if __name__ == "__main__":
    main()
