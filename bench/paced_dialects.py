"""Server CPU per 20 ms of audio on the native route and on each translated one (issue 22).

    python bench/paced_dialects.py [--streams 100] [--warmup 5] [--window 20] [--rounds 3]
        [--routes native,listen,realtime20,realtime100] [--out FILE] [--py-spy DIR]

The real talkies ``Server`` (``servers.py talkies --mode count``: the standalone h11 + wsproto
server on anyio, the real engine runtime, a recognition that does nothing) in a fresh process
for each run, and a client process of its own (asyncio on raw sockets, one event loop) that
opens N streams on one route and paces each at real time, the N streams' send times spread
evenly over each period:

- ``native``: ``/v1/audio/transcriptions/stream``, ``start``, then one 640-byte binary frame
  (20 ms of 16 kHz PCM16) per 20 ms; ``end`` at the close;
- ``listen``: ``/v1/listen?...&encoding=linear16&sample_rate=16000``, the same binary frames
  from the start (no start message); ``CloseStream`` at the close;
- ``realtime20``: ``/v1/realtime?intent=transcription``, a ``session.update``, then one
  ``input_audio_buffer.append`` per 20 ms carrying 20 ms of 24 kHz PCM16 (960 bytes, base64);
- ``realtime100``: the same with 100 ms appends (4800 bytes) every 100 ms.

After ``--warmup`` seconds of pacing the client reads the server process's CPU time (psutil:
user + system, all threads), again ``--window`` seconds later, and divides by the 20 ms units
of audio it sent in between. Routes run one after the other in a round, in alternating order
(A B C D, D C B A, ...) for ``--rounds`` rounds; each translated route's ratio to native is
taken within its round, and the median over rounds is reported. The server's "stream closed"
log lines check that every stream's audio arrived (audio seconds against what was sent).

Cores: as ``paced.py``, the server on all cores but the last, the client on the last. The
load average and the CPU other processes used during each run ("other", cores) are recorded:
on this shared machine, compare runs at low load. ``--py-spy DIR``: also record the server with
py-spy during the window (py-spy on PATH or ``--py-spy-bin``), one text profile per run.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ingest import CpuWindow, Running, env, server, wait_for_quiet
from bench.loadgen import (
    END,
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    START,
    STREAM_PATH,
    FrameReader,
    client_frame,
    close_frame,
    pcm_payload,
    split_response,
    text_frame,
    upgrade_request,
)
from bench.paced import core_layout, pin, raise_fd_limit, take_cores

HERE = Path(__file__).resolve().parent
UNIT = 0.020  # seconds of audio the CPU is counted per


@dataclass(frozen=True)
class Route:
    name: str
    label: str
    path: str
    period: float  # seconds of audio per message (and between a stream's messages)
    message: bytes  # one masked client frame, sent every period

    @property
    def units(self) -> int:  # 20 ms units of audio per message
        return round(self.period / UNIT)


def _append(ms: int) -> bytes:
    pcm = pcm_payload(48 * ms)  # 24 kHz PCM16: 48 bytes per ms
    audio = base64.b64encode(pcm).decode()
    return text_frame({"type": "input_audio_buffer.append", "audio": audio})


ROUTES = {
    "native": Route(
        "native",
        "native /v1/audio/transcriptions/stream",
        STREAM_PATH,
        0.020,
        client_frame(OP_BINARY, pcm_payload(640)),
    ),
    "listen": Route(
        "listen",
        "Deepgram /v1/listen, 16 kHz",
        "/v1/listen?model=null&encoding=linear16&sample_rate=16000",
        0.020,
        client_frame(OP_BINARY, pcm_payload(640)),
    ),
    "realtime20": Route(
        "realtime20",
        "Realtime, 20 ms appends (24 kHz)",
        "/v1/realtime?intent=transcription&model=null",
        0.020,
        _append(20),
    ),
    "realtime100": Route(
        "realtime100",
        "Realtime, 100 ms appends (24 kHz)",
        "/v1/realtime?intent=transcription&model=null",
        0.100,
        _append(100),
    ),
}
SESSION_UPDATE = {"type": "session.update", "session": {"type": "transcription"}}


# -- the client ----------------------------------------------------------------------------------


class Stream(asyncio.Protocol):
    """One client WebSocket on raw sockets: the upgrade, the server's messages by type."""

    def __init__(self, loop: asyncio.AbstractEventLoop, host: str, port: int, path: str) -> None:
        self._request = upgrade_request(host, port, path)
        self._head = b""
        self._reader = FrameReader()
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.upgraded: asyncio.Future[None] = loop.create_future()
        self.closed: asyncio.Future[None] = loop.create_future()
        self.waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self.errors: list[str] = []
        self.gone = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self._request)

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.gone:
            self.transport.write(data)

    def expect(self, kind: str) -> asyncio.Future[dict[str, Any]]:
        """The next (or an already received, not yet awaited) message of type ``kind``."""
        future = self.waiting.get(kind)
        if future is None:
            future = self.waiting[kind] = self._loop.create_future()
        return future

    def data_received(self, data: bytes) -> None:
        if not self.upgraded.done():
            self._head += data
            try:
                parts = split_response(self._head)
            except ConnectionError as exc:
                self.upgraded.set_exception(exc)
                self._end()
                return
            if parts is None:
                return
            self.upgraded.set_result(None)
            data = parts[1]
        self._reader.feed(data)
        for opcode, payload in self._reader.frames():
            if opcode == OP_TEXT:
                message = json.loads(payload)
                kind = str(message.get("type"))
                if kind.lower() == "error":
                    self.errors.append(payload.decode(errors="replace")[:300])
                future = self.waiting.get(kind)
                if future is None:
                    future = self.waiting[kind] = self._loop.create_future()
                if not future.done():
                    future.set_result(message)
            elif opcode == OP_PING:
                self.send(client_frame(OP_PONG, payload))
            elif opcode == OP_CLOSE:
                self.send(close_frame(1000))
                self._end()

    def _end(self) -> None:
        self.gone = True
        if not self.closed.done():
            self.closed.set_result(None)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        if not self.closed.done():
            self.closed.set_result(None)
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(exc or ConnectionError("connection closed"))
                future.exception()


async def open_stream(route: Route, host: str, port: int) -> Stream:
    loop = asyncio.get_running_loop()
    _, stream = await loop.create_connection(
        lambda: Stream(loop, host, port, route.path), host, port
    )
    await asyncio.wait_for(stream.upgraded, 10)
    if route.name == "native":
        ready = stream.expect("ready")
        stream.send(text_frame(START))
        await asyncio.wait_for(ready, 10)
    elif route.name.startswith("realtime"):
        await asyncio.wait_for(stream.expect("session.created"), 10)
        updated = stream.expect("session.updated")
        stream.send(text_frame(SESSION_UPDATE))
        await asyncio.wait_for(updated, 10)
    return stream


async def close_stream(route: Route, stream: Stream) -> None:
    if route.name == "native":
        stream.send(text_frame(END))
    elif route.name == "listen":
        stream.send(text_frame({"type": "CloseStream"}))
    else:
        stream.send(close_frame(1000))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(stream.closed), 10)
    if stream.transport is not None:
        stream.transport.close()


def server_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def server_system(pid: int) -> float:
    return float(psutil.Process(pid).cpu_times().system)


def server_switches(pid: int) -> int:
    """The server's context switches so far, all threads (voluntary + involuntary): a GIL
    handed between the event loop and the engine's threads shows here."""
    total = 0
    for thread in psutil.Process(pid).threads():
        with contextlib.suppress(OSError):
            status = Path(f"/proc/{pid}/task/{thread.id}/status").read_text()
            for line in status.splitlines():
                if "ctxt_switches:" in line:
                    total += int(line.split()[-1])
    return total


@dataclass
class ClientResult:
    route: str
    streams: int
    connected: int = 0
    sent_messages: int = 0
    window_cpu_s: float = 0.0
    window_switches: int = 0
    window_system_s: float = 0.0  # of window_cpu_s, in the kernel
    window_wall_s: float = 0.0
    window_units: int = 0  # 20 ms units of audio sent in the window
    send_lag_p99_ms: float = 0.0
    errors: list[str] = field(default_factory=list)


async def run_client(args: argparse.Namespace) -> ClientResult:
    route = ROUTES[args.route]
    result = ClientResult(route.name, args.streams)
    streams: list[Stream] = []
    for i in range(0, args.streams, 50):
        batch = [open_stream(route, args.host, args.port) for _ in range(min(50, args.streams - i))]
        for outcome in await asyncio.gather(*batch, return_exceptions=True):
            if isinstance(outcome, BaseException):
                result.errors.append(f"connect: {type(outcome).__name__}: {outcome}")
            else:
                streams.append(outcome)
    result.connected = live = len(streams)
    if not streams:
        return result
    slot = route.period / live
    first = round(args.warmup / slot)  # the window's first and last message
    last = first + round(args.window / slot)
    message = route.message
    perf = time.perf_counter
    lags: list[float] = []
    start = perf() + 0.05
    i = 0
    cpu0 = t0 = 0.0
    switches0 = 0
    system0 = 0.0
    while i < last:
        now = perf()
        due = start + i * slot
        if due > now:
            await asyncio.sleep(due - now)
            continue
        while i < last and start + i * slot <= now:
            if i == first:
                cpu0, t0 = server_cpu(args.server_pid), perf()
                switches0 = server_switches(args.server_pid)
                system0 = server_system(args.server_pid)
            stream = streams[i % live]
            if not stream.gone:
                lags.append(perf() - (start + i * slot))
                stream.send(message)
            i += 1
        await asyncio.sleep(0)
    result.window_cpu_s = server_cpu(args.server_pid) - cpu0
    result.window_wall_s = perf() - t0
    result.window_switches = server_switches(args.server_pid) - switches0
    result.window_system_s = server_system(args.server_pid) - system0
    result.window_units = (last - first) * route.units
    result.sent_messages = i
    lags.sort()
    result.send_lag_p99_ms = lags[int(0.99 * (len(lags) - 1))] * 1000
    await asyncio.gather(*(close_stream(route, s) for s in streams))
    for s in streams:
        result.errors.extend(s.errors[:2])
    return result


def client_main(args: argparse.Namespace) -> None:
    take_cores(args.cpus)
    raise_fd_limit()
    print(json.dumps(asdict(asyncio.run(run_client(args)))))


# -- the orchestrator ----------------------------------------------------------------------------


def stream_lines(log: Path) -> list[dict[str, Any]]:
    """The server's "stream closed" log lines."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if '"stream closed"' in line:
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def problems(log: Path) -> list[str]:
    bad = ('"level": "warning"', '"level": "error"', '"level": "critical"', "Traceback")
    return [x for x in log.read_text(errors="replace").splitlines() if any(b in x for b in bad)]


def run_one(route: str, args: argparse.Namespace, logdir: Path, tag: str) -> dict[str, Any]:
    """A fresh server, one client pacing ``--streams`` streams on ``route``; the row."""
    layout = core_layout(False)
    logdir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    with CpuWindow() as window, server("talkies", "count", logdir) as running:
        spy = start_py_spy(running, args, tag)
        cmd = [sys.executable, str(HERE / "paced_dialects.py"), "--client", "--route", route]
        cmd += ["--port", str(running.port), "--server-pid", str(running.pid)]
        cmd += ["--streams", str(args.streams), "--warmup", str(args.warmup)]
        cmd += ["--window", str(args.window)]
        if layout is not None:
            pin(running.pid, layout[0])
            cmd += ["--cpus", ",".join(map(str, layout[1]))]
        out = subprocess.run(
            cmd,
            check=False,
            capture_output=True,
            text=True,
            timeout=args.warmup + args.window + 120,
            env=env(),
        )
        if spy is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                spy.wait(timeout=args.window + 30)
        log = running.log
    if out.returncode != 0:
        raise RuntimeError(f"client failed: {out.stderr[-3000:]}")
    raw = json.loads(out.stdout.strip().splitlines()[-1])
    lines = stream_lines(log)  # a fresh server: every stream it served is this run's
    sent_s = raw["sent_messages"] * ROUTES[route].period
    got_s = sum(float(x.get("audio_seconds") or 0.0) for x in lines)
    return {
        "route": route,
        "label": ROUTES[route].label,
        "tag": tag,
        **raw,
        "us_per_unit": raw["window_cpu_s"] / max(raw["window_units"], 1) * 1e6,
        "server_cores": raw["window_cpu_s"] / max(raw["window_wall_s"], 1e-9),
        "switches_per_unit": raw["window_switches"] / max(raw["window_units"], 1),
        "system_us_per_unit": raw["window_system_s"] / max(raw["window_units"], 1) * 1e6,
        "other_cores": window.others_cores,
        "load1_before": load_before,
        "load1_after": os.getloadavg()[0],
        "streams_closed": len(lines),
        "routes_logged": sorted({str(x.get("route")) for x in lines}),
        "outcomes": sorted({str(x.get("outcome")) for x in lines}),
        "audio_sent_s": round(sent_s, 2),
        "audio_received_s": round(got_s, 2),
        "log_problems": problems(log)[:3],
    }


def start_py_spy(
    running: Running, args: argparse.Namespace, tag: str
) -> subprocess.Popen[bytes] | None:
    if not args.py_spy:
        return None
    folder = Path(args.py_spy)
    folder.mkdir(parents=True, exist_ok=True)
    # Starts recording once the warm-up is over (the client connects and paces first).
    script = (
        f"sleep {args.warmup + 1.5}; exec {args.py_spy_bin} record -r 200 --nonblocking -f raw "
        f"-d {int(args.window)} -p {running.pid} -o {folder / (tag + '.txt')}"
    )
    return subprocess.Popen(
        ["sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def format_row(row: dict[str, Any]) -> str:
    return (
        f"{row['tag']:>4s} {row['label']:36s} {row['connected']:>4d} "
        f"{row['us_per_unit']:>9.1f} {row['system_us_per_unit']:>6.1f} "
        f"{row['switches_per_unit']:>6.2f} {row['server_cores']:>6.2f} "
        f"{row['send_lag_p99_ms']:>7.1f} "
        f"{row['audio_received_s']:>9.1f}/{row['audio_sent_s']:<9.1f} "
        f"{row['other_cores']:>5.2f} {row['load1_before']:>5.2f}"
    )


HEADER = (
    f"{'run':>4s} {'route':36s} {'N':>4s} {'us/20ms':>9s} {'sys':>6s} {'ctx':>6s} {'cores':>6s} "
    f"{'lag p99':>7s} "
    f"{'audio recv/sent s':>19s} {'other':>5s} {'load1':>5s}"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds paced before the window")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--routes", default=",".join(ROUTES))
    parser.add_argument("--quiet-wait", type=float, default=10.0)
    parser.add_argument("--out", default="", help="also write the report here")
    parser.add_argument("--json", default="", help="write every row as JSON lines here")
    parser.add_argument("--py-spy", default="", help="record py-spy profiles into this folder")
    parser.add_argument("--py-spy-bin", default="py-spy")
    # The client process (started by the orchestrator):
    parser.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--route", default="native", help=argparse.SUPPRESS)
    parser.add_argument("--host", default="127.0.0.1", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--cpus", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args)
        return

    raise_fd_limit()
    routes = [r for r in args.routes.split(",") if r]
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    layout = core_layout(False)
    say(
        f"python {platform.python_version()} on {platform.machine()}, {os.cpu_count()} cpus; "
        f"server cores {layout[0] if layout else 'all'}, client core "
        f"{layout[1] if layout else 'all'}; N={args.streams}, warm-up {args.warmup:g} s, "
        f"window {args.window:g} s, {args.rounds} rounds, started "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC"
    )
    say(HEADER)
    rows: list[dict[str, Any]] = []
    budget = [args.quiet_wait]
    with tempfile.TemporaryDirectory(prefix="talkies-dialects-") as tmp:
        for r in range(args.rounds):
            order = routes if r % 2 == 0 else list(reversed(routes))
            for k, route in enumerate(order):
                if budget[0] > 0:
                    wait_for_quiet(budget)
                row = run_one(route, args, Path(tmp) / f"{r}-{k}", f"{r + 1}{'abcd'[k]}")
                row["round"] = r + 1
                rows.append(row)
                say(format_row(row))
                for note in row["errors"][:3] + row["log_problems"]:
                    say(f"     note: {note[:200]}")
    say()
    say("us/20ms: server CPU (user+system, all threads) per 20 ms of audio received in the window;")
    say("sys: of us/20ms, the kernel's part (system time);")
    say("ctx: the server's context switches (all threads) per 20 ms of audio in the window;")
    say(
        "cores: server CPU-s per s; lag p99: client send lag; other: cores used by other processes;"
    )
    say("load1: the 1-minute load average when the run began (other engineers' work included)")
    say()
    say(f"{'route':36s} {'us/20ms per round':>30s} {'ratio to native':>24s} {'median':>7s}")
    native = {row["round"]: row["us_per_unit"] for row in rows if row["route"] == "native"}
    for route in routes:
        mine = {row["round"]: row["us_per_unit"] for row in rows if row["route"] == route}
        ratios = [mine[r] / native[r] for r in sorted(mine) if r in native]
        per = " ".join(f"{mine[r]:.1f}" for r in sorted(mine))
        rats = " ".join(f"{x:.2f}" for x in ratios)
        median = f"{statistics.median(ratios):.2f}x" if ratios else "-"
        say(f"{ROUTES[route].label:36s} {per:>30s} {rats:>24s} {median:>7s}")
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    if args.json:
        with open(args.json, "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
