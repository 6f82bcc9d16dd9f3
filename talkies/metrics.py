"""Prometheus metrics (``GET /metrics``), with ``prometheus-client``.

Counters and histograms are process-wide and live in :data:`REGISTRY` (not the client's
default registry, so an application embedding Talkies keeps its own namespace clean). Gauges
that describe state (slots, loaded models) are read at scrape time from every live
:class:`StateSource` (the app registers itself with :func:`track`), so they can never drift
from the pool they describe. This module imports nothing of Talkies: every layer may record
into it.

Nothing here reads a clock or does I/O on its own: callers observe the values they measured.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "AUDIO_SECONDS",
    "CONTENT_TYPE",
    "DECODE_ROUND_SECONDS",
    "EVENT_LATENCY_SECONDS",
    "FIRST_AUDIO_SECONDS",
    "FRAMES",
    "LAG_REFUSALS",
    "MODEL_LOAD_SECONDS",
    "REGISTRY",
    "SPEECH_AUDIO_SECONDS",
    "STREAMS",
    "STREAM_LAG_SECONDS",
    "SYNTHESES",
    "LagSource",
    "StateSource",
    "render",
    "track",
    "track_lag",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REGISTRY = CollectorRegistry(auto_describe=True)

# ``surface`` says which door the traffic came in by: "websocket" (the live-ASR WebSocket),
# "deepgram" and "realtime" (the translated WebSockets, docs/dialects.md: their streams,
# frames, audio and event latency), "wyoming" (Home Assistant's
# protocol), "http" (the HTTP speech routes).
STREAMS = Counter(
    "talkies_streams",
    "Live-ASR streams that ended, by surface, outcome and the contract's error code ('' when "
    "none).",
    ["surface", "outcome", "code"],
    registry=REGISTRY,
)
FRAMES = Counter(
    "talkies_audio_frames",
    "Audio frames accepted (WebSocket binary frames, Wyoming audio-chunk events).",
    ["surface"],
    registry=REGISTRY,
)
AUDIO_SECONDS = Counter(
    "talkies_audio_seconds", "Seconds of audio accepted on streams.", ["surface"], registry=REGISTRY
)
SYNTHESES = Counter(
    "talkies_syntheses",
    "Speech syntheses that ended, by surface, outcome ('end', 'peer_gone' or the error code) "
    "and error code ('' when none).",
    ["surface", "outcome", "code"],
    registry=REGISTRY,
)
FIRST_AUDIO_SECONDS = Histogram(
    "talkies_first_audio_seconds",
    "From a speech request's text to its first audio (slot and model load included).",
    ["surface"],
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
SPEECH_AUDIO_SECONDS = Counter(
    "talkies_speech_audio_seconds",
    "Seconds of speech synthesized and sent.",
    ["surface"],
    registry=REGISTRY,
)
DECODE_ROUND_SECONDS = Histogram(
    "talkies_decode_round_seconds",
    "Wall time of one decode round (one worker-thread hop over every ready stream of a model).",
    ["model"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)
EVENT_LATENCY_SECONDS = Histogram(
    "talkies_event_latency_seconds",
    "From the newest audio given to the engine to a partial or endpoint event being sent.",
    ["surface"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
    registry=REGISTRY,
)
STREAM_LAG_SECONDS = Histogram(
    "talkies_stream_lag_seconds",
    "How far behind the audio received the decoder was when a decode round ended: the worst "
    "of the round's streams (the lag their results carry; talkies/engines/runtime/lag.py).",
    ["model"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
LAG_REFUSALS = Counter(
    "talkies_lag_refusals",
    "Streams refused (connection_limit) because their model was lagging (TALKIES_STREAM_MAX_LAG).",
    ["model"],
    registry=REGISTRY,
)
MODEL_LOAD_SECONDS = Histogram(
    "talkies_model_load_seconds",
    "Time to load a model into memory (after its files are in place).",
    ["model"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
    registry=REGISTRY,
)


class _Counted(Protocol):
    @property
    def held(self) -> int: ...

    @property
    def limit(self) -> int: ...


class _Models(Protocol):
    def status(self) -> list[dict[str, Any]]:
        """One row per model: ``model``, ``in_use``, ``max_concurrency``, ``loaded``,
        ``pinned``."""
        ...


class StateSource(Protocol):
    """What the state gauges read at scrape time: the server-wide stream slots and the
    model pool (None: a server without models)."""

    @property
    def stream_slots(self) -> _Counted: ...

    @property
    def pool(self) -> _Models | None: ...


_apps: weakref.WeakSet[StateSource] = weakref.WeakSet()


def track(app: StateSource) -> None:
    """Report ``app``'s slots and models in the gauges while it lives."""
    _apps.add(app)


class _StateCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        streams = GaugeMetricFamily(
            "talkies_active_streams", "Live-ASR streams holding a server-wide slot."
        )
        stream_limit = GaugeMetricFamily(
            "talkies_stream_slots", "Server-wide stream slots (TALKIES_STREAM_MAX_CONNECTIONS)."
        )
        in_use = GaugeMetricFamily(
            "talkies_model_slots_in_use",
            "Slots of a model held by streams and HTTP requests.",
            labels=["model"],
        )
        limit = GaugeMetricFamily(
            "talkies_model_slots", "Slots of a model (its max_concurrency).", labels=["model"]
        )
        loaded = GaugeMetricFamily(
            "talkies_model_loaded", "1 while the model is in memory.", labels=["model"]
        )
        pinned = GaugeMetricFamily(
            "talkies_model_pinned", "1 while streams pin the model.", labels=["model"]
        )
        for app in list(_apps):
            streams.add_metric([], app.stream_slots.held)
            stream_limit.add_metric([], app.stream_slots.limit)
            if app.pool is None:
                continue
            for row in app.pool.status():
                labels = [row["model"]]
                in_use.add_metric(labels, row["in_use"])
                limit.add_metric(labels, row["max_concurrency"])
                loaded.add_metric(labels, int(row["loaded"]))
                pinned.add_metric(labels, int(row["pinned"]))
        yield from (streams, stream_limit, in_use, limit, loaded, pinned)


REGISTRY.register(_StateCollector())


class LagSource(Protocol):
    """A model's decode rounds, as the lag gauges read them at scrape time."""

    label: str

    def lag_state(self) -> tuple[float, bool]:
        """(the model's lag now in seconds, whether new streams are refused for it)."""
        ...


_lag_sources: weakref.WeakSet[LagSource] = weakref.WeakSet()


def track_lag(source: LagSource) -> None:
    """Report ``source``'s lag in the gauges while it lives (the runtime registers each
    model's rounds)."""
    _lag_sources.add(source)


class _LagCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "talkies_model_lag_seconds",
            "The worst current lag of a model's open streams.",
            labels=["model"],
        )
        lagging = GaugeMetricFamily(
            "talkies_model_lagging",
            "1 while new streams on the model are refused for its lag (TALKIES_STREAM_MAX_LAG).",
            labels=["model"],
        )
        models: dict[str, tuple[float, bool]] = {}
        for source in list(_lag_sources):
            if source.label:  # (a model reloaded while its old rounds live: one row)
                seconds, refusing = source.lag_state()
                was = models.get(source.label, (0.0, False))
                models[source.label] = (max(was[0], seconds), was[1] or refusing)
        for model, (seconds, refusing) in sorted(models.items()):
            lag.add_metric([model], seconds)
            lagging.add_metric([model], int(refusing))
        yield from (lag, lagging)


REGISTRY.register(_LagCollector())


def render() -> bytes:
    """The text exposition of every metric."""
    return generate_latest(REGISTRY)
