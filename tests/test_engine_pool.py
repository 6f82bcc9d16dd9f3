"""The model pool: slots, pinning, eviction, single-flight loading, downloads, TTL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from talkies.config import Settings
from talkies.engines.base import EngineUnavailable, LoadedModel, Recognition, Refusal
from talkies.engines.pool import ModelConflict, ModelPool, build_registry
from talkies.engines.runtime import RecognitionModel
from talkies.engines.supply.registry import (
    ModelEntry,
    RegistryError,
    entry_from_json,
    load_models_file,
)
from talkies.protocol import ErrorCode
from talkies.protocol.messages import StartOptions

from .conftest import run_server
from .fake_engine import Behaviour, EnergyRecognition, Stats, speech
from .wire import START, drain, open_stream, ws_connect

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeModel(RecognitionModel):
    def __init__(self, log: list[str], slug: str) -> None:
        self.log = log
        self.slug = slug
        self.stats = Stats()

    def recognition(self, options: StartOptions) -> Recognition:
        return EnergyRecognition(Behaviour(), self.stats)

    def close(self) -> None:
        self.log.append(f"close {self.slug}")


class Loads:
    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.log: list[str] = []
        self.delay = delay
        self.fail = fail

    def __call__(self, entry: ModelEntry, root: Path, device: str) -> LoadedModel:
        import time

        self.log.append(f"load {entry.slug}")
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("weights are corrupt")
        return FakeModel(self.log, entry.slug)


def _entries(tmp_path: Path, **limits: int) -> dict[str, ModelEntry]:
    out = {}
    for slug in ("a", "b"):
        (tmp_path / slug).mkdir(exist_ok=True)
        out[slug] = ModelEntry(
            slug=slug, executor="vosk", path=tmp_path / slug, max_concurrency=limits.get(slug)
        )
    out["offline"] = ModelEntry(slug="offline", executor="parakeet", path=tmp_path / "a")
    out["nemo"] = ModelEntry(slug="nemo", executor="parakeet_cpp", path=tmp_path / "a")
    return out


def _pool(tmp_path: Path, loads: Loads, **kw: Any) -> ModelPool:
    settings = Settings(data_dir=tmp_path / "data", model_max_concurrency=2, **kw)
    return ModelPool(_entries(tmp_path), settings, loader=loads, validate=False)


def _opts(slug: str) -> StartOptions:
    return StartOptions(model=slug)


async def test_refusals(tmp_path: Path) -> None:
    pool = _pool(tmp_path, Loads())
    with pytest.raises(Refusal) as unknown:
        await pool.open_stream(_opts("nope"))
    assert unknown.value.code is ErrorCode.UNKNOWN_MODEL
    with pytest.raises(Refusal) as offline:
        await pool.open_stream(_opts("offline"))
    assert offline.value.code is ErrorCode.STREAMING_NOT_SUPPORTED
    with pytest.raises(EngineUnavailable, match=r"parakeet\.cpp runtime"):
        await pool.open_stream(_opts("nemo"))
    assert pool.pinned is None and pool.in_use("nemo") == 0


async def test_pinning_eviction_and_slots(tmp_path: Path) -> None:
    loads = Loads()
    pool = _pool(tmp_path, loads)
    a1 = await pool.open_stream(_opts("a"))
    assert pool.pinned == "a"
    with pytest.raises(Refusal) as busy:
        await pool.open_stream(_opts("b"))
    assert busy.value.code is ErrorCode.MODEL_BUSY
    a2 = await pool.open_stream(_opts("a"))
    with pytest.raises(Refusal) as full:
        await pool.open_stream(_opts("a"))
    assert full.value.code is ErrorCode.CONNECTION_LIMIT
    with pytest.raises(ModelConflict):
        await pool.unload("a")
    with pytest.raises(ModelConflict):
        await pool.acquire("b")  # an HTTP request for another model while pinned: 409
    await a1.aclose()
    await a1.aclose()  # idempotent: the slot is released once
    assert pool.in_use("a") == 1 and pool.pinned == "a"
    await a2.aclose()
    assert pool.in_use("a") == 0 and pool.pinned is None
    b = await pool.open_stream(_opts("b"))  # the first stream of b evicts a, once b loaded
    assert loads.log == ["load a", "load b", "close a"]
    assert pool.loaded() == ["b"]
    await b.aclose()


async def test_a_model_that_fails_to_load_evicts_nothing(tmp_path: Path) -> None:
    """Issue 21 (11): the spec's client naming a model that cannot run here (parakeet.cpp
    without its runtime, a loader that fails) must not unload the models that work."""
    loads = Loads()
    pool = _pool(tmp_path, loads)
    a = await pool.open_stream(_opts("a"))
    await a.aclose()
    with pytest.raises(EngineUnavailable, match=r"parakeet\.cpp runtime"):
        await pool.open_stream(_opts("nemo"))
    assert pool.loaded() == ["a"] and pool.pinned is None
    loads.fail = True
    with pytest.raises(EngineUnavailable, match="weights are corrupt"):
        await pool.open_stream(_opts("b"))
    assert pool.loaded() == ["a"] and pool.pinned is None
    assert loads.log == ["load a", "load b"]
    loads.fail = False
    b = await pool.open_stream(_opts("b"))  # b loads (its failure was not kept), then a goes
    assert loads.log == ["load a", "load b", "load b", "close a"]
    assert pool.loaded() == ["b"]
    await b.aclose()


async def test_http_requests_share_slots(tmp_path: Path) -> None:
    pool = _pool(tmp_path, Loads())
    _, release1 = await pool.acquire("a")
    _, release2 = await pool.acquire("a")
    with pytest.raises(Refusal):
        await pool.open_stream(_opts("a"))
    release1()
    release1()
    stream = await pool.open_stream(_opts("a"))
    release2()
    await stream.aclose()
    assert pool.in_use("a") == 0


async def test_loading_is_single_flight_and_survives_a_cancelled_client(tmp_path: Path) -> None:
    loads = Loads(delay=0.3)
    pool = _pool(tmp_path, loads)
    streams = []

    async def open_one() -> None:
        streams.append(await pool.open_stream(_opts("a")))

    with anyio.move_on_after(0.05):
        await pool.open_stream(_opts("a"))  # this client gives up while the model loads
    assert pool.in_use("a") == 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(open_one)
        tg.start_soon(open_one)
    assert loads.log == ["load a"]  # loaded once, and kept although the first client left
    for s in streams:
        await s.aclose()


async def test_failed_load_releases_the_slot_and_is_retried(tmp_path: Path) -> None:
    loads = Loads(fail=True)
    pool = _pool(tmp_path, loads)
    with pytest.raises(EngineUnavailable, match="'a' could not be loaded: weights are corrupt"):
        await pool.open_stream(_opts("a"))
    assert pool.in_use("a") == 0 and pool.pinned is None
    loads.fail = False
    stream = await pool.open_stream(_opts("a"))
    await stream.aclose()
    assert loads.log == ["load a", "load a"]


async def test_ttl_sweep_skips_pinned_models(tmp_path: Path) -> None:
    loads = Loads()
    pool = _pool(tmp_path, loads, model_ttl=0.05)
    stream = await pool.open_stream(_opts("a"))
    await anyio.sleep(0.1)
    assert await pool.sweep() == []  # pinned
    await stream.aclose()
    await anyio.sleep(0.1)
    assert await pool.sweep() == ["a"]
    assert pool.loaded() == []


async def test_repo_entries_use_the_local_snapshot(tmp_path: Path) -> None:
    entry = ModelEntry(slug="hub", executor="vosk", repo="org/model", revision="c" * 40)
    settings = Settings(data_dir=tmp_path)
    loads = Loads()
    pool = ModelPool({"hub": entry}, settings, loader=loads, validate=False, local_files_only=True)
    with pytest.raises(EngineUnavailable) as failed:
        await pool.open_stream(_opts("hub"))
    message = str(failed.value)
    assert "model 'hub' could not be downloaded from org/model@cccccccccccc" in message
    assert "talkies models pull hub" in message and "'path' entry" in message
    assert list((tmp_path / "models").iterdir()) == []  # the failed attempt left nothing
    snapshot = tmp_path / "models" / "hub"
    snapshot.mkdir()
    (snapshot / "tokens.txt").write_text("x")
    stream = await pool.open_stream(_opts("hub"))  # huggingface_hub accepts the local copy
    await stream.aclose()
    assert (snapshot / ".talkies-revision").read_text().strip() == "c" * 40
    assert pool.status()[0]["downloaded"] is True


def test_registry_validation_names_slug_and_field(tmp_path: Path) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"executor": "sherpa", "path": "."}, "sherpa_config must be a non-empty object"),
        ({"executor": "sherpa", "path": ".", "sherpa_config": {"x": 1}}, "recognizer_factory"),
        ({"executor": "nope", "path": "."}, "executor 'nope' is not one of"),
        ({"executor": "vosk"}, "give exactly one of repo + revision, url + sha256, or path"),
        ({"executor": "vosk", "repo": "a/b", "revision": "main"}, "40-hex"),
        ({"executor": "vosk", "path": ".", "max_concurrency": 0}, "max_concurrency"),
        ({"executor": "vosk", "path": ".", "decode_timeout": 0.5}, "decode_timeout must be"),
        ({"executor": "vosk", "path": ".", "decode_timeout": 4000}, "decode_timeout must be"),
        ({"executor": "vosk", "path": ".", "decode_timeout": "9s"}, "'decode_timeout' has the"),
        ({"executor": "vosk", "path": ".", "decode_timeout": True}, "'decode_timeout' has the"),
        ({"executor": "vosk", "path": ".", "colour": "red"}, "unknown field 'colour'"),
        ({"executor": "vosk", "path": 5}, "field 'path' has the wrong JSON type"),
    ]
    for raw, message in cases:
        _, problems = entry_from_json("m1", raw, tmp_path)
        assert any(message in p and "'m1'" in p for p in problems), (raw, problems)


def test_models_file_and_enabled_models(tmp_path: Path) -> None:
    models_file = tmp_path / "models.json"
    models_file.write_text(
        json.dumps(
            {
                "models": {
                    "my-vosk": {"executor": "vosk", "path": "vosk", "decode_timeout": 90},
                    "whisper-base": {"executor": "whisper", "path": "w"},  # overrides a built-in
                }
            }
        )
    )
    settings = Settings(data_dir=tmp_path, models_file=models_file)
    registry = build_registry(settings)
    assert registry["my-vosk"].path == (tmp_path / "vosk").resolve()
    assert registry["my-vosk"].decode_timeout == 90
    assert registry["whisper-base"].path == (tmp_path / "w").resolve()
    assert "sherpa-zipformer-en-left-128" in registry
    assert registry["nemotron-3.5-asr-0.6b"].executor == "parakeet_cpp"
    enabled = settings.with_overrides(enabled_models=("my-vosk",))
    assert list(build_registry(enabled)) == ["my-vosk"]
    with pytest.raises(RegistryError, match="unknown models: nope"):
        build_registry(settings.with_overrides(enabled_models=("nope",)))
    models_file.write_text('{"models": {"x": {"executor": "vosk"}}}')
    with pytest.raises(RegistryError, match="'x': give exactly one of"):
        load_models_file(models_file)


def test_builtin_revisions_are_pinned() -> None:
    import re

    from talkies.engines.supply.builtin import builtin_models

    hex40, hex64 = re.compile(r"[0-9a-f]{40}"), re.compile(r"[0-9a-f]{64}")
    registry = builtin_models(Path("/data"))
    # The spec: four selectable English Sherpa Zipformer variants and Vosk small English.
    assert {
        "sherpa-zipformer-en-left-64",
        "sherpa-zipformer-en-left-128",
        "sherpa-zipformer-en-int8-left-64",
        "sherpa-zipformer-en-int8-left-128",
        "vosk-small-en-us-0.15",
        "whisper-base-en",
        "nemotron-3.5-asr-0.6b",
        "qwen3-tts-0.6b",
        "kokoro-82m",
    } <= set(registry)
    for slug, entry in registry.items():
        assert entry.problems() == [], slug
        if entry.repo is not None:  # a Hub snapshot: a commit id, and only the files it uses
            assert entry.revision and hex40.fullmatch(entry.revision), slug
            assert entry.allow_patterns, slug
            if entry.executor == "sherpa":
                assert set(entry.sherpa_config.values()) == set(entry.allow_patterns), slug
        elif entry.url is not None:  # an archive: https, and its content hash
            assert entry.url.startswith("https://"), slug
            assert entry.sha256 and hex64.fullmatch(entry.sha256), slug
        elif entry.wheels is not None:  # files from PyPI wheels, each hashed
            assert all(hex64.fullmatch(f.sha256) for f in entry.wheels), slug
        else:  # no pinnable revision could be looked up: a local folder, said so
            assert slug in ("nemotron-3.5-asr-0.6b", "qwen3-tts-0.6b"), slug
            assert entry.path is not None and str(entry.path) in entry.description, slug
            continue
        assert entry.pin is not None, slug
        assert entry.description, slug
    zipformers = {s: e for s, e in registry.items() if s.startswith("sherpa-zipformer-en-")}
    for slug in ("left-64", "left-128", "int8-left-64", "int8-left-128"):
        entry = zipformers[f"sherpa-zipformer-en-{slug}"]
        assert entry.revision == "672fbf1b30579d6585301139bb363f42a0ad4a24"
        left = slug.removeprefix("int8-")
        assert all(f"-chunk-16-{left}" in f for f in entry.sherpa_config.values() if "-" in f)
        assert (".int8." in entry.sherpa_config["encoder"]) == slug.startswith("int8")
    assert registry["vosk-small-en-us-0.15"].sha256 == (
        "30f26242c4eb449f948e42cb302dd7a686cb29a3423a8367f99ff41780942498"
    )


def test_pool_over_the_wire(tmp_path: Path) -> None:
    pool = _pool(tmp_path, Loads())
    with run_server(provider=pool) as server:
        n = ws_connect(server.url)
        n.send(json.dumps({**START, "model": "nemo"}))
        events, code, _ = drain(n)
        assert code == 4500 and "parakeet.cpp runtime" in events[0]["detail"]
        a = open_stream(server.url, model="a")
        b = ws_connect(server.url)
        b.send(json.dumps({**START, "model": "b"}))
        events, code, _ = drain(b)
        assert [e["code"] for e in events] == ["model_busy"] and code == 4409
        models = httpx.get(server.http + "/v1/models").json()["data"]
        row = {m["id"]: m for m in models}["a"]
        assert (row["loaded"], row["pinned"], row["in_use"]) == (True, True, 1)
        # The spec: unloading a pinned model is HTTP 409.
        assert httpx.delete(server.http + "/v1/models/a").status_code == 409
        assert httpx.delete(server.http + "/v1/models/nope").status_code == 404
        listing = subprocess.run(
            [sys.executable, "-m", "talkies", "models", "list", "--server", server.http],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "a " in listing.stdout and "loaded, pinned" in listing.stdout, listing
        a.send(speech(0.1))
        a.send(json.dumps({"type": "end"}))
        assert drain(a)[1] == 1000
        server.wait_idle()
        assert pool.pinned is None and pool.in_use("a") == 0
        unloaded = httpx.delete(server.http + "/v1/models/a")
        assert unloaded.status_code == 200 and pool.loaded() == []
