"""Reference voices for cloning: the sample voices shipped with Talkies, and custom ones.

- Sample voices ``alloy``, ``echo`` and ``fable`` are short 24 kHz clips with transcripts in
  the ``voices/`` folder beside this module (made by ``tools/make_voices.py``).
- Custom voices are ``<data_dir>/custom-voices/<name>.wav``, with an optional ``<name>.txt``
  transcript: with it a model clones in context (reference codes + text), without it from the
  speaker embedding (x-vector) alone. Names may nest (``team/anna``) but always stay inside
  that folder: ``..``, absolute paths, NUL, backslashes, hidden files, over-long names and
  symlinks that lead out are refused. A custom voice shadows a sample voice of the same name.

Clips must be 16-bit PCM WAV (any rate, mono or stereo), at most 30 seconds long.
"""

from __future__ import annotations

import os
import re
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .base import SpeechError, SpeechErrorKind

__all__ = [
    "CUSTOM_VOICES_DIR",
    "MAX_REFERENCE_SECONDS",
    "MAX_VOICE_NAME",
    "SAMPLE_VOICES",
    "ReferenceVoice",
    "check_voice_name",
    "custom_voice",
    "list_custom_voices",
    "read_reference_audio",
    "reference_voice",
    "sample_voice",
]

SAMPLE_VOICES = ("alloy", "echo", "fable")
CUSTOM_VOICES_DIR = "custom-voices"
MAX_VOICE_NAME = 128
MAX_VOICE_DEPTH = 8
MAX_REFERENCE_SECONDS = 30.0
MAX_TRANSCRIPT_CHARS = 4096

_SAMPLES = Path(__file__).with_name("voices")
# One path segment: starts with a letter, digit or underscore (so never "." / ".." / hidden).
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


@dataclass(frozen=True, slots=True)
class ReferenceVoice:
    """A clip to clone, and its transcript (None: clone from the speaker embedding only)."""

    name: str
    audio: Path
    transcript: str | None


def _invalid(name: str, why: str) -> SpeechError:
    return SpeechError(
        SpeechErrorKind.INVALID_INPUT, f"invalid voice name {name[:64]!r}: {why}", param="voice"
    )


def _unknown(name: str) -> SpeechError:
    return SpeechError(
        SpeechErrorKind.UNKNOWN_VOICE, f"unknown voice {name[:128]!r}", param="voice"
    )


def check_voice_name(name: str) -> None:
    """Refuse a name that could not be a custom voice inside the custom-voices folder."""
    if not name:
        raise _invalid(name, "empty")
    if len(name) > MAX_VOICE_NAME:
        raise _invalid(name, f"longer than {MAX_VOICE_NAME} characters")
    if "\x00" in name:
        raise _invalid(name, "contains NUL")
    if name.startswith("/") or "\\" in name or ":" in name:
        raise _invalid(name, "must be a relative name such as 'team/anna'")
    segments = name.split("/")
    if len(segments) > MAX_VOICE_DEPTH:
        raise _invalid(name, f"nested deeper than {MAX_VOICE_DEPTH} folders")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise _invalid(name, "empty, '.' and '..' parts are not allowed")
        if _SEGMENT.fullmatch(segment) is None:
            raise _invalid(
                name, "each part is 1-64 of A-Z a-z 0-9 _ . - and starts with a letter or digit"
            )


def _read_transcript(path: Path) -> str | None:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError):
        raise SpeechError(
            SpeechErrorKind.INVALID_INPUT, "the voice's transcript is not readable UTF-8 text"
        ) from None
    return text[:MAX_TRANSCRIPT_CHARS] or None


def sample_voice(name: str) -> ReferenceVoice | None:
    """A sample voice shipped with Talkies, or None."""
    audio = _SAMPLES / f"{name}.wav"
    if name not in SAMPLE_VOICES or not audio.is_file():
        return None
    return ReferenceVoice(name, audio, _read_transcript(_SAMPLES / f"{name}.txt"))


def _inside(path: Path, root: Path) -> Path | None:
    """``path`` resolved (symlinks followed) if it is a regular file inside ``root``."""
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):  # missing, or a symlink loop
        return None
    if not resolved.is_relative_to(root) or not resolved.is_file():
        return None
    return resolved


def custom_voice(data_dir: Path, name: str) -> ReferenceVoice | None:
    """The custom voice ``name`` under ``data_dir``, None if there is none.

    Raises :class:`SpeechError` for a name that is not allowed, or whose files lead out of
    the custom-voices folder.
    """
    check_voice_name(name)
    root = (data_dir / CUSTOM_VOICES_DIR).resolve()
    candidate = root / f"{name}.wav"
    if not os.path.lexists(candidate):
        return None
    audio = _inside(candidate, root)
    if audio is None:
        raise _unknown(name)  # a symlink out, a folder, a dangling link: not a voice
    transcript_path = root / f"{name}.txt"
    transcript = None
    if os.path.lexists(transcript_path):
        resolved = _inside(transcript_path, root)
        if resolved is None:
            raise _unknown(name)
        transcript = _read_transcript(resolved)
    return ReferenceVoice(name, audio, transcript)


def list_custom_voices(data_dir: Path) -> list[str]:
    """Names of the usable custom voices under ``data_dir``, sorted."""
    root = (data_dir / CUSTOM_VOICES_DIR).resolve()
    if not root.is_dir():
        return []
    names: list[str] = []
    for folder, dirs, files in os.walk(root):  # does not descend into symlinked folders
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for file in files:
            if not file.endswith(".wav"):
                continue
            path = Path(folder, file)
            name = path.relative_to(root).with_suffix("").as_posix()
            try:
                check_voice_name(name)
            except SpeechError:
                continue
            if _inside(path, root) is not None:
                names.append(name)
    return sorted(names)


def reference_voice(data_dir: Path | None, name: str) -> ReferenceVoice:
    """A custom voice, else a sample voice; :class:`SpeechError` if neither exists."""
    check_voice_name(name)
    found = custom_voice(data_dir, name) if data_dir is not None else None
    found = found or sample_voice(name)
    if found is None:
        raise _unknown(name)
    return found


def read_reference_audio(voice: ReferenceVoice) -> tuple[npt.NDArray[np.float32], int]:
    """The clip as float32 mono samples in [-1, 1] and its sample rate."""

    def refuse(why: str) -> SpeechError:
        return SpeechError(
            SpeechErrorKind.INVALID_INPUT, f"voice {voice.name!r}: {why}", param="voice"
        )

    try:
        with wave.open(str(voice.audio), "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.getnframes()
            if width != 2 or channels not in (1, 2) or rate < 8000:
                raise refuse("the clip must be 16-bit PCM WAV, mono or stereo, at least 8 kHz")
            if frames > MAX_REFERENCE_SECONDS * rate:
                raise refuse(f"the clip is longer than {MAX_REFERENCE_SECONDS:g} seconds")
            data = wav.readframes(frames)
    except (OSError, EOFError, wave.Error):
        raise refuse("the clip is not a readable WAV file") from None
    samples = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
    if channels == 2:
        samples = samples.reshape(-1, 2).mean(axis=1)
    if samples.size < rate // 2:
        raise refuse("the clip is shorter than half a second")
    return samples, rate
