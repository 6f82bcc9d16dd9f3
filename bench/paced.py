"""Real-time streams: frame -> event latency and server memory per connection, at N streams.

    python bench/paced.py [--streams 100,400,1000] [--duration 10] [--servers talkies,bare]
        [--turn 0.5] [--shared-cores] [--json]

For each N and each server (a fresh server process each time, ``servers.py --mode echo``), a
client process opens N WebSockets on raw sockets (asyncio protocols, one event loop), sends
``start`` and waits for ``ready`` on each, then paces every stream at one 640-byte frame per
20 ms of real time for ``--duration`` seconds, the N streams' send times spread evenly over
each 20 ms. Frame k carries k in its first four bytes.

- talkies answers through a recognition that returns one partial per ``accept()`` carrying the
  last frame's counter (behind the real ThreadedStream: a worker-thread hop per batch);
- (a) the bare anyio + wsproto loop answers every binary frame with a partial carrying k.

Latency of frame k = receipt of the first partial carrying a counter >= k minus the client's
send time of frame k (a batch of frames is answered by one partial). Server RSS per connection =
(RSS at mid-run - RSS before connecting, after one warm-up stream) / N, from /proc/<pid>/status.
Cores: on a machine with two or more, the server process runs on all cores but the last and the
client on the last (:func:`core_layout`), as a server and clients on other machines would; the
server's CPU per frame is the same either way, but a client on the server's cores competes with
it, and with a server that has a worker thread (talkies' decode rounds) that competition shows up
in the latency tail (bench/README.md, "Transport efficiency", third pass). ``--shared-cores``
runs the client on every core, as this benchmark did before. Either way the client's own
event-loop delays are part of the latency, and the "send lag" column shows how far behind
schedule it sent (p99).

``--turn SECONDS`` starts the servers of each N at once (all pinned to the server's cores) and
one client paces them in turns of that many seconds, in ABBA order (talkies, bare, bare,
talkies, ...), until each has had ``--duration`` seconds: whatever else the machine does
meanwhile (another process taking the server's core for a few ms, a slower minute) then falls
on both alike, instead of on whichever server happened to run at the time. Between turns
the client waits until the last server has answered every frame (2 s at most), so that a
backlog it is still working off never slows the next one; the server not being paced holds
its N idle streams. Without it (the default), the servers run one after
the other, each in a fresh process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ingest import (
    CpuWindow,
    Running,
    cpu_seconds,
    log_problems,
    server,
    wait_for_quiet,
)
from bench.loadgen import (
    END,
    MASK_KEY,
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    START,
    FrameReader,
    client_frame,
    close_frame,
    frame_header,
    mask,
    pcm_payload,
    split_response,
    text_frame,
    upgrade_request,
)

PERIOD = 0.020
HERE = Path(__file__).resolve().parent
PARTIAL_RE = re.compile(rb'^\{"type":"partial".*?"text":"(\d+)"')
LABELS = {
    "talkies": "talkies Server + echo engine",
    "talkies-inline": "talkies, echo engine inline (diag.)",
    "bare": "(a) anyio + wsproto bare echo",
}
REFERENCE_BARE_P99 = {400: "~3 ms", 1000: "~49 ms"}


def raise_fd_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class FrameMaker:
    """Masked binary frames whose payload starts with a little-endian uint32 counter."""

    def __init__(self, frame_bytes: int) -> None:
        payload = pcm_payload(frame_bytes)
        self._prefix = frame_header(OP_BINARY, frame_bytes)
        self._rest = mask(payload)[4:]  # the key repeats every 4 bytes: offset 4 is aligned
        self._key = int.from_bytes(MASK_KEY, "little")

    def __call__(self, k: int) -> bytes:
        return self._prefix + (k ^ self._key).to_bytes(4, "little") + self._rest


# -- the client ----------------------------------------------------------------------------------


class Stream(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, host: str, port: int) -> None:
        self._request = upgrade_request(host, port)
        self._head = b""
        self._reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.upgraded: asyncio.Future[None] = loop.create_future()
        self.ready: asyncio.Future[None] = loop.create_future()
        self.stats: asyncio.Future[dict[str, object]] = loop.create_future()
        self.sent: list[float] = []
        self.acked = 0
        self.latencies: list[float] = []
        self.gone = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(self._request)

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.gone:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        if not self.upgraded.done():
            self._head += data
            try:
                parts = split_response(self._head)
            except ConnectionError as exc:
                self._fail(exc)
                return
            if parts is None:
                return
            self.upgraded.set_result(None)
            data = parts[1]
        self._reader.feed(data)
        for opcode, payload in self._reader.frames():
            if opcode == OP_TEXT:
                self._on_text(payload)
            elif opcode == OP_PING:
                self.send(client_frame(OP_PONG, payload))
            elif opcode == OP_CLOSE:
                self.send(close_frame(1000))
                self.gone = True
                if self.transport is not None:
                    self.transport.close()

    def _on_text(self, payload: bytes) -> None:
        match = PARTIAL_RE.match(payload)
        if match is not None:
            now = time.perf_counter()
            counter = int(match.group(1))
            sent, acked = self.sent, self.acked
            top = min(counter + 1, len(sent))
            while acked < top:
                self.latencies.append(now - sent[acked])
                acked += 1
            self.acked = acked
            return
        message = json.loads(payload)
        kind = message.get("type")
        if kind == "ready" and not self.ready.done():
            self.ready.set_result(None)
        elif kind == "stats" and not self.stats.done():
            self.stats.set_result(message)
        elif kind == "error":
            self._fail(ConnectionError(f"server error: {message}"))

    def _fail(self, exc: BaseException) -> None:
        for future in (self.upgraded, self.ready, self.stats):
            if not future.done():
                future.set_exception(exc)
                future.exception()  # mark retrieved: not every future is awaited
        self.gone = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        self._fail(exc or ConnectionError("connection closed"))


@dataclass
class ClientResult:
    streams: int
    connected: int = 0
    connect_s: float = 0.0
    rss_before_kib: int = 0
    rss_mid_kib: int = 0
    frames_sent: int = 0
    frames_answered: int = 0
    stats_received: int = 0
    latencies_ms: dict[str, float] = field(default_factory=dict)
    send_lag_p99_ms: float = 0.0
    server_cores: float = 0.0  # server CPU seconds per second while pacing
    errors: list[str] = field(default_factory=list)


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


async def open_stream(host: str, port: int) -> Stream:
    loop = asyncio.get_running_loop()
    _, stream = await loop.create_connection(lambda: Stream(loop, host, port), host, port)
    await asyncio.wait_for(stream.upgraded, 10)
    stream.send(text_frame(START))
    await asyncio.wait_for(stream.ready, 10)
    return stream


async def finish(streams: list[Stream], timeout: float) -> int:
    """Send ``end`` on every stream; how many answered with stats within ``timeout``."""
    for s in streams:
        s.send(text_frame(END))
    done, _ = await asyncio.wait([asyncio.ensure_future(s.stats) for s in streams], timeout=timeout)
    return sum(1 for f in done if not f.cancelled() and f.exception() is None)


@dataclass
class Target:
    """One server the client paces: its streams, and what was measured of it so far."""

    result: ClientResult
    streams: list[Stream]
    pid: int
    total: int  # frames to pace in all
    sent: int = 0  # frames paced so far (the counter j of the pacing)
    cpu_s: float = 0.0  # the server's CPU seconds while its streams were paced
    paced_s: float = 0.0  # seconds its streams were paced
    lags: list[float] = field(default_factory=list)


async def connect(args: argparse.Namespace, port: int, pid: int, make: FrameMaker) -> Target:
    """A warm-up stream, the server's RSS before, then the N streams (started, ready)."""
    result = ClientResult(streams=args.streams)
    warm = await open_stream(args.host, port)
    for k in range(5):
        warm.send(make(k))
    await finish([warm], 5)
    await asyncio.sleep(0.3)
    result.rss_before_kib = rss_kib(pid)

    t0 = time.perf_counter()
    streams: list[Stream] = []
    for i in range(0, args.streams, 50):
        batch = [open_stream(args.host, port) for _ in range(min(50, args.streams - i))]
        for outcome in await asyncio.gather(*batch, return_exceptions=True):
            if isinstance(outcome, BaseException):
                result.errors.append(f"connect: {type(outcome).__name__}: {outcome}")
            else:
                streams.append(outcome)
    result.connect_s = time.perf_counter() - t0
    result.connected = len(streams)
    total = int(args.duration / PERIOD) * len(streams)
    return Target(result, streams, pid, total)


async def pace(target: Target, frames: int, make: FrameMaker, lead: float) -> None:
    """Send ``target``'s next ``frames`` frames at real time, starting ``lead`` s from now:
    one frame per stream per 20 ms, the streams' send times spread evenly over each 20 ms."""
    streams, live = target.streams, len(target.streams)
    slot = PERIOD / live
    half = target.total // 2
    perf = time.perf_counter
    start = perf() + lead
    cpu0 = cpu_seconds(target.pid)
    j0, i = target.sent, 0
    while i < frames:
        now = perf()
        due = start + i * slot
        if due > now:
            await asyncio.sleep(due - now)
            continue
        while i < frames and start + i * slot <= now:
            j = j0 + i
            stream = streams[j % live]
            if not stream.gone:
                frame = make(j // live)
                sent_at = perf()
                stream.sent.append(sent_at)
                stream.send(frame)
                target.lags.append(sent_at - (start + i * slot))
            i += 1
            if j + 1 == half:
                target.result.rss_mid_kib = rss_kib(target.pid)
        await asyncio.sleep(0)
    target.sent += frames
    target.cpu_s += cpu_seconds(target.pid) - cpu0
    target.paced_s += perf() - start


def segments(targets: Sequence[Target], seconds: float) -> list[tuple[Target, int]]:
    """The pacing schedule: (target, frames) in order. One target: all of it at once. More:
    turns of ``seconds`` each, in ABBA order (A B, B A, A B, ...), so that whatever else the
    machine does, and any drift, falls on every server alike."""
    if len(targets) == 1 or seconds <= 0:
        return [(t, t.total) for t in targets]
    plan: list[tuple[Target, int]] = []
    left = {id(t): t.total for t in targets}
    turn = 0
    while any(left.values()):
        order = list(targets) if turn % 2 == 0 else list(reversed(targets))
        for t in order:
            n = min(left[id(t)], max(1, round(seconds / PERIOD)) * len(t.streams))
            if n:
                plan.append((t, n))
                left[id(t)] -= n
        turn += 1
    return plan


async def answered(streams: Sequence[Stream], timeout: float) -> None:
    """Wait (``timeout`` s at most) until every frame sent on ``streams`` has its partial."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline and any(
        s.acked < len(s.sent) for s in streams if not s.gone
    ):
        await asyncio.sleep(0.001)


async def run_targets(args: argparse.Namespace) -> list[Target]:
    """Connect to each server of ``--port`` (comma-separated, with ``--server-pid`` in the same
    order), pace N streams on each (one after the other, or in turns of ``--turn`` s), let the
    answers arrive, end every stream (stats), close. The targets keep each frame's latency."""
    make = FrameMaker(args.frame_bytes)
    ports = [int(p) for p in str(args.port).split(",")]
    pids = [int(p) for p in str(args.server_pid).split(",")]
    targets = [await connect(args, port, pid, make) for port, pid in zip(ports, pids, strict=True)]
    live = [t for t in targets if t.streams]
    plan = segments(live, args.turn)
    for k, (target, frames) in enumerate(plan):
        await pace(target, frames, make, lead=0.05 if k == 0 else 0.0)
        if k + 1 < len(plan) and plan[k + 1][0] is not target:
            # Its answers first: a server still working off a backlog would slow the next.
            await answered(target.streams, 2.0)

    # Let the last answers arrive (bounded), then end every stream.
    everyone = [s for t in live for s in t.streams]
    await answered(everyone, 3.0)
    for target in live:
        alive = [s for s in target.streams if not s.gone]
        target.result.stats_received = await finish(alive, 8)
    await asyncio.sleep(0.2)
    for s in everyone:
        if s.transport is not None:
            s.transport.close()
    for target in live:
        result, streams = target.result, target.streams
        result.server_cores = target.cpu_s / max(target.paced_s, 1e-9)
        result.frames_sent = sum(len(s.sent) for s in streams)
        lost = sum(1 for s in streams if s.gone and not s.stats.done())
        if lost:
            result.errors.append(f"{lost} streams closed before their stats")
    return targets


def latencies(target: Target) -> list[float]:
    """Every answered frame's latency on ``target`` (seconds), sorted."""
    return sorted(x for s in target.streams for x in s.latencies)


async def run_client(args: argparse.Namespace) -> list[ClientResult]:
    """:func:`run_targets`, summed up per server in percentiles."""
    targets = await run_targets(args)
    for target in targets:
        if not target.streams:
            continue
        result, lat = target.result, latencies(target)
        result.frames_answered = len(lat)
        result.latencies_ms = {
            name: percentile(lat, q) * 1000
            for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))
        }
        result.send_lag_p99_ms = percentile(sorted(target.lags), 0.99) * 1000
    return [t.result for t in targets]


Layout = tuple[list[int], list[int]]  # (the server's cores, the client's cores)


def core_layout(shared: bool = False) -> Layout | None:
    """(the server's cores, the client's cores): the client on the last core this process may
    use, the server on the others; None (everything on every core) with ``shared`` or on a
    machine with one core."""
    cores = sorted(os.sched_getaffinity(0))
    if shared or len(cores) < 2:
        return None
    return cores[:-1], cores[-1:]


def pin(pid: int, cores: Sequence[int]) -> None:
    """Every thread of process ``pid`` onto ``cores`` (threads it starts later inherit)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that has just ended
            os.sched_setaffinity(int(task.name), cores)


def client_args(
    servers: Sequence[Running], n: int, duration: float, turn: float, layout: Layout | None
) -> list[str]:
    """Pin every server to its cores; the arguments of a paced client for them (this file's
    ``--client`` and peers/paced_cdf.py take the same): their ports and pids in one order, N
    streams each, the duration, the turn, and the client's own cores."""
    args = ["--port", ",".join(str(s.port) for s in servers)]
    args += ["--server-pid", ",".join(str(s.pid) for s in servers)]
    args += ["--streams", str(n), "--duration", str(duration), "--turn", str(turn)]
    if layout is not None:
        for s in servers:
            pin(s.pid, layout[0])
        args += ["--cpus", ",".join(map(str, layout[1]))]
    return args


def describe(layout: Layout | None) -> dict[str, list[int]] | None:
    """``layout`` for a results record."""
    return None if layout is None else {"server": layout[0], "client": layout[1]}


def take_cores(cpus: str) -> None:
    """A paced client's ``--cpus``: run this process on those cores (none: anywhere)."""
    if cpus:
        os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])


def client_main(args: argparse.Namespace) -> None:
    take_cores(args.cpus)
    raise_fd_limit()
    results = asyncio.run(run_client(args))
    print(json.dumps([r.__dict__ for r in results]))


# -- the orchestrator ----------------------------------------------------------------------------


def run_servers(
    kinds: Sequence[str], n: int, args: argparse.Namespace, logdir: Path
) -> dict[str, ClientResult]:
    """Start a server of each kind (all at once), pace N streams on each from one client
    process (in turns of ``args.turn`` s when there are several), stop them."""
    with contextlib.ExitStack() as stack:
        running = [stack.enter_context(server(k, "echo", logdir, args.frame_bytes)) for k in kinds]
        cmd = [sys.executable, str(HERE / "paced.py"), "--client"]
        cmd += client_args(running, n, args.duration, args.turn, args.layout)
        cmd += ["--frame-bytes", str(args.frame_bytes)]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
        timeout = args.duration * len(kinds) + 30 * len(kinds)
        out = subprocess.run(
            cmd, check=False, capture_output=True, text=True, timeout=timeout, env=env
        )
        if out.returncode != 0:
            raise RuntimeError(f"paced client failed: {out.stderr[-3000:]}")
        decoded = json.loads(out.stdout.strip().splitlines()[-1])
    results = {}
    for kind, r, raw in zip(kinds, running, decoded, strict=True):
        result = ClientResult(**raw)
        problems = log_problems(r.log)
        if problems:
            first = problems[0][:300]
            result.errors.append(f"{len(problems)} warning/error log lines, first: {first}")
        results[kind] = result
    return results


def measure(
    counts: Sequence[int] = (100, 400, 1000),
    kinds: Sequence[str] = ("talkies", "bare"),
    *,
    duration: float = 10.0,
    frame_bytes: int = 640,
    quiet_wait: float = 20.0,
    shared_cores: bool = False,
    turn: float = 0.0,
) -> dict[str, Any]:
    """Run the benchmark (what the CLI does) and return its results as a dict.

    ``rows``: one dict per (N, server), in run order; ``ratios``: for each N (a str key)
    talkies / bare of ``us_per_frame`` and ``p99_ms`` when both ran; ``cores``: the server's
    and the client's, or None if they shared every core; ``notes``: problems. Progress rows
    go to stderr.
    """
    raise_fd_limit()
    layout = core_layout(shared_cores)
    args = argparse.Namespace(duration=duration, frame_bytes=frame_bytes, layout=layout, turn=turn)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    budget = [quiet_wait]
    together = turn > 0 and len(kinds) > 1
    with tempfile.TemporaryDirectory(prefix="talkies-paced-") as tmp:
        for n in counts:
            for group in [list(kinds)] if together else [[k] for k in kinds]:
                if budget[0] > 0:
                    wait_for_quiet(budget)
                with CpuWindow() as window:
                    results = run_servers(group, n, args, Path(tmp))
                for kind, r in results.items():
                    row = make_row(kind, n, r, window.others_cores)
                    rows.append(row)
                    print(format_row(row), file=sys.stderr)
                    if r.connected != n or r.stats_received != r.connected:
                        notes.append(
                            f"{kind} N={n}: connected {r.connected}/{n}, "
                            f"stats {r.stats_received}/{r.connected}"
                        )
                    notes.extend(f"{kind} N={n}: {e}" for e in r.errors[:5])
    ratios: dict[str, dict[str, float]] = {}
    for n in counts:
        by_kind = {row["server"]: row for row in rows if row["streams"] == n}
        if "talkies" in by_kind and "bare" in by_kind:
            t, b = by_kind["talkies"], by_kind["bare"]
            ratios[str(n)] = {
                key: t[key] / b[key] if b[key] else float("nan")
                for key in ("us_per_frame", "p99_ms")
            }
    return {
        "period": PERIOD,
        "duration": duration,
        "frame_bytes": frame_bytes,
        "rows": rows,
        "ratios": ratios,
        "cores": describe(layout),
        "turn": turn if together else 0.0,
        "notes": notes,
    }


def make_row(kind: str, n: int, r: ClientResult, other_cores: float) -> dict[str, Any]:
    frames_per_s = r.connected / PERIOD
    return {
        "server": kind,
        "label": LABELS[kind],
        "streams": n,
        **{f"{k}_ms": v for k, v in r.latencies_ms.items()},
        "answered": r.frames_answered / max(r.frames_sent, 1),
        "kib_per_conn": (r.rss_mid_kib - r.rss_before_kib) / max(r.connected, 1),
        "server_cores": r.server_cores,
        "us_per_frame": r.server_cores / max(frames_per_s, 1) * 1e6,
        "send_lag_p99_ms": r.send_lag_p99_ms,
        "connect_s": r.connect_s,
        "other_cores": other_cores,
        "connected": r.connected,
        "stats_received": r.stats_received,
        "errors": r.errors,
    }


def format_row(row: dict[str, Any]) -> str:
    return (
        f"{row['label']:36s} {row['streams']:>5d} {row['p50_ms']:>8.1f} {row['p90_ms']:>8.1f} "
        f"{row['p99_ms']:>8.1f} {row['max_ms']:>8.1f} {row['answered']:>8.1%} "
        f"{row['kib_per_conn']:>8.1f} {row['server_cores']:>9.2f} {row['us_per_frame']:>8.0f} "
        f"{row['send_lag_p99_ms']:>6.1f} {row['connect_s']:>6.2f} {row['other_cores']:>5.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default="100,400,1000")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of paced audio")
    parser.add_argument("--servers", default="talkies,bare", help="comma-separated subset")
    parser.add_argument("--frame-bytes", type=int, default=640)
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="seconds in all to wait for other processes to leave the CPUs idle (0: don't)",
    )
    parser.add_argument(
        "--shared-cores",
        action="store_true",
        help="run the client on the server's cores too (default: the client on the last core)",
    )
    parser.add_argument(
        "--turn",
        type=float,
        default=0.0,
        help="seconds per turn: run the servers at once and pace them in turns (0: one after "
        "the other)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    # The client process (started by the orchestrator):
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", default="0", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", default="0", help=argparse.SUPPRESS)
    parser.add_argument("--cpus", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        args.streams = int(args.streams)
        client_main(args)
        return

    counts = [int(x) for x in args.streams.split(",") if x]
    kinds = [k for k in args.servers.split(",") if k]
    print(f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus")
    layout = core_layout(args.shared_cores)
    where = (
        f"the client process shares the {os.cpu_count()} cores with the server"
        if layout is None
        else f"server on cores {layout[0]}, client on core {layout[1][0]}"
    )
    print(
        f"paced: 1 frame of {args.frame_bytes} bytes per {PERIOD * 1000:.0f} ms per stream, "
        f"{args.duration:g} s; {where} (the client's delays count in the latency)"
    )
    header = (
        f"{'server':36s} {'N':>5s} {'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s} {'max ms':>8s} "
        f"{'answered':>8s} {'KiB/conn':>8s} {'srv cores':>9s} {'us/frame':>8s} {'lag ms':>6s} "
        f"{'conn s':>6s} {'other':>5s}"
    )
    results = measure(
        counts,
        kinds,
        duration=args.duration,
        frame_bytes=args.frame_bytes,
        quiet_wait=args.quiet_wait,
        shared_cores=args.shared_cores,
        turn=args.turn,
    )
    print()
    print(header)
    for row in results["rows"]:
        print(format_row(row))
    for n, ratio in results["ratios"].items():
        print(
            f"talkies/bare at N={n}: CPU per frame {ratio['us_per_frame']:.2f}x, "
            f"p99 {ratio['p99_ms']:.2f}x"
        )
    refs = ", ".join(f"{v} at {k}" for k, v in REFERENCE_BARE_P99.items())
    print(
        "answered: frames whose partial arrived (3 s drain after the last frame); KiB/conn: "
        "server RSS growth per stream at mid-run;\nsrv cores: server CPU-s per s while pacing; "
        "us/frame: server CPU per frame sent; lag ms: client send lag p99 (client overloaded "
        "if large);\nconn s: time to open and start the N streams; other: cores busy with "
        f"processes outside this benchmark (of {os.cpu_count()}), above ~0.2 latencies "
        "are disturbed"
    )
    print(f"reference, bare loop p99 measured earlier on this machine: {refs}")
    for note in results["notes"]:
        print("note: " + note)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
