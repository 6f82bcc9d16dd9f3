"""Frames/s a whole server ingests, talkies beside three peers, in one run.

    python bench/ingest.py [--frames 200000] [--connections 4] [--repeat 3] [--frame-bytes 640]

Each server runs in its own process (``servers.py``) and is driven by the raw-socket load
generator (``loadgen.py``) in another process: ``--connections`` concurrent WebSockets share
``--frames`` pre-masked binary frames, sent in bulk; the rate of a run is all frames / (first
frame sent -> last ``stats`` received). Best of ``--repeat`` runs against one warm server
process per peer; the servers' runs are interleaved round-robin.

- talkies: the real Server, StreamSession and ThreadedStream with a null recognition.
- (a) bare: anyio + h11 upgrade + wsproto, counting frames: the ceiling for talkies' stack.
- (b) starlette: uvicorn (h11, ``--ws wsproto``, asyncio loop) + a Starlette WebSocket route.
- (c) websockets: the ``websockets`` asyncio server (C-accelerated framing).
Ratios are talkies / peer; the goals are >= 0.9x (a) and >= 1.2x (b).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
NOISY = 0.2  # cores of other load above which a measurement is not trusted
GOALS = {"bare": 0.9, "starlette": 1.2}
REFERENCE = {"bare": 93_000, "starlette": 76_000, "websockets": 178_000}
LABELS = {
    "talkies": "talkies Server + null engine",
    "talkies-inline": "talkies, null engine inline (diag.)",
    "bare": "(a) anyio + wsproto bare loop",
    "starlette": "(b) uvicorn + Starlette (wsproto)",
    "websockets": "(c) websockets asyncio server",
}


@dataclass
class Running:
    port: int
    pid: int
    log: Path


def env() -> dict[str, str]:
    """This environment, with the checkout first on the import path."""
    out = dict(os.environ)
    out["PYTHONPATH"] = str(ROOT) + os.pathsep + out.get("PYTHONPATH", "")
    return out


@contextmanager
def server(kind: str, mode: str, logdir: Path, frame_bytes: int = 640) -> Iterator[Running]:
    """Start ``servers.py kind`` in its own process; stop it with SIGTERM on exit."""
    log = logdir / f"{kind}-{mode}.log"
    cmd = [sys.executable, str(HERE / "servers.py"), kind, "--mode", mode]
    cmd += ["--frame-bytes", str(frame_bytes)]
    with log.open("wb") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=err,
            env=env(),
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().decode()
            if not line.startswith("PORT "):
                raise RuntimeError(f"{kind} did not start: {log.read_text()[-2000:]}")
            yield Running(int(line.split()[1]), proc.pid, log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _busy_ticks() -> tuple[int, int]:
    """(busy, total) CPU ticks of the whole machine so far, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields[:8]) - idle, sum(fields[:8])


def _own_cpu() -> float:
    """CPU seconds of this process and its waited-for children (servers, load generators)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuWindow:
    """How many cores other processes kept busy while a measurement ran (noise indicator).

    Counted as ours: this process, the children it waited for inside the block, and the
    running processes ``pids`` (servers that outlive the block).
    """

    def __init__(self, pids: tuple[int, ...] = ()) -> None:
        self.others_cores = 0.0
        self._pids = pids
        self._hz = os.sysconf("SC_CLK_TCK")

    def _ours(self) -> float:
        return _own_cpu() + sum(cpu_seconds(pid) for pid in self._pids)

    def __enter__(self) -> CpuWindow:
        self._busy, self._total = _busy_ticks()
        self._own = self._ours()
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        busy, _ = _busy_ticks()
        wall = max(time.monotonic() - self._t0, 1e-6)
        others = (busy - self._busy) / self._hz - (self._ours() - self._own)
        self.others_cores = max(others, 0.0) / wall


def wait_for_quiet(budget: list[float], threshold: float = 0.25) -> float:
    """Wait (out of the shared ``budget`` seconds) until the machine is nearly idle.

    Other processes on a 2-core machine skew every number here; this samples the machine's
    busy cores over 0.5 s until they fall under ``threshold`` or the budget runs out.
    Returns the last sample (cores busy).
    """
    busy = float("inf")
    hz = os.sysconf("SC_CLK_TCK")
    while True:
        b0, _ = _busy_ticks()
        t0 = time.monotonic()
        time.sleep(0.5)
        b1, _ = _busy_ticks()
        took = time.monotonic() - t0
        busy = (b1 - b0) / hz / took
        budget[0] -= took
        if busy < threshold or budget[0] <= 0:
            return busy


def log_problems(log: Path) -> list[str]:
    """Lines of a server log that look like trouble (warnings, errors, tracebacks)."""
    bad = ('"level": "warning"', '"level": "error"', '"level": "critical"', "Traceback")
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if any(b in line for b in bad)]


def measure_once(port: int, args: argparse.Namespace) -> float:
    cmd = [sys.executable, str(HERE / "loadgen.py"), "--port", str(port), "--json"]
    cmd += ["--frames", str(args.frames), "--connections", str(args.connections)]
    cmd += ["--repeat", "1", "--frame-bytes", str(args.frame_bytes)]
    out = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=150, env=env())
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed: {out.stderr[-2000:]}")
    rates: list[float] = json.loads(out.stdout.strip().splitlines()[-1])["rates"]
    return rates[0]


def measure(
    kinds: Sequence[str] = ("talkies", "bare", "starlette", "websockets"),
    *,
    frames: int = 200_000,
    connections: int = 4,
    repeat: int = 3,
    frame_bytes: int = 640,
    quiet_wait: float = 30.0,
) -> dict[str, Any]:
    """Run the benchmark (what the CLI does) and return its results as a dict.

    ``best`` / ``per_cpu``: each server's best frames/s and frames per server CPU-second;
    ``other_cores``: other load during the best run; ``ratios``: talkies / peer of both;
    ``goals``: for (a) and (b), whether talkies' frames/s ratio meets its goal; ``runs``: every
    run's (frames/s, other load); ``problems``: warning/error lines of each server's log.
    Progress lines go to stderr.
    """
    args = argparse.Namespace(frames=frames, connections=connections, frame_bytes=frame_bytes)
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}  # (rate, noise)
    per_cpu: dict[str, list[float]] = {k: [] for k in kinds}  # frames per server CPU-second
    budget = [quiet_wait]
    with tempfile.TemporaryDirectory(prefix="talkies-bench-") as tmp, ExitStack() as stack:
        # All servers up at once (idle ones cost nothing); runs interleaved round-robin so
        # that load from other processes spreads over all of them rather than hitting one.
        running = {
            k: stack.enter_context(server(k, "count", Path(tmp), frame_bytes)) for k in kinds
        }
        for r in range(repeat):
            for kind in kinds:
                if budget[0] > 0:
                    wait_for_quiet(budget)
                cpu0 = cpu_seconds(running[kind].pid)
                with CpuWindow((running[kind].pid,)) as window:
                    rate = measure_once(running[kind].port, args)
                runs[kind].append((rate, window.others_cores))
                per_cpu[kind].append(frames / (cpu_seconds(running[kind].pid) - cpu0))
                print(
                    f"  run {r + 1} {kind:10s} {rate:>10,.0f} frames/s "
                    f"{per_cpu[kind][-1]:>10,.0f} per CPU-s "
                    f"(other load {window.others_cores:.2f} cores)",
                    file=sys.stderr,
                )
        stack.close()  # stop the servers, so that their logs are complete
        problems = {k: log_problems(running[k].log) for k in kinds}
    best = {k: max(runs[k])[0] for k in kinds}
    ratios: dict[str, dict[str, float]] = {}
    goals: dict[str, bool] = {}
    if "talkies" in best:
        for kind in kinds:
            if kind == "talkies":
                continue
            ratios[kind] = {
                "frames_per_s": best["talkies"] / best[kind],
                "per_cpu": max(per_cpu["talkies"]) / max(per_cpu[kind]),
            }
            if kind in GOALS:
                goals[kind] = ratios[kind]["frames_per_s"] >= GOALS[kind]
    return {
        "frames": frames,
        "connections": connections,
        "frame_bytes": frame_bytes,
        "best": best,
        "per_cpu": {k: max(per_cpu[k]) for k in kinds},
        "other_cores": {k: max(runs[k])[1] for k in kinds},
        "ratios": ratios,
        "goals": goals,
        "runs": runs,
        "problems": problems,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--frame-bytes", type=int, default=640)
    parser.add_argument(
        "--servers", default="talkies,bare,starlette,websockets", help="comma-separated subset"
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=30.0,
        help="seconds in all to wait for other processes to leave the CPUs idle (0: don't)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()
    kinds = [k for k in args.servers.split(",") if k]

    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus")
    print(
        f"{args.frames} frames of {args.frame_bytes} bytes over {args.connections} connections, "
        f"best of {args.repeat}; server and load generator in separate processes"
    )
    results = measure(
        kinds,
        frames=args.frames,
        connections=args.connections,
        repeat=args.repeat,
        frame_bytes=args.frame_bytes,
        quiet_wait=args.quiet_wait,
    )
    best, cpu_best, noise = results["best"], results["per_cpu"], results["other_cores"]

    print()
    print(
        f"{'server':36s} {'frames/s':>9s} {'talkies/peer':>12s}  {'goal':14s} {'reference':9s} "
        f"{'other load':>10s}  {'per CPU-s':>9s} {'talkies/peer':>12s}"
    )
    for kind in kinds:
        rate, cpu_rate = best[kind], cpu_best[kind]
        ratio = goal = cpu_ratio = ""
        if kind in results["ratios"]:
            ratio = f"{results['ratios'][kind]['frames_per_s']:.2f}x"
            cpu_ratio = f"{results['ratios'][kind]['per_cpu']:.2f}x"
            if kind in GOALS:
                goal = f">={GOALS[kind]}x {'met' if results['goals'][kind] else 'MISSED'}"
                if max(noise[kind], noise["talkies"]) > NOISY:
                    goal += "?"
        ref = f"~{REFERENCE[kind] // 1000}k" if kind in REFERENCE else ""
        print(
            f"{LABELS[kind]:36s} {rate:>9,.0f} {ratio:>12s}  {goal:14s} {ref:9s} "
            f"{noise[kind]:>5.2f} cores  {cpu_rate:>9,.0f} {cpu_ratio:>12s}"
        )
    print(
        "other load: cores kept busy by processes outside this benchmark during that server's "
        f"best run (of {os.cpu_count()}); above {NOISY} the wall-clock numbers are disturbed "
        "(a goal verdict then ends in ?).\nper CPU-s: frames per CPU-second of the server "
        "process (all threads), best run: what one uncontended core would ingest if the server "
        "is CPU-bound; much steadier than frames/s on a busy machine."
    )
    for kind, lines in results["problems"].items():
        if lines:
            print(f"\n{kind}: {len(lines)} warning/error log lines, first ones:")
            for line in lines[:5]:
                print("  " + line[:300])
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
