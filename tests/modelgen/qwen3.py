"""A tiny random-weight Qwen3-TTS model that the real ``qwen-tts`` package loads.

No Qwen3-TTS weights are reachable, so the tests build one from the package's own config
classes and save it as a Hub-shaped folder (``config.json`` + safetensors + text tokenizer +
``generation_config.json`` + ``speech_tokenizer/``), which production code loads with the same
``Qwen3TTSModel.from_pretrained(path)`` call it uses for the real checkpoints. Recipe and traps:
``/work/shared/research/test-models.md``.

- Talker: 2 layers, 64 wide, 16 code groups, the real vocabulary layout (2048 codes, then 1024
  special ids of which only end-of-speech may be sampled); code predictor 32 wide.
- Codec (12 Hz tokenizer): a Mimi encoder and the Qwen3 decoder, both 32 wide with one
  transformer layer. Its codebooks are filled with ``normal_()`` (they start at zero, so the
  decoder would output silence) and the decoder's convolutions get ``reset_parameters()`` (the
  default init shrinks the output to ~1e-7), so decoded audio is audible noise.
- Text tokenizer: byte-level BPE without merges (every byte one token) in a
  ``Qwen2TokenizerFast``, with ``assistant`` as one token (generation slices the prompt by
  position) and the chat/TTS special tokens.
- The end-of-speech row of the codec head is zero: random logits are almost never all below 0,
  so greedy decoding runs to ``max_new_tokens`` and tests choose the utterance length.

About 20 MB, built in well under a second; deterministic for a seed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["GENERATION_DEFAULTS", "LANGUAGES", "SPEAKERS", "tiny_qwen3_tts"]

SPEAKERS = ("vivian", "ryan", "serena")
LANGUAGES = {"english": 2050, "chinese": 2055, "japanese": 2058}

# Text token ids: the 256 bytes, then these (in this order).
_ADDED = [
    "assistant",
    "<|im_start|>",
    "<|im_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
]
_ENDOFTEXT = "<|endoftext|>"
_TEXT_VOCAB = 256 + len(_ADDED) + 1

_CODEC_CODES = 2048
_TALKER_VOCAB = _CODEC_CODES + 1024
_CODEC_IDS = {
    "codec_pad_id": 2148,
    "codec_bos_id": 2149,
    "codec_eos_token_id": 2150,
    "codec_think_id": 2154,
    "codec_nothink_id": 2155,
    "codec_think_bos_id": 2156,
    "codec_think_eos_id": 2157,
}
_SPEAKER_IDS = {name: 3000 + i for i, name in enumerate(SPEAKERS)}

_SPEAKER_ENCODER = {
    "mel_dim": 128,
    "enc_dim": 64,  # = talker hidden size: the x-vector is one step of the codec prompt
    "enc_channels": [32, 32, 32, 32, 96],
    "enc_kernel_sizes": [5, 3, 3, 3, 1],
    "enc_dilations": [1, 2, 3, 4, 1],
    "enc_attention_channels": 16,
    "enc_res2net_scale": 8,
    "enc_se_channels": 16,
    "sample_rate": 24000,
}

GENERATION_DEFAULTS = {
    "do_sample": True,
    "top_k": 50,
    "top_p": 1.0,
    "temperature": 0.9,
    "repetition_penalty": 1.05,
    "subtalker_dosample": True,
    "subtalker_top_k": 50,
    "subtalker_top_p": 1.0,
    "subtalker_temperature": 0.9,
    "max_new_tokens": 2048,
}


def _text_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import Qwen2TokenizerFast
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    chars = bytes_to_unicode()
    vocab = {chars[b]: b for b in range(256)}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens(_ADDED[:1])
    backend.add_special_tokens([*_ADDED[1:], _ENDOFTEXT])
    tokenizer = Qwen2TokenizerFast(
        tokenizer_object=backend,
        unk_token=None,
        bos_token=None,
        eos_token=_ENDOFTEXT,
        pad_token=_ENDOFTEXT,
    )
    ids = tokenizer.convert_tokens_to_ids([*_ADDED, _ENDOFTEXT])
    assert ids == list(range(256, _TEXT_VOCAB)), ids
    tokenizer.save_pretrained(out)


def _codec(out: Path) -> None:
    import torch
    from qwen_tts.core import Qwen3TTSTokenizerV2Config, Qwen3TTSTokenizerV2Model
    from transformers import EncodecFeatureExtractor

    width = 32
    config = Qwen3TTSTokenizerV2Config(
        encoder_config={
            "hidden_size": width,
            "num_filters": 4,
            "codebook_size": _CODEC_CODES,
            "codebook_dim": width,
            "num_quantizers": 16,
            "vector_quantization_hidden_dimension": width,
            "upsample_groups": width,
            "num_hidden_layers": 1,
            "intermediate_size": 2 * width,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": width // 2,
        },
        decoder_config={
            "codebook_size": _CODEC_CODES,
            "codebook_dim": width,
            "hidden_size": width,
            "latent_dim": width,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "intermediate_size": 2 * width,
            "num_hidden_layers": 1,
            "num_quantizers": 16,
            "decoder_dim": width,
        },
    )
    model = Qwen3TTSTokenizerV2Model(config)
    with torch.no_grad():
        for name, param in model.decoder.named_parameters():
            if name.endswith("embedding_sum"):
                param.normal_()
        for module in model.decoder.modules():
            if isinstance(module, torch.nn.Conv1d | torch.nn.ConvTranspose1d):
                module.reset_parameters()
    model.save_pretrained(out)
    EncodecFeatureExtractor(feature_size=1, sampling_rate=24000).save_pretrained(out)


def tiny_qwen3_tts(out: Path, kind: str = "custom_voice", *, seed: int = 0) -> Path:
    """Write a tiny ``kind`` ("custom_voice" or "base") Qwen3-TTS model folder to ``out``."""
    import torch

    from talkies.engines.qwen3 import import_qwen_tts

    import_qwen_tts()  # with the torchaudio guard: PyPI's torchaudio does not import here
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration

    if kind not in ("custom_voice", "base"):
        raise ValueError(f"unknown Qwen3-TTS model kind {kind!r}")
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    custom = kind == "custom_voice"
    talker: dict[str, Any] = {
        "vocab_size": _TALKER_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3], "interleaved": True},
        "num_code_groups": 16,
        "text_hidden_size": 32,
        "text_vocab_size": _TEXT_VOCAB,
        "spk_id": dict(_SPEAKER_IDS) if custom else {},
        "spk_is_dialect": dict.fromkeys(_SPEAKER_IDS, False) if custom else {},
        "codec_language_id": dict(LANGUAGES),
        "code_predictor_config": {
            "vocab_size": _CODEC_CODES,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "num_code_groups": 16,
        },
        **_CODEC_IDS,
    }
    config = Qwen3TTSConfig(
        talker_config=talker,
        speaker_encoder_config=dict(_SPEAKER_ENCODER),
        tokenizer_type="qwen3_tts_tokenizer_12hz",
        tts_model_size="0b6",
        tts_model_type=kind,
        im_start_token_id=257,
        im_end_token_id=258,
        tts_pad_token_id=259,
        tts_bos_token_id=260,
        tts_eos_token_id=261,
    )
    model = Qwen3TTSForConditionalGeneration(config)
    with torch.no_grad():
        model.talker.codec_head.weight[_CODEC_IDS["codec_eos_token_id"]].zero_()
    model.save_pretrained(out)
    # The speaker encoder config takes no **kwargs: keep only its own fields.
    saved = json.loads((out / "config.json").read_text())
    saved["speaker_encoder_config"] = dict(_SPEAKER_ENCODER)
    (out / "config.json").write_text(json.dumps(saved, indent=2))
    # qwen-tts reads generation_config.json as its own sampling defaults.
    (out / "generation_config.json").write_text(json.dumps(GENERATION_DEFAULTS, indent=2))
    _text_tokenizer(out)
    _codec(out / "speech_tokenizer")
    return out
