"""Checks for a registry entry's numeric ``options``, shared by the engines that take them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["int_option", "number_option"]


def int_option(options: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    """An integer model option in [low, high]; ValueError naming it otherwise."""
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"option {key!r} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"option {key!r} must be from {low} to {high}, got {value!r}")
    return value


def number_option(
    options: Mapping[str, Any], key: str, default: float, low: float, high: float
) -> float:
    """A finite number option in [low, high], as a float; ValueError naming it otherwise."""
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"option {key!r} must be a number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"option {key!r} must be from {low:g} to {high:g}, got {value!r}")
    return float(value)
