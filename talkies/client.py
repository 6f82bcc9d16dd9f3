"""The command-line client: ``talkies stream``, ``talkies transcribe``, ``talkies speak``.

Each talks to a running server (``--url``, default ``http://127.0.0.1:8000``) with the token
from ``TALKIES_AUTH_TOKEN`` when it is set, and exits non-zero with the server's own error
detail when the server refuses (a close code other than 1000, an HTTP error).

``stream`` decodes any audio with ffmpeg (a file, or ``-`` for standard input), sends it as
20 ms frames paced in real time (``--fast``: as fast as the server takes them), and shows the
live partial in place on a terminal with a progress bar, printing each committed line (an
endpoint, then the final) above it; ``--json`` prints the raw events instead, one per line.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["ClientError", "speak", "stream", "transcribe"]

FRAME_BYTES = 640  # 20 ms of 16 kHz PCM16 (spec: "Minimal Python file client")
STREAM_PATH = "/v1/audio/transcriptions/stream"


class ClientError(Exception):
    """What the user should read; the CLI prints it and exits 1."""


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _ws_url(url: str) -> str:
    base = url.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base[len("https://") :] + STREAM_PATH
    if base.startswith("http://"):
        return "ws://" + base[len("http://") :] + STREAM_PATH
    return base + STREAM_PATH


def decode_pcm(source: str) -> bytes:
    """Any audio ffmpeg can read (``-``: standard input) as 16 kHz mono s16le."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise ClientError("ffmpeg is needed to read audio (apt-get install ffmpeg)")
    if source != "-" and not Path(source).is_file():
        raise ClientError(f"{source}: no such file")
    args = [ffmpeg, "-hide_banner", "-loglevel", "error"]
    args += ["-i", "pipe:0"] if source == "-" else ["-nostdin", "-i", source]
    args += ["-f", "s16le", "-acodec", "pcm_s16le", "-ar", "16000", "-ac", "1", "pipe:1"]
    stdin = sys.stdin.buffer if source == "-" else subprocess.DEVNULL
    result = subprocess.run(args, stdin=stdin, capture_output=True, check=False)
    if result.returncode != 0:
        reason = result.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ClientError(f"{source}: not audio ffmpeg can read ({reason[-1] if reason else ''})")
    return result.stdout


# -- stream --------------------------------------------------------------------------------------


class _Display:
    """Committed lines printed as they come; on a terminal, the partial and a progress bar
    rewritten in place (tqdm) below them."""

    def __init__(self, out: IO[str], total_seconds: float, *, live: bool) -> None:
        self._out = out
        self._bar: Any = None
        if live:
            from tqdm import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(
                total=round(total_seconds, 2),
                unit="s",
                bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s",
                file=out,
                leave=False,
                # A terminal that reports no size (a bare pty) gets 80x24, not 0x0 (tqdm
                # hides a bar that is below the last row).
                ncols=shutil.get_terminal_size().columns,
                nrows=shutil.get_terminal_size().lines,
            )

    def progress(self, seconds: float) -> None:
        if self._bar is not None:
            self._bar.n = round(min(seconds, self._bar.total), 2)
            self._bar.refresh()

    def partial(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_description_str(text[-80:] if text else "", refresh=True)

    def commit(self, text: str) -> None:
        if not text:
            return
        if self._bar is not None:
            self._bar.set_description_str("", refresh=False)
            self._bar.write(text, file=self._out)
        else:
            self._out.write(text + "\n")
            self._out.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


async def _stream(
    url: str,
    pcm: bytes,
    *,
    model: str,
    language: str | None,
    token: str | None,
    fast: bool,
    emit: Callable[[dict[str, Any]], None],
    progress: Callable[[float], None],
) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    start: dict[str, Any] = {
        "type": "start",
        "model": model,
        "encoding": "pcm_s16le",
        "sample_rate": 16000,
        "channels": 1,
    }
    if language:
        start["language"] = language
    closed: ConnectionClosed | None = None
    async with connect(_ws_url(url), additional_headers=_headers(token), max_size=None) as ws:

        async def send_audio() -> None:
            began = time.monotonic()
            for index, offset in enumerate(range(0, len(pcm), FRAME_BYTES)):
                await ws.send(pcm[offset : offset + FRAME_BYTES])
                progress((offset + FRAME_BYTES) / 32000)
                if not fast:  # paced against the clock, so pauses do not add up
                    await asyncio.sleep(max(0.0, began + (index + 1) * 0.02 - time.monotonic()))
            await ws.send(json.dumps({"type": "end"}))

        sender = None
        try:
            # A refusal (4401 for a missing token, 4404, 4429, ...) may close the stream
            # before anything is sent: that is an answer, not a crash.
            await ws.send(json.dumps(start))
            ready = json.loads(await ws.recv())
            emit(ready)
            if ready.get("type") == "ready":
                sender = asyncio.create_task(send_audio())
            async for message in ws:
                emit(json.loads(message))
        except ConnectionClosed as exc:
            closed = exc
        if sender is not None:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        code = ws.close_code
        reason = ws.close_reason
    if code != 1000:
        raise ClientError(f"{code}: {reason or closed}")


def stream(
    source: str,
    *,
    url: str,
    model: str,
    language: str | None,
    token: str | None,
    fast: bool,
    as_json: bool,
    out: IO[str],
) -> None:
    pcm = decode_pcm(source)
    display = _Display(out, len(pcm) / 32000, live=not as_json and out.isatty())
    errors: list[str] = []

    def emit(event: dict[str, Any]) -> None:
        if as_json:
            out.write(json.dumps(event, ensure_ascii=False) + "\n")
            out.flush()
            return
        kind = event.get("type")
        if kind == "partial":
            display.partial(event.get("text", ""))
        elif kind in ("endpoint", "final"):
            display.commit(event.get("text", ""))
        elif kind == "error":
            errors.append(f"{event.get('code')}: {event.get('detail')}")

    try:
        asyncio.run(
            _stream(
                url,
                pcm,
                model=model,
                language=language,
                token=token,
                fast=fast,
                emit=emit,
                progress=display.progress,
            )
        )
    except OSError as exc:
        raise ClientError(f"cannot reach {url}: {exc}") from None
    except ClientError as exc:
        raise ClientError(errors[-1] if errors else str(exc)) from None
    finally:
        display.close()


# -- HTTP routes -----------------------------------------------------------------------------


def _http_error(response: Any) -> ClientError:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:300]
    return ClientError(f"{response.status_code}: {message}")


def transcribe(
    source: str,
    *,
    url: str,
    model: str,
    language: str | None,
    response_format: str,
    token: str | None,
    out: IO[str],
) -> None:
    import httpx

    path = Path(source)
    if not path.is_file():
        raise ClientError(f"{source}: no such file")
    data = {"model": model, "response_format": response_format}
    if language:
        data["language"] = language
    try:
        with path.open("rb") as audio:
            response = httpx.post(
                url.rstrip("/") + "/v1/audio/transcriptions",
                data=data,
                files={"file": (path.name, audio)},
                headers=_headers(token),
                timeout=None,
            )
    except httpx.HTTPError as exc:
        raise ClientError(f"cannot reach {url}: {exc}") from None
    if response.status_code != 200:
        raise _http_error(response)
    out.write(response.text if response.text.endswith("\n") else response.text + "\n")


def speak(
    text: str,
    *,
    url: str,
    model: str,
    voice: str,
    response_format: str,
    output: str | None,
    token: str | None,
) -> str:
    """Synthesize ``text``; write it to ``output`` (``-``: standard output) or play it.
    Returns what happened, for the CLI to print."""
    import httpx

    body = {"model": model, "input": text, "voice": voice, "response_format": response_format}
    try:
        with httpx.stream(
            "POST",
            url.rstrip("/") + "/v1/audio/speech",
            json=body,
            headers=_headers(token),
            timeout=None,
        ) as response:
            if response.status_code != 200:
                response.read()
                raise _http_error(response)
            if output == "-":
                for chunk in response.iter_bytes():
                    sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
                return ""
            if output is not None:
                with open(output, "wb") as handle:
                    for chunk in response.iter_bytes():
                        handle.write(chunk)
                return f"wrote {output}"
            rate = response.headers.get("x-sample-rate", "24000")
            return _play(response.iter_bytes(), response_format, rate)
    except httpx.HTTPError as exc:
        raise ClientError(f"cannot reach {url}: {exc}") from None


def _play(chunks: Any, response_format: str, rate: str) -> str:
    player = shutil.which("ffplay")
    if player is None:
        raise ClientError("no audio player (ffplay) found: write to a file with -o FILE")
    args = [player, "-nodisp", "-autoexit", "-loglevel", "error"]
    if response_format == "pcm":
        args += ["-f", "s16le", "-ar", rate, "-ch_layout", "mono"]
    process = subprocess.Popen([*args, "-i", "pipe:0"], stdin=subprocess.PIPE)
    assert process.stdin is not None
    try:
        for chunk in chunks:
            process.stdin.write(chunk)
    finally:
        process.stdin.close()
        process.wait()
    return "played"
