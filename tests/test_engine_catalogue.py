"""The catalogue of executors (talkies/engines/catalogue.py): one record per engine, found in
the engines' own folders, and a new engine is one folder and nothing else."""

from __future__ import annotations

import json
import shutil
import textwrap
import wave
from pathlib import Path

import httpx
import pytest

from talkies.engines import catalogue
from talkies.engines.supply.registry import ModelEntry, entry_problems

from .test_cli import serve
from .wire import START, drain, ws_connect

ROOT = Path(__file__).resolve().parent.parent


def test_the_builtin_executors_and_what_each_can_do() -> None:
    rows = {
        name: (e.kind, e.streams, e.transcribes_files, e.isolated)
        for name, e in catalogue.executors().items()
    }
    assert rows == {
        "sherpa": ("asr", True, True, True),
        "vosk": ("asr", True, True, True),
        "whisper": ("asr", True, True, True),
        "whisper_ct2": ("asr", True, True, True),
        "parakeet_cpp": ("asr", True, True, True),
        "kokoro": ("tts", False, False, True),
        "piper": ("tts", False, False, True),
        "qwen3_tts": ("tts", False, False, True),
        # the spec's offline executors: valid in a registry, no runtime here
        "parakeet": ("asr", False, False, False),
        "canary_multitask": ("asr", False, False, False),
        "canary_salm": ("asr", False, False, False),
        "sherpa_offline_ctc": ("asr", False, False, False),
        "wav2vec2_phoneme": ("asr", False, False, False),
    }


def test_each_folder_of_engines_is_a_concern_or_declares_executors() -> None:
    folders = {
        p.name for p in (ROOT / "talkies" / "engines").iterdir() if (p / "__init__.py").is_file()
    }
    engines = folders - catalogue.CONCERNS
    assert engines == {"kokoro", "parakeet", "piper", "qwen3", "sherpa", "vosk", "whisper"}


def test_an_unknown_executor_and_fields_it_does_not_take_are_registry_problems() -> None:
    found = entry_problems(ModelEntry(slug="m", executor="nope", path=Path("/")))
    assert any("executor 'nope' is not one of" in p for p in found), found
    found = entry_problems(
        ModelEntry(slug="m", executor="vosk", path=Path("/"), recognizer_factory="from_transducer")
    )
    assert found == ["model 'm': recognizer_factory and sherpa_config are for sherpa only"]
    found = entry_problems(ModelEntry(slug="m", executor="sherpa", path=Path("/")))
    assert found == [
        "model 'm': sherpa_config must be a non-empty object",
        "model 'm': recognizer_factory must be one of from_paraformer, from_transducer, "
        "from_wenet_ctc, from_zipformer2_ctc, got None",
    ]


def test_a_declaration_that_is_not_an_executor_is_refused() -> None:
    with pytest.raises(catalogue.CatalogueError, match="TTS executor loads speech"):
        catalogue.Executor(name="x", kind="tts", load_recognition=lambda e, r, d: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(catalogue.CatalogueError, match="need a loader"):
        catalogue.Executor(name="x", kind="asr", streams=True)


# An engine written as a newcomer would: one folder, nothing else touched. Its recognition
# reports how much audio it heard; it runs in an engine process like the native engines.
ECHO_ENGINE = '''
"""echo: a test engine that reports how many milliseconds of audio it heard."""

from __future__ import annotations

from pathlib import Path

from ...protocol import EngineFinal, EnginePartial
from ..base import Transcript, TranscriptionRequest, transcribe_recognition
from ..catalogue import Executor
from ..runtime import RecognitionModel
from ..supply.entry import ModelEntry


class EchoRecognition:
    def __init__(self) -> None:
        self.bytes = 0

    def accept(self, pcm):
        self.bytes += len(pcm)
        return [EnginePartial(text=f"heard {self.bytes // 32} ms")]

    def finish(self):
        return EngineFinal(text=f"heard {self.bytes // 32} ms")

    def close(self) -> None:
        pass


class EchoModel(RecognitionModel):
    slug = "echo"

    def recognition(self, options):
        return EchoRecognition()

    def transcribe(self, pcm: bytes, request: TranscriptionRequest) -> Transcript:
        return transcribe_recognition(EchoRecognition(), pcm, step=3200, language=None)


def load(entry: ModelEntry, root: Path, device: str) -> EchoModel:
    assert (root / "echo.txt").is_file()
    return EchoModel()


EXECUTORS = (
    Executor(
        name="echo",
        kind="asr",
        streams=True,
        transcribes_files=True,
        isolated=True,
        load_recognition=load,
    ),
)
'''


def test_a_new_executor_is_one_folder(tmp_path: Path) -> None:
    """A copy of the package plus one folder, ``talkies/engines/echo/``: the server serves
    the engine over a WebSocket stream and the file route, in an engine process, and lists
    it, with nothing else edited."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "talkies", src / "talkies", ignore=shutil.ignore_patterns("__pycache__"))
    (src / "talkies" / "engines" / "echo").mkdir()
    (src / "talkies" / "engines" / "echo" / "__init__.py").write_text(textwrap.dedent(ECHO_ENGINE))
    model = tmp_path / "echo-model"
    model.mkdir()
    (model / "echo.txt").write_text("files of the model\n")
    models = tmp_path / "models.json"
    models.write_text(json.dumps({"models": {"echo-1": {"executor": "echo", "path": str(model)}}}))
    env = {
        "TALKIES_MODELS_FILE": str(models),
        "TALKIES_DATA_DIR": str(tmp_path / "data"),
        "TALKIES_ENABLED_MODELS": "echo-1",
    }
    with serve(cwd=tmp_path, PYTHONPATH=str(src), **env) as (_proc, port):
        ws = ws_connect(f"ws://127.0.0.1:{port}/v1/audio/transcriptions/stream")
        ws.send(json.dumps({**START, "model": "echo-1"}))
        ready = json.loads(ws.recv(timeout=60))  # the model loads in its engine process
        assert ready["type"] == "ready", ready
        ws.send(bytes(16000))  # 0.5 s
        ws.send(json.dumps({"type": "end"}))
        events, code, _ = drain(ws, timeout=60)
        assert code == 1000, events
        finals = [e for e in events if e["type"] == "final"]
        assert finals and finals[0]["text"] == "heard 500 ms", events

        audio = tmp_path / "one-second.wav"
        with wave.open(str(audio), "wb") as out:
            out.setnchannels(1)
            out.setsampwidth(2)
            out.setframerate(16000)
            out.writeframes(bytes(32000))
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            listed = client.get("/v1/models").json()
            assert [m["id"] for m in listed["data"]] == ["echo-1"]
            answer = client.post(
                "/v1/audio/transcriptions",
                files={"file": ("one-second.wav", audio.read_bytes(), "audio/wav")},
                data={"model": "echo-1"},
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["text"] == "heard 1000 ms"
