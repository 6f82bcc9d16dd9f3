"""talkies' ASGI adapter under uvicorn: the report's fifth ingest/paced peer.

    python bench/peers/asgi_talkies.py [--mode count|echo] [--ws wsproto|websockets]

The same session, driver and ``ThreadedStream`` path as the standalone ``talkies`` server of
``bench/servers.py``, but hosted by uvicorn through :func:`talkies.transport.asgi.create_app`
(the way ``tests/http_server.py uvicorn`` hosts it). The recognitions are the same as there:
``count`` returns nothing, ``echo`` one partial per ``accept()`` carrying the counter of the
last whole frame. Binds 127.0.0.1 on a free port, prints ``PORT <n>`` once listening, serves
until SIGTERM.
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def counter_of(data: bytes) -> int:
    return int(struct.unpack_from("<I", data)[0]) if len(data) >= 4 else -1


def build_app(mode: str, frame_bytes: int) -> object:
    from talkies.config import Settings
    from talkies.engines.base import EngineStream, EngineUpdate, Recognition
    from talkies.engines.runtime import RecognitionModel
    from talkies.protocol import EngineFinal, EnginePartial
    from talkies.protocol.messages import StartOptions
    from talkies.transport.asgi import create_app

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
            start = (self._total // frame_bytes - 1) * frame_bytes
            offset = start - (self._total - len(self._tail))
            if start < 0 or offset < 0 or start == self._last:
                return []
            self._last = start
            return [EnginePartial(text=str(counter_of(self._tail[offset : offset + 4])))]

    class Model(RecognitionModel):
        def recognition(self, options: StartOptions) -> Recognition:
            return CounterRecognition() if mode == "echo" else NullRecognition()

    model = Model()

    class Provider:
        async def open_stream(self, options: StartOptions) -> EngineStream:
            return await model.open_stream(options, max_buffered_bytes=5 * 32000)

    settings = Settings(
        host="127.0.0.1",
        port=0,
        stream_max_connections=1024,
        stream_idle_timeout=600,
        stream_max_duration=86400,
    )
    return create_app(settings, Provider())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["count", "echo"], default="count")
    parser.add_argument("--ws", choices=["wsproto", "websockets"], default="wsproto")
    parser.add_argument("--frame-bytes", type=int, default=640)
    args = parser.parse_args()

    import resource

    import uvicorn

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    app = build_app(args.mode, args.frame_bytes)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)  # connections queue until uvicorn accepts them
    config = uvicorn.Config(
        app,  # type: ignore[arg-type]
        ws=args.ws,
        http="h11",
        loop="asyncio",
        lifespan="on",
        log_level="warning",
        ws_ping_interval=None,
        ws_max_size=16 * 1024 * 1024,
        ws_per_message_deflate=False,
        backlog=4096,
    )
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
