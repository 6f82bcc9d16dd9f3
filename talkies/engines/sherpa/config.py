"""sherpa-onnx configuration: an entry's engine options, its recognizer's keyword arguments
(model paths resolved and confined under the model's root, other keys checked against the
factory's signature), and the provider from ``TALKIES_DEVICE``."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...protocol.events import SAMPLE_RATE

__all__ = [
    "ALIASES",
    "PATH_KEYS",
    "PATH_LIST_KEYS",
    "RESERVED_KEYS",
    "SherpaOptions",
    "recognizer_kwargs",
    "select_provider",
]

# Keys naming one file (or directory) of the model: resolved under the model root.
PATH_KEYS = frozenset(
    {
        "tokens",
        "encoder",
        "decoder",
        "joiner",
        "model",
        "lm",
        "hotwords_file",
        "bpe_vocab",
        "ctc_graph",
        "lodr_fst",
        "hr_lexicon",
        "hr_dict_dir",
    }
)
# Keys naming comma-separated files.
PATH_LIST_KEYS = frozenset({"rule_fsts", "rule_fars", "hr_rule_fsts"})
_DIRECTORY_KEYS = frozenset({"hr_dict_dir"})
# Registry spellings -> the factory's parameter.
ALIASES = {"lm_model": "lm"}
# Chosen by talkies, not by the registry entry.
RESERVED_KEYS = {
    "provider": "the provider follows TALKIES_DEVICE",
    "device": "the device follows TALKIES_DEVICE",
}
_DEFAULTS: dict[str, object] = {
    "sample_rate": SAMPLE_RATE,
    "feature_dim": 80,
    "enable_endpoint_detection": True,
}
_CUDA_DEVICE = re.compile(r"cuda:(0|[1-9][0-9]{0,8})")


@dataclass(frozen=True, kw_only=True, slots=True)
class SherpaOptions:
    """The engine knobs of a sherpa entry (``ModelEntry.options``)."""

    batch: bool = True
    max_batch: int = 16
    max_wait: float = 0.005
    tail_padding: float = 0.66

    @classmethod
    def parse(cls, slug: str, options: Mapping[str, Any]) -> SherpaOptions:
        where = f"model {slug!r}"
        unknown = sorted(set(options) - {"batch", "max_batch", "max_wait", "tail_padding"})
        if unknown:
            raise ValueError(
                f"{where}: unknown sherpa option(s) {', '.join(map(repr, unknown))}; known: "
                "'batch', 'max_batch', 'max_wait', 'tail_padding'"
            )
        batch = options.get("batch", True)
        if not isinstance(batch, bool):
            raise ValueError(f"{where}: option 'batch' must be true or false")
        max_batch = options.get("max_batch", 16)
        if type(max_batch) is not int or not 1 <= max_batch <= 1024:
            raise ValueError(f"{where}: option 'max_batch' must be an integer from 1 to 1024")

        def seconds(key: str, default: float, top: float) -> float:
            value = options.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{where}: option {key!r} must be a number of seconds")
            if not 0.0 <= float(value) <= top:
                raise ValueError(f"{where}: option {key!r} must be from 0 to {top} seconds")
            return float(value)

        return cls(
            batch=batch,
            max_batch=max_batch,
            max_wait=seconds("max_wait", 0.005, 1.0),
            tail_padding=seconds("tail_padding", 0.66, 5.0),
        )


def _cuda_available() -> bool:
    """A CUDA-capable onnxruntime (the Python one, or the one sherpa-onnx bundles) and an
    NVIDIA device node."""
    providers: list[str] = []
    try:
        import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        pass
    else:
        providers = list(onnxruntime.get_available_providers())
    bundled = False
    try:
        import sherpa_onnx  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        pass
    else:
        lib = Path(sherpa_onnx.__file__).parent / "lib"
        bundled = any(lib.glob("libonnxruntime_providers_cuda*"))
    if "CUDAExecutionProvider" not in providers and not bundled:
        return False
    return Path("/dev/nvidiactl").exists() or any(Path("/proc/driver/nvidia/gpus").glob("*"))


def select_provider(
    device: str, *, cuda_available: Callable[[], bool] = _cuda_available
) -> tuple[str, int]:
    """``(provider, device index)`` for sherpa-onnx from ``TALKIES_DEVICE``.

    ``cuda`` and ``cuda:N`` ask for CUDA (sherpa-onnx itself falls back to the CPU, with a
    log line, when its onnxruntime has no CUDA provider); ``auto`` picks CUDA only when
    ``cuda_available()`` says so; ``cpu`` is the CPU.
    """
    if device == "cpu":
        return "cpu", 0
    if device == "cuda":
        return "cuda", 0
    match = _CUDA_DEVICE.fullmatch(device)
    if match is not None:
        return "cuda", int(match.group(1))
    if device == "auto":
        return ("cuda", 0) if cuda_available() else ("cpu", 0)
    raise ValueError(f"TALKIES_DEVICE must be auto, cpu, cuda or cuda:N, got {device!r}")


def _resolve(slug: str, key: str, value: str, root: Path) -> str:
    base = root.resolve()
    target = (base / value).resolve()  # an absolute value replaces base; symlinks followed
    if target != base and base not in target.parents:
        raise ValueError(
            f"model {slug!r}: sherpa_config[{key!r}] = {value!r} is outside the model "
            f"directory {str(base)!r}"
        )
    exists = target.is_dir() if key in _DIRECTORY_KEYS else target.is_file()
    if not exists:
        raise ValueError(
            f"model {slug!r}: sherpa_config[{key!r}] = {value!r}: no such "
            f"{'directory' if key in _DIRECTORY_KEYS else 'file'} in {str(base)!r}"
        )
    return str(target)


def recognizer_kwargs(
    slug: str,
    factory: Callable[..., object],
    config: Mapping[str, Any],
    root: Path,
    provider: tuple[str, int],
) -> dict[str, Any]:
    """Keyword arguments for ``factory`` from an entry's ``sherpa_config``: model paths
    resolved and confined under ``root``, keys checked against the factory's signature."""
    name = getattr(factory, "__name__", "factory")
    params = inspect.signature(factory).parameters
    accepted = {
        p for p, spec in params.items() if spec.kind is not spec.VAR_KEYWORD
    } - RESERVED_KEYS.keys()
    kwargs: dict[str, Any] = {}
    for raw_key, value in config.items():
        key = ALIASES.get(raw_key, raw_key)
        if key in RESERVED_KEYS:
            raise ValueError(f"model {slug!r}: sherpa_config[{raw_key!r}] is not allowed: "
                             f"{RESERVED_KEYS[key]}")  # fmt: skip
        if key not in accepted:
            raise ValueError(
                f"model {slug!r}: sherpa_config[{raw_key!r}] is not a parameter of "
                f"OnlineRecognizer.{name} (accepted: {', '.join(sorted(accepted))})"
            )
        if key in kwargs:
            raise ValueError(f"model {slug!r}: sherpa_config sets {key!r} twice")
        if key in PATH_KEYS or key in PATH_LIST_KEYS:
            if not isinstance(value, str):
                raise ValueError(f"model {slug!r}: sherpa_config[{raw_key!r}] must be a path")
            if value and key in PATH_LIST_KEYS:
                kwargs[key] = ",".join(_resolve(slug, raw_key, v, root) for v in value.split(","))
                continue
            if value:
                kwargs[key] = _resolve(slug, raw_key, value, root)
                continue
        kwargs[key] = value
    required = [
        p
        for p, spec in params.items()
        if spec.default is spec.empty and spec.kind is not spec.VAR_KEYWORD and p not in kwargs
    ]
    if required:
        raise ValueError(
            f"model {slug!r}: sherpa_config lacks {', '.join(map(repr, required))} "
            f"for OnlineRecognizer.{name}"
        )
    for key, default in _DEFAULTS.items():
        if key in accepted:
            kwargs.setdefault(key, default)
    kwargs["provider"], kwargs["device"] = provider
    return kwargs
