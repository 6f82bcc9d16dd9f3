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
import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["ClientError", "Interrupted", "speak", "stream", "transcribe"]

FRAME_BYTES = 640  # 20 ms of 16 kHz PCM16 (spec: "Minimal Python file client")
STREAM_PATH = "/v1/audio/transcriptions/stream"


class ClientError(Exception):
    """What the user should read; the CLI prints it and exits 1."""


class Interrupted(ClientError):
    """Ctrl-C: the stream was canceled (the server told so); the CLI exits 130."""


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def _base_url(url: str) -> str:
    """``--url`` without its trailing slash; only http(s) URLs are a server's."""
    if not url.startswith(("http://", "https://")):
        raise ClientError(f"--url must start with http:// or https:// (got {url!r})")
    return url.rstrip("/")


def _ws_url(url: str) -> str:
    base = _base_url(url)
    if base.startswith("https://"):
        return "wss://" + base[len("https://") :] + STREAM_PATH
    return "ws://" + base[len("http://") :] + STREAM_PATH


def _ffmpeg_args(source: str) -> list[str]:
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise ClientError("ffmpeg is needed to read audio (apt-get install ffmpeg)")
    if source != "-" and not Path(source).is_file():
        raise ClientError(f"{source}: no such file")
    args = [ffmpeg, "-hide_banner", "-loglevel", "error"]
    if source == "-":
        # A live pipe: the format is told from its first 4 KiB, not 5 s of it (ffmpeg's
        # probe otherwise holds back the audio until then, or until the input ends), and
        # each decoded packet is written out at once.
        args += ["-probesize", "4096", "-analyzeduration", "0", "-i", "pipe:0"]
        args += ["-flush_packets", "1"]
    else:
        args += ["-nostdin", "-i", source]
    return [*args, "-f", "s16le", "-acodec", "pcm_s16le", "-ar", "16000", "-ac", "1", "pipe:1"]


def _unreadable(source: str, stderr: bytes) -> ClientError:
    reason = stderr.decode("utf-8", "replace").strip().splitlines()
    return ClientError(f"{source}: not audio ffmpeg can read ({reason[-1] if reason else ''})")


def decode_pcm(source: str) -> bytes:
    """Any audio ffmpeg can read (``-``: standard input) as 16 kHz mono s16le."""
    args = _ffmpeg_args(source)
    stdin = sys.stdin.buffer if source == "-" else subprocess.DEVNULL
    result = subprocess.run(args, stdin=stdin, capture_output=True, check=False)
    if result.returncode != 0:
        raise _unreadable(source, result.stderr)
    return result.stdout


class _Decoding:
    """Standard input decoded by ffmpeg as it arrives (a live pipe: a microphone), read a
    frame's worth at a time in a worker thread, so the stream starts before the input ends."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            _ffmpeg_args("-"),
            stdin=sys.stdin.buffer,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    async def chunks(self) -> AsyncIterator[bytes]:
        out = self._process.stdout
        assert out is not None
        while True:
            chunk = await asyncio.to_thread(out.read, FRAME_BYTES)
            if not chunk:
                break
            yield chunk
        err = self._process.stderr
        assert err is not None
        stderr = await asyncio.to_thread(err.read)
        if await asyncio.to_thread(self._process.wait) != 0:
            raise _unreadable("-", stderr)

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        for pipe in (self._process.stdout, self._process.stderr):
            if pipe is not None:
                pipe.close()


async def _frames_of(pcm: bytes) -> AsyncIterator[bytes]:
    for offset in range(0, len(pcm), FRAME_BYTES):
        yield pcm[offset : offset + FRAME_BYTES]


# -- stream --------------------------------------------------------------------------------------


class _Display:
    """Committed lines printed as they come; on a terminal, the partial and a progress bar
    rewritten in place (tqdm) below them."""

    def __init__(self, out: IO[str], total_seconds: float | None, *, live: bool) -> None:
        self._out = out
        self._bar: Any = None
        if live:
            from tqdm import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(
                total=round(total_seconds, 2) if total_seconds is not None else None,
                unit="s",
                bar_format=(
                    "{l_bar}{bar}| {n:.1f}/{total:.1f} s"
                    if total_seconds is not None
                    else "{desc} {n:.1f} s"
                ),
                file=out,
                leave=False,
                # A terminal that reports no size (a bare pty) gets 80x24, not 0x0 (tqdm
                # hides a bar that is below the last row).
                ncols=shutil.get_terminal_size().columns,
                nrows=shutil.get_terminal_size().lines,
            )

    def progress(self, seconds: float) -> None:
        if self._bar is not None:
            total = self._bar.total
            self._bar.n = round(min(seconds, total) if total is not None else seconds, 2)
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
    audio: AsyncIterator[bytes],
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
        failure: ClientError | None = None

        async def send_audio() -> None:
            nonlocal failure
            began = time.monotonic()
            sent = 0
            index = 0
            try:
                async for frame in audio:
                    await ws.send(frame)
                    sent += len(frame)
                    index += 1
                    progress(sent / 32000)
                    if not fast:  # paced against the clock, so pauses do not add up
                        await asyncio.sleep(max(0.0, began + index * 0.02 - time.monotonic()))
            except ClientError as exc:  # the input could not be read: the stream is canceled
                failure = exc
                await ws.send(json.dumps({"type": "cancel"}))
                return
            await ws.send(json.dumps({"type": "end"}))

        sender = None
        interrupted = False
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
        except asyncio.CancelledError:
            # Ctrl-C (asyncio.run cancels this task): the stream is canceled, as the spec's
            # cancel does, and the server's stats read, rather than the connection dropped.
            interrupted = True
        if sender is not None:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        if interrupted:
            with contextlib.suppress(ConnectionClosed, TimeoutError):
                await ws.send(json.dumps({"type": "cancel"}))
                async with asyncio.timeout(5):
                    async for message in ws:
                        emit(json.loads(message))
        code = ws.close_code
        reason = ws.close_reason
    if failure is not None:
        raise failure
    if interrupted:
        raise Interrupted("canceled")
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
    base = _base_url(url)
    decoding: _Decoding | None = None
    if source == "-":
        decoding = _Decoding()  # a ClientError at once without ffmpeg
        audio, total = decoding.chunks(), None
    else:
        pcm = decode_pcm(source)
        audio, total = _frames_of(pcm), len(pcm) / 32000
    display = _Display(out, total, live=not as_json and out.isatty())
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
                base,
                audio,
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
    except Interrupted:
        raise
    except ClientError as exc:
        raise ClientError(errors[-1] if errors else str(exc)) from None
    except KeyboardInterrupt:
        raise Interrupted("canceled") from None
    finally:
        display.close()
        if decoding is not None:
            decoding.close()


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

    base = _base_url(url)
    path = Path(source)
    if not path.is_file():
        raise ClientError(f"{source}: no such file")
    data = {"model": model, "response_format": response_format}
    if language:
        data["language"] = language
    try:
        with path.open("rb") as audio:
            response = httpx.post(
                base + "/v1/audio/transcriptions",
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

    base = _base_url(url)
    body = {"model": model, "input": text, "voice": voice, "response_format": response_format}
    handle: IO[bytes] | None = None
    if output is not None and output != "-":
        try:  # before the synthesis: a path that cannot be written is said at once
            handle = open(output, "wb")  # noqa: SIM115 (closed below, whatever happens)
        except OSError as exc:
            raise ClientError(f"cannot write {output}: {exc.strerror or exc}") from None
    try:
        with httpx.stream(
            "POST",
            base + "/v1/audio/speech",
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
            if handle is not None:
                for chunk in response.iter_bytes():
                    handle.write(chunk)
                return f"wrote {output}"
            rate = response.headers.get("x-sample-rate", "24000")
            return _play(response.iter_bytes(), response_format, rate)
    except httpx.HTTPError as exc:
        raise ClientError(f"cannot reach {url}: {exc}") from None
    finally:
        if handle is not None:
            handle.close()


def _play(chunks: Any, response_format: str, rate: str) -> str:
    player = shutil.which("ffplay")
    if player is None:
        raise ClientError("no audio player (ffplay) found: write to a file with -o FILE")
    args = [player, "-nodisp", "-autoexit", "-loglevel", "error"]
    if response_format == "pcm":
        args += ["-f", "s16le", "-ar", rate, "-ch_layout", "mono"]
    process = subprocess.Popen(
        [*args, "-i", "pipe:0"], stdin=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdin is not None and process.stderr is not None
    gone = False
    try:
        for chunk in chunks:
            process.stdin.write(chunk)
    except BrokenPipeError:
        gone = True  # the player quit before the audio ended
    finally:
        with contextlib.suppress(BrokenPipeError):
            process.stdin.close()
        said = process.stderr.read().decode("utf-8", "replace").strip()
        process.stderr.close()
        process.wait()
    # ffplay exits 0 even when it could not open an audio device ("audio open failed"):
    # what it says at -loglevel error, or its leaving early, is the failure.
    if gone or said or process.returncode != 0:
        reason = said.splitlines()[-1] if said else f"ffplay exited {process.returncode}"
        raise ClientError(f"could not play the audio ({reason}): write it to a file with -o FILE")
    return "played"
