"""The garbage collector's settings for a standalone server (``talkies serve``).

CPython's cyclic collector stops the event loop while it runs. With its defaults a serving
process pays for that twice over (measured in bench/README.md, "Transport efficiency", third
pass):

- a full collection walks every object, and most of them are the modules, settings and
  tables loaded at start-up, which never become garbage: at 400 paced streams, full
  collections of up to 100 ms held every connection, and the p99 frame latency (177 ms) was
  the length of one;
- a young collection every 700 allocations ran 700 times in 12 s at 400 streams, about a
  millisecond each (the frames and coroutines in flight are young, and walked every time).

Settled, the same run's p99 was 83 ms.

:func:`settle` freezes what start-up allocated (:func:`gc.freeze`: never walked again) and
collects the young generation every ``YOUNG_THRESHOLD`` allocations instead (the older
generations keep CPython's ratios, so garbage cycles are still collected, in fewer, larger
steps). The server's own per-frame objects are freed by reference counting, not by the
collector. The library never calls this by itself: an application that embeds the server
owns its process's collector.
"""

from __future__ import annotations

import gc
import logging

__all__ = ["YOUNG_THRESHOLD", "settle"]

log = logging.getLogger("talkies.server")

YOUNG_THRESHOLD = 10_000


def settle() -> None:
    """Once the server is up: collect, freeze what is left, and collect the young generation
    every ``YOUNG_THRESHOLD`` allocations."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    log.info(
        "garbage collector settled",
        extra={"frozen_objects": gc.get_freeze_count(), "thresholds": list(gc.get_threshold())},
    )
