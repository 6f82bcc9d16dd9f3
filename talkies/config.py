"""Server settings, read once from ``TALKIES_*`` environment variables at start-up.

:meth:`Settings.from_env` is the only way the environment gets into the package: the caller
passes ``os.environ`` (tests pass a plain dict), and nothing else reads it. That keeps the
server's behaviour fixed for its lifetime and makes every configuration easy to test.

Validation collects every problem before failing, so an operator fixing a deployment sees
all mistakes at once instead of one per restart. Each message names the variable, the
offending value and what is allowed. The auth token is never echoed: it is excluded from
``repr()`` and no message quotes it (nor the value of any unknown ``TALKIES_*`` variable,
which could be a mistyped secret).

Conventions for the environment:

* Surrounding whitespace is trimmed (env files often carry trailing blanks), except for
  the auth token, which must not contain whitespace at all.
* An empty value means "unset": the default applies.
* Integers are plain decimal digits; no sign, exponent, ``_`` or hex.
* Durations are bare seconds (``30``, ``1.5``) or Go-style (``90s``, ``1h30m``, ``500ms``).
"""

from __future__ import annotations

import difflib
import os
import re
import unicodedata
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeGuard

from .protocol.messages import MODEL_SLUG

__all__ = ["ConfigError", "Settings", "parse_duration"]

# Streaming audio is 16 kHz, 16-bit mono PCM: this many bytes per second of buffer.
_PCM_BYTES_PER_SECOND = 16_000 * 2
_BUFFER_MAX_SECONDS = 300.0

# One slug syntax for the whole server: the one the start message is checked against.
_SLUG_RE = MODEL_SLUG
_SLUG_RULE = "1-128 characters from A-Z a-z 0-9 . _ -, starting with a letter or digit"
# [0-9] rather than \d: \d also matches non-ASCII digits, which int() would accept.
_INT_RE = re.compile(r"[0-9]+")
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_NUMBER_RE = re.compile(_NUMBER)
# Longer units first so "ms" is not read as "m" followed by a stray "s".
_UNIT = "(?:h|ms|m|s|us|\u00b5s|\u03bcs|ns)"
_DURATION_RE = re.compile(rf"(?:{_NUMBER}{_UNIT})+")
_DURATION_PAIR_RE = re.compile(rf"({_NUMBER})({_UNIT})")
_UNIT_SECONDS: Mapping[str, Fraction] = {
    "h": Fraction(3600),
    "m": Fraction(60),
    "s": Fraction(1),
    "ms": Fraction(1, 10**3),
    "us": Fraction(1, 10**6),
    "\u00b5s": Fraction(1, 10**6),  # MICRO SIGN, as Go accepts
    "\u03bcs": Fraction(1, 10**6),  # GREEK SMALL LETTER MU, as Go accepts
    "ns": Fraction(1, 10**9),
}
# Long enough for any sensible value; keeps Fraction/int away from pathological inputs.
_MAX_NUMERIC_TEXT = 64
_DURATION_EXAMPLES = "seconds like 30 or 1.5, or Go-style like 90s, 45m, 1h30m, 500ms"


class ConfigError(ValueError):
    """The configuration is invalid; ``problems`` lists every problem found, one per line."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__("\n".join(self.problems))

    def __reduce__(self) -> tuple[type[ConfigError], tuple[tuple[str, ...]]]:
        # The default would re-create the error from the joined message string.
        return (type(self), (self.problems,))


def parse_duration(text: str) -> float:
    """Parse bare seconds (``30``, ``1.5``) or a Go-style duration (``1h30m``) into seconds.

    Go units ``h``, ``m``, ``s``, ``ms``, ``us``/``µs`` and ``ns`` may be combined
    (``1h30m15s``) and take decimal numbers (``1.5h``). Signs, spaces, exponents, NaN and
    infinity are rejected with :class:`ValueError`.
    """
    if len(text) > _MAX_NUMERIC_TEXT:
        raise ValueError(f"duration is too long ({len(text)} characters)")
    if _NUMBER_RE.fullmatch(text):
        total = Fraction(text)
    elif _DURATION_RE.fullmatch(text):
        # Exact rational arithmetic, rounded once, so "1h30m" is exactly 5400.0.
        total = sum(
            (
                Fraction(number) * _UNIT_SECONDS[unit]
                for number, unit in _DURATION_PAIR_RE.findall(text)
            ),
            Fraction(0),
        )
    else:
        raise ValueError(f"invalid duration {text!r}: expected {_DURATION_EXAMPLES}")
    # At most 64 characters, so the value is far below float's range: no overflow here.
    return float(total)


def _format_seconds(seconds: float) -> str:
    """Render a bound for messages: 3600 -> "1h", 90 -> "1m30s", 0.5 -> "0.5s"."""
    if seconds != int(seconds) or seconds == 0:
        return f"{seconds:g}s"
    rest = int(seconds)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(hours, "h"), (minutes, "m"), (secs, "s")]
    return "".join(f"{amount}{unit}" for amount, unit in parts if amount)


def _has_space_or_control(text: str) -> bool:
    return any(ch.isspace() or unicodedata.category(ch).startswith("C") for ch in text)


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass, but True is never a sensible count or port.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _Invalid(ValueError):
    """Raised by variable parsers; carries one or more reasons (never the secret value)."""

    def __init__(self, *reasons: str) -> None:
        super().__init__(*reasons)
        self.reasons = reasons


@dataclass(frozen=True, slots=True)
class _Var:
    """One environment variable: how to parse its text and how to check a typed value.

    ``check`` is shared by :meth:`Settings.from_env` and :meth:`Settings._validate`, so
    values from the environment and values given in code obey exactly the same rules.
    """

    env: str
    field: str
    parse: Callable[[str], object]
    check: Callable[[object], list[str]]
    secret: bool = False


def _int_var(env: str, name: str, lo: int, hi: int) -> _Var:
    rule = f"must be an integer from {lo} to {hi}"

    def parse(text: str) -> object:
        if len(text) > _MAX_NUMERIC_TEXT or not _INT_RE.fullmatch(text):
            raise _Invalid(rule)
        return int(text)

    def check(value: object) -> list[str]:
        ok = _is_int(value) and lo <= value <= hi
        return [] if ok else [rule]

    return _Var(env, name, parse, check)


def _real_var(env: str, name: str, lo: float, hi: float) -> _Var:
    rule = f"must be a number from {lo:g} to {hi:g}"

    def parse(text: str) -> object:
        if len(text) > _MAX_NUMERIC_TEXT or not _NUMBER_RE.fullmatch(text):
            raise _Invalid(rule)
        return float(text)

    def check(value: object) -> list[str]:
        # Comparisons with NaN are false, so NaN fails the range test too.
        ok = _is_real(value) and lo <= value <= hi
        return [] if ok else [rule]

    return _Var(env, name, parse, check)


def _duration_var(env: str, name: str, lo: float, hi: float) -> _Var:
    rule = (
        f"must be a duration from {_format_seconds(lo)} to {_format_seconds(hi)} "
        f"({_DURATION_EXAMPLES})"
    )

    def parse(text: str) -> object:
        try:
            return parse_duration(text)
        except ValueError:
            raise _Invalid(rule) from None

    def check(value: object) -> list[str]:
        ok = _is_real(value) and lo <= value <= hi
        return [] if ok else [rule]

    return _Var(env, name, parse, check)


def _text(text: str) -> object:
    return text


def _path(text: str) -> object:
    return Path(text)


def _check_token(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, str):
        return ["must be a string or None"]
    if not value:
        return ["must not be empty (use None to disable authentication)"]
    if _has_space_or_control(value):
        return ["must not contain whitespace or control characters (value not shown)"]
    return []


_DEVICE_RE = re.compile(r"auto|cpu|cuda(?::(?:0|[1-9][0-9]{0,8}))?")


def _check_device(value: object) -> list[str]:
    if isinstance(value, str) and _DEVICE_RE.fullmatch(value):
        return []
    return ["must be one of auto, cpu, cuda, cuda:N (N = 0, 1, 2, ...)"]


def _switch(text: str) -> object:
    return {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}.get(
        text.strip().lower(), text
    )


def _check_switch(value: object) -> list[str]:
    return [] if isinstance(value, bool) else ["must be on or off"]


def _check_isolation(value: object) -> list[str]:
    if value in ("process", "thread"):
        return []
    return ["must be process or thread"]


def _check_path(value: object, *, optional: bool) -> list[str]:
    if value is None and optional:
        return []
    if not isinstance(value, Path):
        return ["must be a path" + (" or None" if optional else "")]
    if any(unicodedata.category(ch) == "Cc" for ch in str(value)):
        return ["must not contain control characters"]
    return []


def _check_models_file(value: object) -> list[str]:
    return _check_path(value, optional=True)


def _check_data_dir(value: object) -> list[str]:
    return _check_path(value, optional=False)


def _slug_problem(slug: str, position: int) -> str | None:
    if not slug:
        return f"item {position} is empty"
    if not _SLUG_RE.fullmatch(slug):
        return f"{slug!r} is not a valid model slug ({_SLUG_RULE})"
    return None


def _parse_enabled_models(text: str) -> object:
    # Empty items are kept so that the check can report them by position.
    return tuple(item.strip() for item in text.split(","))


def _check_enabled_models(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, tuple) or not all(isinstance(item, str) for item in value):
        return ["must be a tuple of model slugs or None"]
    if not value:
        return ["must list at least one model slug (leave it unset to enable all models)"]
    problems: list[str] = []
    seen: set[str] = set()
    for position, slug in enumerate(value, start=1):
        problem = _slug_problem(slug, position)
        if problem is not None:
            problems.append(problem)
        elif slug in seen:
            problems.append(f"{slug!r} is listed more than once")
        seen.add(slug)
    return problems


_CONCURRENCY_LO, _CONCURRENCY_HI = 1, 1024


def _concurrency_problem(slug: str, limit: object) -> str | None:
    if _is_int(limit) and _CONCURRENCY_LO <= limit <= _CONCURRENCY_HI:
        return None
    return (
        f"{slug!r}: concurrency {limit!r} must be an integer "
        f"from {_CONCURRENCY_LO} to {_CONCURRENCY_HI}"
    )


def _parse_model_concurrency(text: str) -> object:
    # Parsed here rather than in the check: duplicates vanish once the pairs are a dict.
    problems: list[str] = []
    limits: dict[str, int] = {}
    for position, raw_item in enumerate(text.split(","), start=1):
        item = raw_item.strip()
        if not item:
            problems.append(f"item {position} is empty")
            continue
        slug, equals, raw_limit = (part.strip() for part in item.partition("="))
        if not equals or not slug:
            problems.append(f"item {item!r} must look like slug=N")
            continue
        slug_problem = _slug_problem(slug, position)
        if slug_problem is not None:
            problems.append(slug_problem)
            continue
        if slug in limits:
            problems.append(f"{slug!r} is listed more than once")
            continue
        digits = len(raw_limit) <= _MAX_NUMERIC_TEXT and _INT_RE.fullmatch(raw_limit)
        limit = int(raw_limit) if digits else raw_limit
        limit_problem = _concurrency_problem(slug, limit)
        if limit_problem is not None:
            problems.append(limit_problem)
            continue
        limits[slug] = int(limit)
    if problems:
        raise _Invalid(*problems)
    return MappingProxyType(limits)


def _check_model_concurrency(value: object) -> list[str]:
    if not isinstance(value, Mapping):
        return ["must be a mapping of model slug to concurrency"]
    problems: list[str] = []
    for position, (slug, limit) in enumerate(value.items(), start=1):
        if not isinstance(slug, str):
            problems.append(f"key {slug!r} must be a model slug string")
            continue
        problem = _slug_problem(slug, position) or _concurrency_problem(slug, limit)
        if problem is not None:
            problems.append(problem)
    return problems


def _check_host(value: object) -> list[str]:
    if isinstance(value, str) and value and not _has_space_or_control(value):
        return []
    return ["must be a non-empty host name or IP address without whitespace"]


def wyoming_address(uri: str) -> tuple[str, int]:
    """(host, port) of a Wyoming server URI, ``tcp://HOST:PORT`` (an IPv6 host in brackets).

    Raises ValueError with the reason."""
    scheme, sep, rest = uri.partition("://")
    if scheme != "tcp" or not sep:
        raise ValueError("must be tcp://HOST:PORT (Wyoming over TCP, e.g. tcp://0.0.0.0:10300)")
    host, colon, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not colon or not host or _has_space_or_control(host) or "/" in host or "/" in port:
        raise ValueError("must be tcp://HOST:PORT (Wyoming over TCP, e.g. tcp://0.0.0.0:10300)")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError("must end with a port number from 0 to 65535")
    return host, int(port)


def _check_wyoming_uri(value: object) -> list[str]:
    if value is None:
        return []
    try:
        wyoming_address(str(value))
    except ValueError as exc:
        return [str(exc)]
    return []


def _check_zeroconf_name(value: object) -> list[str]:
    # A DNS-SD instance name is one DNS label: at most 63 bytes of UTF-8 (RFC 6763 section 4.1.1).
    if value is None:
        return []
    if not isinstance(value, str) or not value or len(value.encode()) > 63:
        return ["must be a service name of 1 to 63 bytes (UTF-8)"]
    if any(unicodedata.category(ch).startswith("C") for ch in value) or "." in value:
        return ["must be a service name without dots or control characters"]
    return []


_VARS: tuple[_Var, ...] = (
    _int_var("TALKIES_STREAM_MAX_CONNECTIONS", "stream_max_connections", 1, 1024),
    _int_var("TALKIES_STREAM_MAX_FRAME_BYTES", "stream_max_frame_bytes", 2, 16_777_216),
    _real_var(
        "TALKIES_STREAM_MAX_BUFFER_SECONDS", "stream_max_buffer_seconds", 0.1, _BUFFER_MAX_SECONDS
    ),
    _duration_var("TALKIES_STREAM_IDLE_TIMEOUT", "stream_idle_timeout", 1.0, 3600.0),
    # A WebSocket that has not sent a valid start this soon after its upgrade is closed
    # (4408); until its start is accepted it holds no stream slot.
    _duration_var("TALKIES_STREAM_START_TIMEOUT", "stream_start_timeout", 1.0, 3600.0),
    _duration_var("TALKIES_STREAM_MAX_DURATION", "stream_max_duration", 1.0, 86_400.0),
    # GET /v1/listen (Deepgram's live API): closed (4408) when neither audio nor KeepAlive
    # came for this long, as Deepgram's own service does after 10 s.
    _duration_var("TALKIES_DEEPGRAM_IDLE_TIMEOUT", "deepgram_idle_timeout", 1.0, 3600.0),
    # A model whose streams' decoders are further behind their audio than this refuses new
    # streams (4429) and /readyz says 503, until it has caught up to half of it; 0: never
    # (talkies/engines/runtime/lag.py). Above 80% of the stream buffer it is lowered to that.
    _duration_var("TALKIES_STREAM_MAX_LAG", "stream_max_lag", 0.0, 3600.0),
    # One decode call (accept/finish/decode_many) running longer fails its streams (4500).
    _duration_var("TALKIES_DECODE_TIMEOUT", "decode_timeout", 1.0, 3600.0),
    _Var("TALKIES_AUTH_TOKEN", "auth_token", _text, _check_token, secret=True),
    _Var("TALKIES_DEVICE", "device", _text, _check_device),
    # process: native engines run in a child process each (a crash there is a 4500, not
    # the server's end); thread: in the server's own process.
    _Var("TALKIES_ENGINE_ISOLATION", "engine_isolation", _text, _check_isolation),
    _Var("TALKIES_MODELS_FILE", "models_file", _path, _check_models_file),
    _Var("TALKIES_DATA_DIR", "data_dir", _path, _check_data_dir),
    _Var("TALKIES_ENABLED_MODELS", "enabled_models", _parse_enabled_models, _check_enabled_models),
    _int_var("TALKIES_MODEL_MAX_CONCURRENCY", "model_max_concurrency", 1, 1024),
    _Var(
        "TALKIES_MODEL_CONCURRENCY",
        "model_concurrency",
        _parse_model_concurrency,
        _check_model_concurrency,
    ),
    # 0 keeps idle models loaded; otherwise an unpinned model unused this long is unloaded.
    _duration_var("TALKIES_MODEL_TTL", "model_ttl", 0.0, 7 * 86_400.0),
    _int_var("TALKIES_QWEN3_STREAM_CHUNK_SIZE", "qwen3_stream_chunk_size", 1, 256),
    # Whisper's voice activity detector (docs/engines.md), for entries without options of
    # their own: on or off, the speech probability that starts an utterance, the quiet that
    # ends one, and the audio kept around the speech.
    _Var("TALKIES_VAD", "vad", _switch, _check_switch),
    _real_var("TALKIES_VAD_THRESHOLD", "vad_threshold", 0.05, 0.95),
    _duration_var("TALKIES_VAD_MIN_SILENCE", "vad_min_silence", 0.1, 10.0),
    _duration_var("TALKIES_VAD_SPEECH_PAD", "vad_speech_pad", 0.0, 2.0),
    # HTTP request bodies (uploads, staged files, MCP): refused with 413 past this size.
    _int_var("TALKIES_MAX_UPLOAD_BYTES", "max_upload_bytes", 1, 16 * 1024**3),
    # ... and with 408 when one is still arriving this long after its head (however it
    # trickles: the per-stall deadline alone let 1 byte every 5 s hold a request forever).
    _duration_var("TALKIES_UPLOAD_TIMEOUT", "upload_timeout", 1.0, 86_400.0),
    # File transcriptions (HTTP and MCP) decoding at once, server-wide; more wait their turn.
    _int_var("TALKIES_FILE_MAX_CONCURRENCY", "file_max_concurrency", 1, 1024),
    _Var("TALKIES_HOST", "host", _text, _check_host),
    _int_var("TALKIES_PORT", "port", 0, 65535),
    # The Wyoming server (Home Assistant), tcp://HOST:PORT; unset: none.
    _Var("TALKIES_WYOMING_URI", "wyoming_uri", _text, _check_wyoming_uri),
    # Advertise the Wyoming server over zeroconf (_wyoming._tcp.local.) under this name, so
    # Home Assistant discovers it; unset: not advertised.
    _Var("TALKIES_WYOMING_ZEROCONF", "wyoming_zeroconf", _text, _check_zeroconf_name),
)
_KNOWN_NAMES: tuple[str, ...] = tuple(var.env for var in _VARS)
_ENV_PREFIX = "TALKIES_"


def _buffer_problem(values: Mapping[str, object]) -> str | None:
    """The cross-field rule: the stream buffer must hold at least one maximum-size frame.

    Only called with values that passed their own checks; skipped when either is missing.
    """
    buffer = values.get("stream_max_buffer_seconds")
    frame = values.get("stream_max_frame_bytes")
    if not _is_real(buffer) or not _is_int(frame):
        return None
    # Decimal of the shortest repr: exactly the number the user wrote, so the documented
    # minimum (frame / 32000, e.g. 2.048 for 65536) passes despite binary rounding.
    seconds = Decimal(repr(float(buffer)))
    capacity = seconds * _PCM_BYTES_PER_SECOND
    if capacity >= frame:
        return None
    needed = Decimal(frame) / _PCM_BYTES_PER_SECOND
    fixes = [f"lower the frame limit to at most {int(capacity)}"]
    if needed <= Decimal(repr(_BUFFER_MAX_SECONDS)):
        fixes.insert(0, f"raise the buffer to at least {needed.normalize():f} s")
    return (
        f"TALKIES_STREAM_MAX_BUFFER_SECONDS={seconds:f} holds {capacity.normalize():f} bytes "
        f"of 16 kHz 16-bit audio, less than TALKIES_STREAM_MAX_FRAME_BYTES={frame}: "
        f"buffer seconds * 32000 must be at least the max frame bytes ({' or '.join(fixes)})"
    )


def _unknown_problems(environ: Mapping[str, str]) -> list[str]:
    # Case-insensitive prefix: "Talkies_port" is as likely a typo as "TALKIES_PROT".
    # Values are never shown: a mistyped TALKIES_AUTH_TOKEN would otherwise leak.
    problems: list[str] = []
    known = ", ".join(_KNOWN_NAMES)
    for name in sorted(environ):
        if not name.upper().startswith(_ENV_PREFIX) or name in _KNOWN_NAMES:
            continue
        matches = difflib.get_close_matches(name.upper(), _KNOWN_NAMES, n=1, cutoff=0.6)
        hint = f"; did you mean {matches[0]}?" if matches else ""
        problems.append(f"{name}: unknown setting{hint} (known: {known})")
    return problems


def _home_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "talkies"


def _default_data_dir(environ: Mapping[str, str]) -> Path:
    # XDG Base Directory spec: a relative $XDG_DATA_HOME is invalid and must be ignored.
    xdg = environ.get("XDG_DATA_HOME", "").strip()
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "talkies"
    home = environ.get("HOME", "").strip()
    if home:
        return Path(home) / ".local" / "share" / "talkies"
    return _home_data_dir()


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, where the system has one)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def _rebuild_settings(kwargs: dict[str, Any]) -> Settings:
    return Settings(**kwargs)


@dataclass(frozen=True, kw_only=True, slots=True)
class Settings:
    """Validated, immutable server settings; see the module docstring for the sources.

    Constructing one directly (``Settings(port=0)``) or via :meth:`with_overrides` runs
    the same validation as :meth:`from_env` and raises :class:`ConfigError`.
    """

    stream_max_connections: int = 4
    stream_max_frame_bytes: int = 65536
    stream_max_buffer_seconds: float = 5.0
    stream_idle_timeout: float = 30.0
    stream_start_timeout: float = 5.0
    stream_max_duration: float = 14_400.0
    stream_max_lag: float = 3.0
    deepgram_idle_timeout: float = 10.0
    decode_timeout: float = 30.0
    # repr=False: the token must never reach logs via repr() of the settings.
    auth_token: str | None = field(default=None, repr=False)
    device: str = "auto"
    engine_isolation: str = "process"
    models_file: Path | None = None
    data_dir: Path = field(default_factory=_home_data_dir)
    # None means every model in the registry is enabled.
    enabled_models: tuple[str, ...] | None = None
    model_max_concurrency: int = 1
    # Read-only per-model overrides of model_max_concurrency. MappingProxyType is not
    # hashable, so it is left out of __hash__ (it still takes part in ==).
    model_concurrency: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({}), hash=False
    )
    model_ttl: float = 0.0
    qwen3_stream_chunk_size: int = 8
    vad: bool = True
    vad_threshold: float = 0.5
    vad_min_silence: float = 0.6
    vad_speech_pad: float = 0.3
    max_upload_bytes: int = 100 * 1024 * 1024
    upload_timeout: float = 600.0
    file_max_concurrency: int = field(default_factory=_usable_cpus)
    host: str = "127.0.0.1"
    port: int = 8000
    wyoming_uri: str | None = None
    wyoming_zeroconf: str | None = None

    def __post_init__(self) -> None:
        self._normalize()
        self._validate()

    def _normalize(self) -> None:
        """Coerce harmless in-code spellings (``30`` for ``30.0``, a dict, a str path)."""
        for name in (
            "stream_max_buffer_seconds",
            "stream_idle_timeout",
            "stream_start_timeout",
            "stream_max_duration",
            "stream_max_lag",
            "deepgram_idle_timeout",
            "decode_timeout",
            "model_ttl",
            "upload_timeout",
            "vad_threshold",
            "vad_min_silence",
            "vad_speech_pad",
        ):
            value = getattr(self, name)
            if _is_int(value):
                object.__setattr__(self, name, float(value))
        for name in ("models_file", "data_dir"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, Path(value))
        if isinstance(self.enabled_models, list):
            object.__setattr__(self, "enabled_models", tuple(self.enabled_models))
        if isinstance(self.model_concurrency, Mapping):
            # Copy, so later changes to the caller's dict cannot reach the settings.
            object.__setattr__(
                self, "model_concurrency", MappingProxyType(dict(self.model_concurrency))
            )

    def _validate(self) -> None:
        """Check every field with the same rules as from_env; raise one ConfigError."""
        problems: list[str] = []
        valid: dict[str, object] = {}
        for var in _VARS:
            value = getattr(self, var.field)
            shown = "" if var.secret else f"={value!r}"
            label = f"{var.field}{shown} ({var.env})"
            reasons = var.check(value)
            problems.extend(f"{label}: {reason}" for reason in reasons)
            if not reasons:
                valid[var.field] = value
        buffer_problem = _buffer_problem(valid)
        if buffer_problem is not None:
            problems.append(buffer_problem)
        if problems:
            raise ConfigError(problems)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        """Build settings from ``environ`` (pass ``os.environ``), reporting all problems.

        Raises :class:`ConfigError` listing every invalid or unknown ``TALKIES_*`` variable.
        """
        values: dict[str, Any] = {"data_dir": _default_data_dir(environ)}
        problems: list[str] = []
        failed: set[str] = set()
        for var in _VARS:
            raw = environ.get(var.env)
            if raw is None:
                continue
            # The token is not trimmed: stray whitespace in it is reported, not hidden.
            text = raw if var.secret else raw.strip()
            if not text:
                continue  # empty means unset: the default applies
            label = var.env if var.secret else f"{var.env}={raw!r}"
            try:
                value = var.parse(text)
            except _Invalid as exc:
                problems.extend(f"{label}: {reason}" for reason in exc.reasons)
                failed.add(var.field)
                continue
            reasons = var.check(value)
            if reasons:
                problems.extend(f"{label}: {reason}" for reason in reasons)
                failed.add(var.field)
                continue
            values[var.field] = value
        # The cross-field rule only makes sense once both inputs are individually valid.
        if not failed & {"stream_max_buffer_seconds", "stream_max_frame_bytes"}:
            defaults = {f.name: f.default for f in fields(cls)}  # MISSING for factories
            buffer_problem = _buffer_problem({**defaults, **values})
            if buffer_problem is not None:
                problems.append(buffer_problem)
        problems.extend(_unknown_problems(environ))
        if problems:
            raise ConfigError(problems)
        return cls(**values)

    def with_overrides(self, **changes: Any) -> Settings:
        """Return a copy with ``changes`` applied, validated like :meth:`from_env`."""
        # replace() goes through __init__, hence __post_init__ and _validate.
        return replace(self, **changes)

    def max_lag_for(self, entry_max_lag: float | None) -> float:
        """The lag bound of a model whose entry says ``entry_max_lag`` (None: this server's
        TALKIES_STREAM_MAX_LAG), at most 80% of the stream buffer: past the buffer the client
        is held by backpressure, and the lag is no longer the server's to see. 0: never."""
        bound = self.stream_max_lag if entry_max_lag is None else entry_max_lag
        return min(bound, 0.8 * self.stream_max_buffer_seconds)

    def concurrency_for(self, slug: str) -> int:
        """How many requests model ``slug`` may serve at once."""
        return self.model_concurrency.get(slug, self.model_max_concurrency)

    def __reduce__(self) -> tuple[Callable[[dict[str, Any]], Settings], tuple[dict[str, Any]]]:
        # MappingProxyType cannot be pickled or deep-copied; rebuild (and re-validate)
        # from plain keyword arguments instead.
        kwargs = {f.name: getattr(self, f.name) for f in fields(self)}
        kwargs["model_concurrency"] = dict(self.model_concurrency)
        return (_rebuild_settings, (kwargs,))
