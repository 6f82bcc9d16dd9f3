"""A reproduction of sherpa-onnx's ``python-api-examples/streaming_server.py`` (transducer only).

    python bench/peers/sherpa_streaming.py --tokens T --encoder E --decoder D --joiner J
        [--num-threads 1] [--max-batch-size 3] [--max-wait-ms 10] [--nn-pool-size 1]

Used by ``bench/report.py`` only when the upstream file itself cannot be run (no sherpa-onnx
sources at hand). It keeps what matters to the measurement, as upstream has it (read at
k2-fsa/sherpa-onnx 634265c9, 2026-08-08):

- the ``websockets`` asyncio server, ``max_size`` 1 MiB, ``max_queue`` 32;
- binary messages are little-endian float32 samples at 16 kHz, fed with ``accept_waveform``;
  after each, while ``is_ready``, the stream is queued for the decode consumer and then
  ``{"text": <segment hypothesis>, "segment": <n>}`` is sent, the stream reset and ``segment``
  incremented on ``is_endpoint``;
- the text message ``"Done"`` ends the audio: 0.3 s of zeros, ``input_finished()``, decode
  while ready, one last ``{"text","segment"}``, then the handler returns (close 1000);
- ``--nn-pool-size`` consumer tasks (one thread pool of that size) each take up to
  ``--max-batch-size`` queued streams (polling every ``--max-wait-ms`` when the queue is
  empty) and run one ``decode_streams`` call in the pool;
- endpoint rules 2.4 / 1.2 / 20 s, greedy search.

Left out: the static web pages and HTTP GET handling, the connection cap (503), TLS, logging
to ``log/``, and the other model families. Unlike upstream (which binds every interface) it
binds 127.0.0.1, on a free port, and prints ``PORT <n>`` once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np


class StreamingServer:
    def __init__(self, recognizer: Any, nn_pool_size: int, max_wait_ms: float, max_batch: int):
        self.recognizer = recognizer
        self.nn_pool_size = nn_pool_size
        self.nn_pool = ThreadPoolExecutor(max_workers=nn_pool_size, thread_name_prefix="nn")
        self.stream_queue: asyncio.Queue[tuple[Any, asyncio.Future[None]]] = asyncio.Queue()
        self.max_wait_ms = max_wait_ms
        self.max_batch_size = max_batch
        self.sample_rate = int(recognizer.config.feat_config.sampling_rate)

    async def stream_consumer_task(self) -> None:
        while True:
            if self.stream_queue.empty():
                await asyncio.sleep(self.max_wait_ms / 1000)
                continue
            batch: list[tuple[Any, asyncio.Future[None]]] = []
            try:
                while len(batch) < self.max_batch_size:
                    item = self.stream_queue.get_nowait()
                    assert self.recognizer.is_ready(item[0])
                    batch.append(item)
            except asyncio.QueueEmpty:
                pass
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(
                self.nn_pool, self.recognizer.decode_streams, [b[0] for b in batch]
            )
            for _, future in batch:
                self.stream_queue.task_done()
                future.set_result(None)

    async def compute_and_decode(self, stream: Any) -> None:
        future = asyncio.get_running_loop().create_future()
        await self.stream_queue.put((stream, future))
        await future

    async def handle_connection(self, socket: Any) -> None:
        import websockets

        with contextlib.suppress(websockets.exceptions.ConnectionClosedError):
            await self.handle_connection_impl(socket)

    async def handle_connection_impl(self, socket: Any) -> None:
        stream = self.recognizer.create_stream()
        segment = 0
        while True:
            message = await socket.recv()
            if message == "Done":
                break
            samples = np.frombuffer(message, dtype=np.float32)
            stream.accept_waveform(sample_rate=self.sample_rate, waveform=samples)
            while self.recognizer.is_ready(stream):
                await self.compute_and_decode(stream)
                result = self.recognizer.get_result(stream)
                reply = {"text": result, "segment": segment}
                if self.recognizer.is_endpoint(stream):
                    self.recognizer.reset(stream)
                    segment += 1
                await socket.send(json.dumps(reply))
        tail_padding = np.zeros(int(self.sample_rate * 0.3)).astype(np.float32)
        stream.accept_waveform(sample_rate=self.sample_rate, waveform=tail_padding)
        stream.input_finished()
        while self.recognizer.is_ready(stream):
            await self.compute_and_decode(stream)
        result = self.recognizer.get_result(stream)
        await socket.send(json.dumps({"text": result, "segment": segment}))

    async def run(self) -> None:
        from websockets.asyncio.server import serve

        tasks = [asyncio.create_task(self.stream_consumer_task()) for _ in range(self.nn_pool_size)]
        async with serve(
            self.handle_connection, "127.0.0.1", 0, max_size=1 << 20, max_queue=32
        ) as server:
            print(f"PORT {next(iter(server.sockets)).getsockname()[1]}", flush=True)
            await asyncio.Future()
        await asyncio.gather(*tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("tokens", "encoder", "decoder", "joiner"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--num-threads", type=int, default=2)
    parser.add_argument("--nn-pool-size", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=3)
    parser.add_argument("--max-wait-ms", type=float, default=10)
    args = parser.parse_args()

    import sherpa_onnx  # type: ignore[import-untyped, unused-ignore]

    recognizer = sherpa_onnx.OnlineRecognizer.from_transducer(
        tokens=args.tokens,
        encoder=args.encoder,
        decoder=args.decoder,
        joiner=args.joiner,
        num_threads=args.num_threads,
        sample_rate=16000,
        feature_dim=80,
        decoding_method="greedy_search",
        enable_endpoint_detection=True,
        rule1_min_trailing_silence=2.4,
        rule2_min_trailing_silence=1.2,
        rule3_min_utterance_length=20,
        provider="cpu",
    )
    server = StreamingServer(recognizer, args.nn_pool_size, args.max_wait_ms, args.max_batch_size)
    asyncio.run(server.run())


if __name__ == "__main__":
    main()
