"""Check a model in a child process before the server loads it.

Native engines can end the whole process on a malformed model (sherpa-onnx exits with status
255 when metadata is missing): no exception, no cleanup. So the first load of each model runs
``python -m talkies.engines.supply.validate`` on it: load, open one stream, decode half a second of
silence, flush. Only a model that survives that is loaded into the server; one that does not
becomes a clean 4500 for the client and an error in the log.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio

from ..base import EngineUnavailable
from ..catalogue import load_recognition as load_model
from .registry import ModelEntry, entry_from_json

__all__ = ["entry_json", "load_model", "validate_in_child"]

_CHECK_AUDIO = bytes(16000)  # 0.5 s of silence


def entry_json(entry: ModelEntry, root: Path) -> dict[str, Any]:
    """The entry as a models.json ``path`` entry for the folder its files are in, whatever
    their source (hub snapshot, wheels, local path): all the child needs to load it."""
    raw: dict[str, Any] = {
        "executor": entry.executor,
        "path": str(root),
        "recognizer_factory": entry.recognizer_factory,
        "sherpa_config": dict(entry.sherpa_config) or None,
        "max_concurrency": entry.max_concurrency,
        "decode_timeout": entry.decode_timeout,
        "max_lag": entry.max_lag,
        "options": dict(entry.options) or None,
        "description": entry.description,
    }
    return {k: v for k, v in raw.items() if v is not None}


def validate_in_child(
    entry: ModelEntry, root: Path, device: str, *, timeout: float = 300.0
) -> None:
    """Raise :class:`EngineUnavailable` unless the model loads and decodes in a child.

    Blocking: the pool calls it from the thread that loads the model.
    """
    payload = json.dumps(
        {"slug": entry.slug, "entry": entry_json(entry, root), "root": str(root), "device": device}
    ).encode()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "talkies.engines.supply.validate"],
            input=payload,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise EngineUnavailable(f"model {entry.slug!r} did not load within {timeout:g} s") from None
    if result.returncode != 0:
        lines = result.stderr.decode("utf-8", "replace").strip().splitlines()
        last = lines[-1][:300] if lines else "no output"
        raise EngineUnavailable(
            f"model {entry.slug!r} failed its load check (exit status {result.returncode}): {last}"
        )


async def _check(entry: ModelEntry, root: Path, device: str) -> None:
    from ...protocol.messages import StartOptions

    model = await anyio.to_thread.run_sync(load_model, entry, root, device)
    stream = await model.open_stream(
        StartOptions(model=entry.slug, word_timestamps=True), max_buffered_bytes=64000
    )
    await stream.feed(_CHECK_AUDIO)
    await stream.flush()
    async for _event in stream.events():
        pass
    await stream.aclose()
    await anyio.to_thread.run_sync(model.close)


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    root = Path(request["root"])
    entry, problems = entry_from_json(request["slug"], request["entry"], root)
    if entry is None or problems:
        sys.stderr.write(f"invalid entry: {problems}\n")
        return 2
    try:
        anyio.run(_check, entry, root, request["device"])
    except Exception as exc:
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
