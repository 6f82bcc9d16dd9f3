"""The parakeet_cpp executor (``talkies/engines/parakeet.py``).

The engine's tests against the real runtime are in ``tests/engine_parakeet_runtime.py``;
:func:`test_the_runtime_suite` runs them in a child process. The runtime (PyPI
``parakeet-cpp-cuda``) cannot load without the NVIDIA driver's ``libcuda.so.1``; on a machine
without one, the child gets a test-only stand-in built here from
``tests/modelgen/libcuda_nodevice.c``, which reports "no CUDA device" so that the runtime
decodes on the CPU. The stand-in stays out of this process: here the runtime is left as the
machine has it, which is what the missing-library messages are tested against.

This module tests, in-process, what needs no runtime: the GGUF header, the options, the
model file, languages and text clean-up.
"""

from __future__ import annotations

import ctypes.util
import importlib.metadata
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from types import MappingProxyType

import pytest

from talkies.engines import parakeet as engine
from talkies.engines.base import EngineUnavailable, Refusal
from talkies.engines.parakeet.gguf_meta import GGUFError, read_metadata
from talkies.engines.supply.builtin import DEFAULT_MODEL
from talkies.protocol import ErrorCode, Word

from .modelgen import parakeet as gen

ROOT = Path(__file__).resolve().parent.parent
SUITE = Path(__file__).with_name("engine_parakeet_runtime.py")
STAND_IN = Path(__file__).parent / "modelgen" / "libcuda_nodevice.c"


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_runtime_package = pytest.mark.skipif(
    not _installed(engine.PACKAGE),
    reason=f"the PyPI package {engine.PACKAGE} is not installed (pip install 'talkies[parakeet]')",
)


# -- against the real runtime, in a child ----------------------------------------------------


def build_stand_in(folder: Path) -> Path:
    """Compile the test-only ``libcuda.so.1`` stand-in into ``folder``."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    assert compiler, "building the libcuda.so.1 stand-in needs gcc (apt-get install gcc)"
    target = folder / "libcuda.so.1"
    subprocess.run(
        [
            *(compiler, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror"),
            *("-Wl,-soname,libcuda.so.1", "-o", str(target), str(STAND_IN)),
        ],
        check=True,
        capture_output=True,
    )
    return target


@needs_runtime_package
def test_the_runtime_suite(tmp_path: Path) -> None:
    stand_in = build_stand_in(tmp_path)
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(stand_in.parent), env.get("LD_LIBRARY_PATH")) if p
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SUITE)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    report = (result.stdout + result.stderr)[-12000:]
    assert result.returncode == 0, report
    assert " passed" in result.stdout and " skipped" not in result.stdout, report


def test_the_stand_in_reports_no_device(tmp_path: Path) -> None:
    """The stand-in is what its comment says: every driver call answers "no device". Checked
    in a child: loaded here, it would stand in for the driver in every later test."""
    code = f"""
import ctypes
library = ctypes.CDLL({str(build_stand_in(tmp_path))!r})
count, text = ctypes.c_int(-1), ctypes.c_char_p()
assert library.cuInit(0) == 100  # CUDA_ERROR_NO_DEVICE
assert library.cuDeviceGet(ctypes.byref(count), 0) == 100
assert library.cuGetErrorString(100, ctypes.byref(text)) == 0
print(text.value.decode())
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "test stand-in for libcuda.so.1" in result.stdout


# -- the missing-library messages, in children (this process keeps its libraries) ---------------

_PROBE = """
import dataclasses
from pathlib import Path
from talkies.engines import parakeet
from talkies.engines.base import EngineUnavailable
from talkies.engines.supply.registry import ModelEntry
{setup}
entry = ModelEntry(slug="nemotron-3.5-asr-0.6b", executor="parakeet_cpp", path=Path("/nowhere"))
try:
    print("LOADED", parakeet.require_runtime(entry))
except EngineUnavailable as exc:
    print("UNAVAILABLE", exc)
"""


def probe(setup: str = "") -> str:
    """What ``require_runtime`` says in a fresh process (with this process's environment)."""
    code = _PROBE.format(setup=textwrap.dedent(setup))
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@needs_runtime_package
def test_a_missing_driver_is_named(tmp_path: Path) -> None:
    if ctypes.util.find_library("cuda"):
        pytest.skip("this machine has an NVIDIA driver (libcuda.so.1)")
    assert probe() == (
        "UNAVAILABLE model 'nemotron-3.5-asr-0.6b' cannot load the parakeet.cpp runtime: "
        "libcuda.so.1 (the NVIDIA driver) is missing: parakeet-cpp-cuda needs an NVIDIA GPU "
        "and its driver, even to decode on the CPU. "
        f"Use {DEFAULT_MODEL!r} here, which works offline"
    )


@needs_runtime_package
def test_a_missing_cuda_library_is_named_with_its_package() -> None:
    # The loader pointed at nothing: cuBLAS's wheel under a name that is not installed.
    message = probe(
        """
        parakeet.native._CUDA_LIBRARIES = tuple(
            dataclasses.replace(lib, distribution=lib.distribution + "-absent")
            if lib.soname == "libcublas.so.12" else lib
            for lib in parakeet.native._CUDA_LIBRARIES
        )
        """
    )
    if message.startswith("LOADED"):
        pytest.skip("this machine has cuBLAS 12 on the loader's path")
    assert message == (
        "UNAVAILABLE model 'nemotron-3.5-asr-0.6b' cannot load the parakeet.cpp runtime: "
        "libcublas.so.12 (cuBLAS) is missing: parakeet-cpp-cuda needs it from the PyPI "
        "package nvidia-cublas-cu12-absent (pip install 'talkies[parakeet]'). "
        f"Use {DEFAULT_MODEL!r} here, which works offline"
    )


def test_a_missing_package_is_named() -> None:
    message = probe('parakeet.native.PACKAGE = "parakeet-cpp-cuda-not-installed"')
    assert message == (
        "UNAVAILABLE model 'nemotron-3.5-asr-0.6b' cannot load the parakeet.cpp runtime: "
        "the PyPI package parakeet-cpp-cuda-not-installed is not installed "
        "(pip install 'talkies[parakeet]'). "
        f"Use {DEFAULT_MODEL!r} here, which works offline"
    )


# -- the GGUF header ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tones(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gen.tone_transducer(tmp_path_factory.mktemp("tones") / "tones.gguf")


def test_gguf_metadata(tones: Path) -> None:
    keys = ("general.architecture", "parakeet.tokenizer.pieces", "parakeet.vocab_size")
    assert read_metadata(tones, (*keys, "no.such.key")) == {
        "general.architecture": "parakeet",
        "parakeet.tokenizer.pieces": list(gen.PIECES),
        "parakeet.vocab_size": len(gen.PIECES),
    }
    header = engine.read_header("m", tones)
    assert header == engine.ModelHeader(languages=tuple(gen.LANGUAGES), default_language="auto")
    plain = gen.tone_transducer(tones.with_name("plain.gguf"), prompt=False)
    assert engine.read_header("m", plain) == engine.ModelHeader(languages=(), default_language=None)


def test_files_that_are_not_parakeet_models(tmp_path: Path, tones: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    with pytest.raises(EngineUnavailable, match=r"'m': cannot read .*no GGUF magic number"):
        engine.read_header("m", bad)
    bad.write_bytes(tones.read_bytes()[:100])
    with pytest.raises(EngineUnavailable, match="the file ends inside its header"):
        engine.read_header("m", bad)
    bad.write_bytes(b"GGUF" + struct.pack("<I", 1) + bytes(16))
    with pytest.raises(GGUFError, match="GGUF version 1"):
        read_metadata(bad, ("general.architecture",))
    # A GGUF of another architecture (a llama.cpp model, say).
    bad.write_bytes(
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + struct.pack("<Q", 20)
        + b"general.architecture"
        + struct.pack("<IQ", 8, 5)
        + b"llama"
    )
    with pytest.raises(
        EngineUnavailable,
        match=r"'m': 'bad.gguf' is not a parakeet.cpp model \(general.architecture is 'llama'",
    ):
        engine.read_header("m", bad)


# -- options and the model file ----------------------------------------------------------------


def test_options() -> None:
    assert engine.ParakeetOptions.parse("m", {}) == engine.ParakeetOptions()
    assert engine.ParakeetOptions.parse("m", {"gguf_file": "a/b.gguf"}).gguf_file == "a/b.gguf"
    with pytest.raises(ValueError, match=r"'m': unknown parakeet_cpp option\(s\) 'library'"):
        engine.ParakeetOptions.parse("m", {"library": "/x.so"})
    for bad in ("../x.gguf", "/abs.gguf", "x.bin", 3):
        with pytest.raises(ValueError, match=r"'gguf_file' must name a \.gguf file inside"):
            engine.ParakeetOptions.parse("m", MappingProxyType({"gguf_file": bad}))


def test_the_model_file(tmp_path: Path) -> None:
    none = engine.ParakeetOptions()
    with pytest.raises(EngineUnavailable, match=r"'m': the model folder .* does not exist"):
        engine.model_file("m", tmp_path / "nowhere", none)
    with pytest.raises(EngineUnavailable, match=r"'m': no \.gguf file in"):
        engine.model_file("m", tmp_path, none)
    (tmp_path / "b.gguf").write_bytes(b"")
    assert engine.model_file("m", tmp_path, none) == tmp_path / "b.gguf"
    (tmp_path / "a.gguf").write_bytes(b"")
    with pytest.raises(EngineUnavailable, match=r"several \.gguf files \(a.gguf, b.gguf\)"):
        engine.model_file("m", tmp_path, none)
    named = engine.ParakeetOptions(gguf_file="a.gguf")
    assert engine.model_file("m", tmp_path, named) == tmp_path / "a.gguf"
    with pytest.raises(EngineUnavailable, match=r"'c.gguf' is not in"):
        engine.model_file("m", tmp_path, engine.ParakeetOptions(gguf_file="c.gguf"))


# -- languages and text ------------------------------------------------------------------------


def test_choose_language() -> None:
    tags = ("en", "en-US", "de", "auto")
    choose = engine.choose_language
    assert choose("m", tags, None) is None  # the model's default
    assert choose("m", tags, "auto") == "auto"
    assert choose("m", ("en",), "auto") is None
    assert choose("m", tags, "en-US") == "en-US"
    assert choose("m", tags, "en-GB") == "en"
    assert choose("m", tags, "de-CH") == "de"
    with pytest.raises(Refusal) as refused:
        choose("m", tags, "pt-BR")
    assert refused.value.code is ErrorCode.INVALID_LANGUAGE
    assert refused.value.detail == "model 'm' has no language 'pt-BR' (it knows de, en, en-US)"
    # Without language prompts the model hears its one language, whatever is asked.
    assert choose("m", (), "pt-BR") is None


def test_clean_text_and_words() -> None:
    assert engine.clean_text(" hello  world <en-us>") == "hello world"
    assert engine.clean_text("<de-DE> guten tag ") == "guten tag"
    assert engine.clean_text("a <zh> c") == "a c"  # a tag is a whole token ...
    assert engine.clean_text("x<en>y <b> a < b") == "x<en>y <b> a < b"  # ... like no other
    raw = [
        {"w": "hi", "start": 0.5, "end": 0.75, "conf": 0.9},
        {"w": "<en-us>", "start": 0.8, "end": 0.9, "conf": 1.0},
        {"w": "back", "start": -0.1, "end": 0.2, "conf": 2.0},
        {"w": "late", "start": 1.0, "end": 0.9},
        {"w": "", "start": 1.0, "end": 1.1},
        {"w": "nan", "start": float("nan"), "end": 1.1},
        {"w": "bool", "start": True, "end": 1.1},
        "word",
    ]
    assert engine.parse_words(raw) == [
        Word(word="hi", start=0.5, end=0.75, confidence=0.9),
        Word(word="back", start=0.0, end=0.2),
        Word(word="late", start=1.0, end=1.0),
    ]
    assert engine.parse_words(None) == []
