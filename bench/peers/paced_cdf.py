"""The paced client of ``bench/paced.py``, keeping the whole latency distribution (for CDFs).

    python bench/peers/paced_cdf.py --port P --server-pid PID --streams N [--duration 5]
        [--cpus 1]

Same load as ``paced.py``'s client (its ``Stream`` protocol, ``open_stream``, ``finish`` and
``FrameMaker``, imported): N streams, one 640-byte frame per 20 ms each, send times spread
evenly over each 20 ms, frame k carrying k; latency of frame k = receipt of the first partial
carrying a counter >= k minus its send time. Prints one JSON object: percentiles, 201 evenly
spaced quantiles (0, 0.005, ..., 1) of the latencies in seconds, frames sent and answered, the
server's CPU cores while pacing, and the client's send lag p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.paced import (
    PERIOD,
    FrameMaker,
    Stream,
    finish,
    open_stream,
    raise_fd_limit,
    take_cores,
)
from bench.report_parts import cpu_seconds


def quantile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    host, port, n = "127.0.0.1", args.port, args.streams
    make = FrameMaker(args.frame_bytes)
    errors: list[str] = []

    warm = await open_stream(host, port)
    for k in range(5):
        warm.send(make(k))
    await finish([warm], 5)

    streams: list[Stream] = []
    for i in range(0, n, 50):
        batch = [open_stream(host, port) for _ in range(min(50, n - i))]
        for outcome in await asyncio.gather(*batch, return_exceptions=True):
            if isinstance(outcome, BaseException):
                errors.append(f"connect: {type(outcome).__name__}: {outcome}")
            else:
                streams.append(outcome)
    if not streams:
        return {"streams": n, "connected": 0, "errors": errors}

    live = len(streams)
    slot = PERIOD / live
    total = int(args.duration / PERIOD) * live
    lags: list[float] = []
    perf = time.perf_counter
    start = perf() + 0.05
    cpu0 = cpu_seconds(args.server_pid)
    j = 0
    while j < total:
        now = perf()
        due = start + j * slot
        if due > now:
            await asyncio.sleep(due - now)
            continue
        while j < total and start + j * slot <= now:
            stream = streams[j % live]
            if not stream.gone:
                frame = make(j // live)
                sent_at = perf()
                stream.sent.append(sent_at)
                stream.send(frame)
                lags.append(sent_at - (start + j * slot))
            j += 1
        await asyncio.sleep(0)
    server_cores = (cpu_seconds(args.server_pid) - cpu0) / (perf() - start)

    deadline = perf() + 3.0
    while perf() < deadline and any(s.acked < len(s.sent) for s in streams if not s.gone):
        await asyncio.sleep(0.01)
    stats = await finish([s for s in streams if not s.gone], 8)
    await asyncio.sleep(0.2)
    for s in streams:
        if s.transport is not None:
            s.transport.close()

    latencies = sorted(x for s in streams for x in s.latencies)
    lags.sort()
    return {
        "streams": n,
        "connected": live,
        "stats_received": stats,
        "frames_sent": sum(len(s.sent) for s in streams),
        "frames_answered": len(latencies),
        "p50": quantile(latencies, 0.5),
        "p90": quantile(latencies, 0.9),
        "p99": quantile(latencies, 0.99),
        "max": quantile(latencies, 1.0),
        "quantiles": [quantile(latencies, i / 200) for i in range(201)],
        "server_cores": server_cores,
        "send_lag_p99": quantile(lags, 0.99),
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server-pid", type=int, required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--frame-bytes", type=int, default=640)
    parser.add_argument("--cpus", default="", help="cores to run on, comma-separated")
    args = parser.parse_args()
    take_cores(args.cpus)
    raise_fd_limit()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
