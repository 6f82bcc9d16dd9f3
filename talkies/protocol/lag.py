"""A stream's lag as the session sees it: how far behind its audio the decoder answered.

The engine runtime measures the lag (``talkies.engines.runtime.lag``) and hands it in on each
engine result (``EnginePartial.lag`` ...); the session never reads a clock. It sends it on
transcript events as the ``lag`` extension field and sums it up in ``stats``
(docs/protocol.md). :class:`LagRecord` keeps the distribution in a bounded histogram, so a
4-hour stream costs the same few hundred entries as a short one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["LagRecord", "LagSummary", "clean_lag"]

# Milliseconds are kept exactly below this, then to two significant digits (10 ms steps under
# 1 s, 100 ms under 10 s, ...): a few hundred buckets at most, whatever the stream's length.
_EXACT_MS = 100


_MOST_SECONDS = 1e9  # ~32 years: more than any stream is behind


def clean_lag(seconds: float | None) -> float | None:
    """An engine's lag as events carry it: seconds rounded to the millisecond, or None for
    none (a value that is not a finite number is dropped; a negative one is 0, and one past
    ``_MOST_SECONDS`` is that: its milliseconds must still be an int)."""
    if type(seconds) is not float:  # (the runtime's: a float; checked once per result)
        if seconds is None or not isinstance(seconds, int | float):
            return None
        seconds = float(seconds)
    if not 0.0 < seconds < math.inf:
        return 0.0 if -math.inf < seconds <= 0.0 else None  # (NaN fails both)
    return round(min(seconds, _MOST_SECONDS), 3)


def _bucket(ms: int) -> int:
    if ms < _EXACT_MS:
        return ms
    step = 10
    while ms >= step * _EXACT_MS:
        step *= 10
    return (ms + step // 2) // step * step


@dataclass(frozen=True, kw_only=True, slots=True)
class LagSummary:
    """The ``lag`` object of ``stats``: percentiles of the lag the stream's results carried
    (seconds; the percentiles to two significant digits above 0.1 s, ``max`` exact)."""

    p50: float
    p90: float
    p99: float
    max: float
    results: int  # how many results carried a lag

    def to_dict(self) -> dict[str, Any]:
        return {
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "max": self.max,
            "results": self.results,
        }


class LagRecord:
    """The lags of one stream's results, in milliseconds buckets."""

    __slots__ = ("_counts", "_max", "count")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self._max = 0.0
        self.count = 0

    def add(self, seconds: float) -> None:
        """One result's lag (seconds, already cleaned: finite and not negative)."""
        ms = round(seconds * 1000)
        key = ms if ms < _EXACT_MS else _bucket(ms)
        counts = self._counts
        counts[key] = counts.get(key, 0) + 1
        self.count += 1
        self._max = max(self._max, seconds)

    def percentile(self, q: float) -> float:
        """The nearest-rank ``q`` quantile (0 < q <= 1) in seconds; 0 with no results."""
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(q * self.count))
        seen = 0
        for key in sorted(self._counts):
            seen += self._counts[key]
            if seen >= rank:
                return min(key / 1000, self._max)
        return self._max  # (unreachable: the counts add up to count)

    def summary(self) -> LagSummary | None:
        """The ``stats`` extension, or None when no result carried a lag."""
        if not self.count:
            return None
        return LagSummary(
            p50=self.percentile(0.5),
            p90=self.percentile(0.9),
            p99=self.percentile(0.99),
            max=self._max,
            results=self.count,
        )
