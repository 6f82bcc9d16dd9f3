"""``describe`` -> ``info``: the registry as Wyoming programs, from the registry alone
(nothing is loaded to answer; Home Assistant waits 1 s for it)."""

from __future__ import annotations

from typing import Any, cast

from .. import __version__
from ..config import Settings
from ..engines import catalogue
from ..engines.pool import ModelPool
from ..engines.supply.builtin import DEFAULT_MODEL, DEFAULT_SPEECH_MODEL
from ..engines.supply.download import is_downloaded
from ..engines.supply.entry import ModelEntry
from ..engines.supply.wheels import wheels_installed
from ..engines.tts.base import SpeechModel
from ..transcripts import LANGUAGE_NAMES

__all__ = ["PROJECT_URL", "program_info"]

PROJECT_URL = "https://github.com/talkies-speech/talkies"

# The languages of the speech models' executors (a voice's own list needs it loaded).
_TTS_LANGUAGES = {"piper": ["en"], "kokoro": ["en", "ja", "zh", "es", "fr", "hi", "it", "pt"]}
_ATTRIBUTION = {
    "whisper": ("OpenAI Whisper", "https://github.com/openai/whisper"),
    "whisper_ct2": ("OpenAI Whisper", "https://github.com/openai/whisper"),
    "sherpa": ("k2-fsa sherpa-onnx", "https://github.com/k2-fsa/sherpa-onnx"),
    "vosk": ("Alpha Cephei Vosk", "https://alphacephei.com/vosk/"),
    "parakeet_cpp": ("NVIDIA Parakeet", "https://huggingface.co/nvidia"),
    "piper": ("Piper", "https://github.com/OHF-voice/piper1-gpl"),
    "kokoro": ("Kokoro-82M", "https://huggingface.co/hexgrad/Kokoro-82M"),
    "qwen3_tts": ("Qwen3-TTS", "https://github.com/QwenLM/Qwen3-TTS"),
}


def _attribution(executor: str) -> dict[str, str]:
    name, url = _ATTRIBUTION.get(executor, (executor, PROJECT_URL))
    return {"name": name, "url": url}


def _asr_languages(entry: ModelEntry) -> list[str]:
    if entry.executor in ("whisper", "whisper_ct2"):  # multilingual weights
        first = entry.options.get("language")
        rest = [code for code in LANGUAGE_NAMES if code != first]
        return [first, *rest] if isinstance(first, str) else rest
    language = entry.options.get("language")
    if isinstance(language, str):
        return [language]
    return ["en"] if "-en" in entry.slug or entry.slug.endswith("en") else []


def program_info(settings: Settings, pool: ModelPool) -> dict[str, Any]:
    """The ``info`` event's data (blocking: it looks at files; call from a worker thread)."""
    asr: list[dict[str, Any]] = []
    tts: list[dict[str, Any]] = []
    for slug in pool.slugs():
        entry = pool.entry(slug)
        if entry is None:
            continue
        executor = catalogue.find(entry.executor)
        if executor is None:
            continue
        loaded = pool.peek(slug)
        installed = (
            loaded is not None
            or (entry.path is not None and entry.path.is_dir())
            or is_downloaded(entry, settings.data_dir)
            or wheels_installed(entry.wheels)
        )
        common = {
            "name": slug,
            "attribution": _attribution(entry.executor),
            "installed": bool(installed),
            "description": entry.description or slug,
            "version": entry.revision or None,
        }
        if executor.kind == "asr" and executor.streams:
            asr.append({**common, "languages": _asr_languages(entry)})
        elif executor.kind == "tts" and executor.load_speech is not None:
            voice: dict[str, Any] = {
                **common,
                "languages": _TTS_LANGUAGES.get(entry.executor, []),
            }
            if loaded is not None:
                names = cast(SpeechModel, loaded).voices()
                voice["speakers"] = [{"name": name} for name in names]
            tts.append(voice)
    # The defaults first: a client that picks the first model gets the offline ones.
    asr.sort(key=lambda m: m["name"] != DEFAULT_MODEL)
    tts.sort(key=lambda v: v["name"] != DEFAULT_SPEECH_MODEL)
    talkies = {"name": "Talkies", "url": PROJECT_URL}
    return {
        "asr": [
            {
                "name": "talkies",
                "attribution": talkies,
                "installed": True,
                "description": "Talkies streaming speech recognition",
                "version": __version__,
                "models": asr,
                "supports_transcript_streaming": True,
            }
        ],
        "tts": [
            {
                "name": "talkies",
                "attribution": talkies,
                "installed": True,
                "description": "Talkies speech synthesis",
                "version": __version__,
                "voices": tts,
                "supports_synthesize_streaming": True,
            }
        ],
        "handle": [],
        "intent": [],
        "wake": [],
        "mic": [],
        "snd": [],
    }
