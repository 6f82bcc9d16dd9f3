"""The paced client of ``bench/paced.py``, keeping the whole latency distribution (for CDFs).

    python bench/peers/paced_cdf.py --port P[,P2...] --server-pid PID[,PID2...] --streams N
        [--duration 5] [--turn 0.5] [--cpus 1]

The same client as ``paced.py``'s (its ``run_targets``, imported): N streams on each server,
one 640-byte frame per 20 ms each, send times spread evenly over each 20 ms, frame k carrying
k; latency of frame k = receipt of the first partial carrying a counter >= k minus its send
time. Several servers are paced one after the other, or with ``--turn S`` in alternating
turns of S seconds (ABBA order; each server's answers awaited between turns). Prints one JSON
list, an object per server in ``--port``'s order: percentiles, 201 evenly spaced quantiles
(0, 0.005, ..., 1) of the latencies in seconds, frames sent and answered, the server's CPU
cores while paced, and the client's send lag p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.paced import Target, latencies, percentile, raise_fd_limit, run_targets, take_cores


def summary(target: Target) -> dict[str, Any]:
    lat = latencies(target)
    r = target.result
    return {
        "streams": r.streams,
        "connected": r.connected,
        "stats_received": r.stats_received,
        "frames_sent": r.frames_sent,
        "frames_answered": len(lat),
        "p50": percentile(lat, 0.5),
        "p90": percentile(lat, 0.9),
        "p99": percentile(lat, 0.99),
        "max": percentile(lat, 1.0),
        "quantiles": [percentile(lat, i / 200) for i in range(201)],
        "server_cores": r.server_cores,
        "send_lag_p99": percentile(sorted(target.lags), 0.99),
        "errors": r.errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", required=True, help="comma-separated")
    parser.add_argument("--server-pid", required=True, help="comma-separated, as --port")
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--frame-bytes", type=int, default=640)
    parser.add_argument("--turn", type=float, default=0.0, help="seconds per turn (0: in order)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--cpus", default="", help="cores to run on, comma-separated")
    args = parser.parse_args()
    take_cores(args.cpus)
    raise_fd_limit()
    targets = asyncio.run(run_targets(args))
    print(json.dumps([summary(t) for t in targets]))


if __name__ == "__main__":
    main()
