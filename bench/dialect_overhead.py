"""What the Deepgram translation adds to a frame's server CPU (issue 22: at most 1.1 times).

    .venv/bin/python bench/dialect_overhead.py [--frames 200000] [--batch 5] [--repeat 5]

The per-frame path of both routes, in one process, on CPU time: the native route hands each
transport read to the session (``StreamSession.handle(AudioBatch)``), ``/v1/listen`` hands it
to the translator first (``ListenTranslator.client``: the audio's byte count and sha256) and
then to the same session. The transport's own work (wsproto, the socket, the engine feed) is
the same for both and left out, so the ratio printed is an upper bound of the ratio of whole
server CPU per frame. ``--batch``: 20 ms frames per read (a paced client's reads hold one to
a few).
"""

from __future__ import annotations

import argparse
import json
import time

from talkies.dialects import ListenOptions, ListenTranslator
from talkies.protocol import (
    AudioBatch,
    EngineOpened,
    SessionLimits,
    StreamSession,
    TextReceived,
)

FRAME = bytes(640)  # 20 ms of 16 kHz PCM16


def _session() -> StreamSession:
    limits = SessionLimits(max_duration_seconds=86_400.0, idle_timeout_seconds=3600.0)
    session = StreamSession(limits, now=0.0)
    start = {"type": "start", "model": "m", "encoding": "pcm_s16le", "sample_rate": 16000}
    session.handle(TextReceived(data=json.dumps(start | {"channels": 1})), 0.0)
    session.handle(EngineOpened(), 0.0)
    session.pull_actions()
    return session


def native(reads: int, batch: AudioBatch) -> float:
    session = _session()
    started = time.process_time()
    for _ in range(reads):
        session.handle(batch, 1.0)
        session.pull_actions()
    return time.process_time() - started


def listen(reads: int, batch: AudioBatch) -> float:
    session = _session()
    translator = ListenTranslator(
        ListenOptions(model="m"), request_id="r", model_uuid="u", created="c"
    )
    translator.session('{"type":"ready","model":"m"}')
    started = time.process_time()
    for _ in range(reads):
        for item in translator.client([batch]):
            session.handle(item, 1.0)
        session.pull_actions()
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    batch = AudioBatch(frames=tuple(FRAME for _ in range(args.batch)))
    reads = args.frames // args.batch
    # Best of --repeat: the least disturbed run of each, interleaved.
    best_native = min(native(reads, batch) for _ in range(args.repeat))
    best_listen = min(listen(reads, batch) for _ in range(args.repeat))
    frames = reads * args.batch
    print(
        json.dumps(
            {
                "frames": frames,
                "frames_per_read": args.batch,
                "native_us_per_frame": round(best_native / frames * 1e6, 3),
                "listen_us_per_frame": round(best_listen / frames * 1e6, 3),
                "added_us_per_frame": round((best_listen - best_native) / frames * 1e6, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
