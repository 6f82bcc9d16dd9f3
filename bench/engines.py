"""The engine benchmarks in one run: sherpa batching and server overhead, vosk RTF, whisper
partial refresh. Each part is its own script (run them alone for their options):

    python bench/engines.py            # all three, one after the other (~4 min)
    python bench/engine_sherpa.py      # streams per core batched vs per stream; server vs bare
    python bench/engine_vosk.py        # RTF in-process vs through the server
    python bench/engine_whisper.py     # partial refresh period, decode time, RTF
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("engine_sherpa.py", "engine_vosk.py", "engine_whisper.py")


def main() -> int:
    failed = 0
    for part in PARTS:
        print(f"\n===== {part}", flush=True)
        failed += subprocess.run([sys.executable, str(HERE / part)], check=False).returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
