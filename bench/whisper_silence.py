"""CPU of a live whisper-base-en stream over silence vs over speech (issue 24 goal: <= 5%).

    PYTHONPATH=. .venv/bin/python bench/whisper_silence.py

One call per 20 ms frame (as the runtime feeds a decoder that keeps up), process CPU time;
threads 2; the passage of bench/whisper_live.py (34.7 s, 5 sentences with 1.5 s pauses)
against the same length of digital silence and of low noise."""

import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from whisper_live import passage

from talkies.engines.supply.builtin import builtin_models
from talkies.engines.whisper import load_ct2
from talkies.protocol.messages import StartOptions
from tests.modelgen_whisper import base_folder

root = Path(tempfile.mkdtemp())
folder = base_folder(root)
entry = builtin_models(root)["whisper-base-en"]
entry = replace(entry, path=folder, options={**entry.options, "threads": 2})
model = load_ct2(entry, folder, "cpu")
speech, _ = passage(1.5, 1.0, 3.0)
silence = bytes(len(speech))
rng = np.random.default_rng(0)
noise = (rng.normal(0, 30, len(speech) // 2)).astype("<i2").tobytes()  # ~-60 dBFS hiss


def run(pcm: bytes) -> tuple[float, int]:
    rec = model.recognition(StartOptions(model="whisper-base-en", language="en"))
    before = model.decodes
    t = time.process_time()
    for i in range(0, len(pcm), 640):
        rec.accept(pcm[i : i + 640])
    rec.finish()
    cpu = time.process_time() - t
    rec.close()
    return cpu, model.decodes - before


for name, pcm in (("speech", speech), ("silence", silence), ("noise", noise), ("speech", speech)):
    cpu, decodes = run(pcm)
    seconds = len(pcm) / 32000
    per = cpu / seconds
    print(f"{name:8s} {seconds:.1f} s: {cpu:.2f} CPU s ({per:.4f} per audio s), {decodes} decodes")
