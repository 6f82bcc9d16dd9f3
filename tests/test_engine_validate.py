"""A model that kills its process is refused cleanly: it loads in a child, either its engine
process (TALKIES_ENGINE_ISOLATION=process) or the load check's (thread)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from talkies.config import Settings
from talkies.engines.pool import ModelPool
from talkies.engines.supply.registry import ModelEntry

from .conftest import run_server
from .fake_engine import speech
from .modelgen.sherpa import lstm_transducer
from .wire import START, drain, open_stream, ws_connect


def _sherpa_entry(slug: str, directory: Path, config: dict[str, str]) -> ModelEntry:
    return ModelEntry(
        slug=slug,
        executor="sherpa",
        path=directory,
        recognizer_factory="from_transducer",
        sherpa_config=config,
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelEntry]:
    good = tmp_path_factory.mktemp("good")
    config = lstm_transducer(good)
    broken = tmp_path_factory.mktemp("broken")
    lstm_transducer(broken)
    encoder = onnx.load(broken / "encoder.onnx")
    del encoder.metadata_props[:]  # sherpa-onnx exits its process on this (status 255)
    onnx.save(encoder, broken / "encoder.onnx")
    return {
        "good": _sherpa_entry("good", good, config),
        "broken": _sherpa_entry("broken", broken, config),
    }


REFUSALS = {
    "process": "'broken' failed to load: its engine process ",  # killed, or exit 255
    "thread": "'broken' failed its load check (exit status",
}


@pytest.mark.parametrize("isolation", sorted(REFUSALS))
def test_broken_model_is_a_4500_and_the_server_lives_on(
    models: dict[str, ModelEntry], isolation: str
) -> None:
    settings = Settings(model_max_concurrency=2, engine_isolation=isolation)
    pool = ModelPool(models, settings, validate=True)
    with run_server(provider=pool) as server:
        ws = ws_connect(server.url)
        ws.send(json.dumps({**START, "model": "broken"}))
        events, code, _ = drain(ws, timeout=60)
        assert code == 4500
        assert REFUSALS[isolation] in events[0]["detail"]
        assert pool.loaded() == [] and pool.pinned is None
        # Same process, still serving: a good model loads (after its own check) and decodes.
        good = open_stream(server.url, model="good")
        good.send(speech(0.1))
        good.send(json.dumps({"type": "end"}))
        assert drain(good, timeout=60)[1] == 1000
        server.wait_idle()
