"""Tests for talkies.config: environment parsing, validation messages and the token's secrecy."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
from pathlib import Path
from types import MappingProxyType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from talkies.config import ConfigError, Settings, parse_duration

HOME = {"HOME": "/home/talker"}
TOKEN = "s3cr3t-T0KEN-value"


def from_env(**env: str) -> Settings:
    return Settings.from_env({**HOME, **env})


def problems(**env: str) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        from_env(**env)
    return info.value.problems


# --- defaults ---------------------------------------------------------------------------


def test_defaults() -> None:
    s = Settings()
    assert s.stream_max_connections == 4
    assert s.stream_max_frame_bytes == 65536
    assert s.stream_max_buffer_seconds == 5.0
    assert s.stream_idle_timeout == 30.0
    assert s.stream_start_timeout == 5.0
    assert s.stream_max_duration == 14_400.0
    assert s.auth_token is None
    assert s.device == "auto"
    assert s.models_file is None
    assert s.data_dir == Path.home() / ".local" / "share" / "talkies"
    assert s.enabled_models is None
    assert s.model_max_concurrency == 1
    assert dict(s.model_concurrency) == {}
    assert s.qwen3_stream_chunk_size == 8
    assert s.host == "127.0.0.1"
    assert s.port == 8000


def test_empty_environment_gives_defaults() -> None:
    expected = Settings(data_dir=Path("/home/talker/.local/share/talkies"))
    assert from_env() == expected


def test_unrelated_variables_are_ignored() -> None:
    assert from_env(PATH="/bin", LANG="C", TALKIESX="1") == from_env()


def test_empty_values_mean_unset() -> None:
    env = dict.fromkeys(_ALL_NAMES, "")
    assert from_env(**env) == from_env()


def test_whitespace_only_values_mean_unset() -> None:
    env = {name: "  " for name in _ALL_NAMES if name != "TALKIES_AUTH_TOKEN"}
    assert from_env(**env) == from_env()


def test_settings_are_frozen_and_hashable() -> None:
    s = from_env(TALKIES_MODEL_CONCURRENCY="a=2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.port = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.model_concurrency["a"] = 3  # type: ignore[index]
    assert hash(s) == hash(from_env(TALKIES_MODEL_CONCURRENCY="a=2"))
    assert s != from_env(TALKIES_MODEL_CONCURRENCY="a=3")


def test_pickle_and_deepcopy_round_trip() -> None:
    s = from_env(TALKIES_MODEL_CONCURRENCY="a=2", TALKIES_AUTH_TOKEN=TOKEN)
    assert pickle.loads(pickle.dumps(s)) == s
    assert copy.deepcopy(s) == s
    assert copy.copy(s) == s


def test_config_error_pickles_with_its_problems() -> None:
    err = ConfigError(["one", "two"])
    again = pickle.loads(pickle.dumps(err))
    assert again.problems == ("one", "two")
    assert str(again) == "one\ntwo"
    assert isinstance(again, ValueError)


# --- data dir ---------------------------------------------------------------------------


def test_data_dir_from_xdg_data_home() -> None:
    s = Settings.from_env({"XDG_DATA_HOME": "/xdg", "HOME": "/home/x"})
    assert s.data_dir == Path("/xdg/talkies")


def test_data_dir_ignores_relative_xdg_data_home() -> None:
    s = Settings.from_env({"XDG_DATA_HOME": "rel/dir", "HOME": "/home/x"})
    assert s.data_dir == Path("/home/x/.local/share/talkies")


def test_data_dir_from_home() -> None:
    assert Settings.from_env({"HOME": "/home/x"}).data_dir == Path("/home/x/.local/share/talkies")


def test_data_dir_falls_back_to_path_home() -> None:
    assert Settings.from_env({}).data_dir == Path.home() / ".local" / "share" / "talkies"


def test_data_dir_explicit_wins() -> None:
    s = Settings.from_env({"TALKIES_DATA_DIR": " /srv/talkies ", "XDG_DATA_HOME": "/xdg"})
    assert s.data_dir == Path("/srv/talkies")


def test_data_dir_rejects_control_characters() -> None:
    assert problems(TALKIES_DATA_DIR="/srv/\x01x") == (
        "TALKIES_DATA_DIR='/srv/\\x01x': must not contain control characters",
    )


# --- integers ---------------------------------------------------------------------------

INT_VARS = [
    ("TALKIES_STREAM_MAX_CONNECTIONS", "stream_max_connections", 1, 1024),
    ("TALKIES_STREAM_MAX_FRAME_BYTES", "stream_max_frame_bytes", 2, 16_777_216),
    ("TALKIES_MODEL_MAX_CONCURRENCY", "model_max_concurrency", 1, 1024),
    ("TALKIES_QWEN3_STREAM_CHUNK_SIZE", "qwen3_stream_chunk_size", 1, 256),
    ("TALKIES_MAX_UPLOAD_BYTES", "max_upload_bytes", 1, 16 * 1024**3),
    ("TALKIES_FILE_MAX_CONCURRENCY", "file_max_concurrency", 1, 1024),
    ("TALKIES_PORT", "port", 0, 65535),
]


# The largest buffer (300 s) holds 9_600_000 bytes, so by the cross-field rule that is the
# largest max frame actually usable, below the variable's own range limit of 16 MiB.
_LARGEST_USABLE_FRAME = 300 * 32000


def _int_env(env: str, value: str) -> dict[str, str]:
    # A large max frame needs a buffer that can hold it (the cross-field rule).
    extra = {"TALKIES_STREAM_MAX_BUFFER_SECONDS": "300"} if env.endswith("FRAME_BYTES") else {}
    return {env: value, **extra}


@pytest.mark.parametrize(("env", "name", "lo", "hi"), INT_VARS)
def test_int_boundaries_accepted(env: str, name: str, lo: int, hi: int) -> None:
    hi = min(hi, _LARGEST_USABLE_FRAME)
    for value in (lo, lo + 1, hi - 1, hi):
        assert getattr(from_env(**_int_env(env, str(value))), name) == value
    assert getattr(from_env(**_int_env(env, f" {hi}\t")), name) == hi


def test_frame_range_maximum_only_fails_the_cross_field_rule() -> None:
    # 16 MiB is inside TALKIES_STREAM_MAX_FRAME_BYTES's own range: the only complaint is
    # that no allowed buffer can hold it.
    (problem,) = problems(**_int_env("TALKIES_STREAM_MAX_FRAME_BYTES", "16777216"))
    assert problem.startswith("TALKIES_STREAM_MAX_BUFFER_SECONDS=300.0 holds 9600000 bytes")


@pytest.mark.parametrize(("env", "name", "lo", "hi"), INT_VARS)
def test_int_out_of_range_rejected(env: str, name: str, lo: int, hi: int) -> None:
    for value in (str(lo - 1), str(hi + 1)):
        assert problems(**_int_env(env, value)) == (
            f"{env}={value!r}: must be an integer from {lo} to {hi}",
        )


@pytest.mark.parametrize(("env", "name", "lo", "hi"), INT_VARS)
@pytest.mark.parametrize(
    "value", ["1.0", "1e3", "0x10", "+5", "-1", "abc", "1_000", "1 0", "\u0663", "9" * 100]
)
def test_int_syntax_rejected(env: str, name: str, lo: int, hi: int, value: str) -> None:
    assert problems(**{env: value}) == (f"{env}={value!r}: must be an integer from {lo} to {hi}",)


# --- stream buffer seconds (plain number) -----------------------------------------------

BUFFER = "TALKIES_STREAM_MAX_BUFFER_SECONDS"
FRAME = "TALKIES_STREAM_MAX_FRAME_BYTES"
BUFFER_RULE = "must be a number from 0.1 to 300"


@pytest.mark.parametrize(
    ("text", "expected"), [("0.1", 0.1), ("300", 300.0), ("2.5", 2.5), (".5", 0.5), (" 7 ", 7.0)]
)
def test_buffer_seconds_accepted(text: str, expected: float) -> None:
    # A small frame limit keeps the cross-field rule out of the way of the minimum.
    s = from_env(**{BUFFER: text, FRAME: "2"})
    assert s.stream_max_buffer_seconds == expected


@pytest.mark.parametrize(
    "text", ["0.09", "0", "300.1", "301", "nan", "inf", "1e2", "-1", "+1", "abc", "5s", "1,5"]
)
def test_buffer_seconds_rejected(text: str) -> None:
    assert problems(**{BUFFER: text, FRAME: "2"}) == (f"{BUFFER}={text!r}: {BUFFER_RULE}",)


# --- cross-field buffer rule ------------------------------------------------------------


def test_buffer_must_hold_a_max_frame() -> None:
    (problem,) = problems(**{BUFFER: "1", FRAME: "65536"})
    assert BUFFER in problem
    assert FRAME in problem
    assert "65536" in problem
    assert "32000 bytes" in problem
    assert "at least 2.048 s" in problem
    assert "at most 32000" in problem


def test_buffer_rule_exact_boundary() -> None:
    assert from_env(**{BUFFER: "2.048", FRAME: "65536"}).stream_max_buffer_seconds == 2.048
    assert len(problems(**{BUFFER: "2.047", FRAME: "65536"})) == 1
    assert from_env(**{BUFFER: "0.1", FRAME: "3200"}).stream_max_frame_bytes == 3200
    assert len(problems(**{BUFFER: "0.1", FRAME: "3201"})) == 1


def test_buffer_rule_uses_defaults_for_unset_side() -> None:
    # Default buffer 5 s holds 160000 bytes; default frame 65536 needs 2.048 s.
    assert len(problems(**{FRAME: "160001"})) == 1
    assert from_env(**{FRAME: "160000"}).stream_max_frame_bytes == 160000
    assert len(problems(**{BUFFER: "2"})) == 1


def test_buffer_rule_does_not_suggest_an_impossible_buffer() -> None:
    (problem,) = problems(**{BUFFER: "300", FRAME: "16777216"})
    assert "raise the buffer" not in problem
    assert "at most 9600000" in problem


def test_buffer_rule_skipped_when_a_side_is_invalid() -> None:
    assert problems(**{BUFFER: "0.05", FRAME: "65536"}) == (f"{BUFFER}='0.05': {BUFFER_RULE}",)
    assert len(problems(**{BUFFER: "1", FRAME: "x"})) == 1


# --- durations --------------------------------------------------------------------------

IDLE = "TALKIES_STREAM_IDLE_TIMEOUT"
START = "TALKIES_STREAM_START_TIMEOUT"
MAXDUR = "TALKIES_STREAM_MAX_DURATION"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 30.0),
        ("1.5", 1.5),
        ("0", 0.0),
        (".5", 0.5),
        ("1.", 1.0),
        ("90s", 90.0),
        ("45m", 2700.0),
        ("4h", 14_400.0),
        ("1h30m", 5400.0),
        ("1h30m15s", 5415.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        ("250us", 0.00025),
        ("250\u00b5s", 0.00025),
        ("250\u03bcs", 0.00025),
        ("1000000000ns", 1.0),
        ("1m500ms", 60.5),
        ("2h0m0s", 7200.0),
        ("0.1s", 0.1),
        ("24h", 86_400.0),
    ],
)
def test_parse_duration_accepts(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "-1s",
        "+1s",
        "-1",
        "1x",
        "h",
        "s",
        "1h 30m",
        " 30",
        "30 ",
        "nan",
        "inf",
        "NaN",
        "1e3",
        "1e3s",
        "1H",
        "1.5.5s",
        ".s",
        "1h-30m",
        "1d",
        "\u0663s",
        "1" * 200 + "h",
    ],
)
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_parse_duration_rejects_overlong_text() -> None:
    assert parse_duration("9" * 63 + "h") == float(int("9" * 63) * 3600)
    with pytest.raises(ValueError, match="too long"):
        parse_duration("9" * 64 + "h")


IDLE_RULE = "must be a duration from 1s to 1h (seconds like 30 or 1.5, or Go-style like "
MAXDUR_RULE = "must be a duration from 1s to 24h (seconds like 30 or 1.5, or Go-style like "


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1", 1.0), ("1s", 1.0), ("1000ms", 1.0), ("3600", 3600.0), ("1h", 3600.0), ("60m", 3600.0)],
)
def test_idle_timeout_accepted(text: str, seconds: float) -> None:
    assert from_env(**{IDLE: text}).stream_idle_timeout == seconds


@pytest.mark.parametrize("text", ["0.999", "999ms", "0", "3601", "1h1s", "1h0.001s", "-5", "x"])
def test_idle_timeout_rejected(text: str) -> None:
    (problem,) = problems(**{IDLE: text})
    assert problem.startswith(f"{IDLE}={text!r}: {IDLE_RULE}")


@pytest.mark.parametrize(
    ("text", "seconds"), [("1", 1.0), ("2.5s", 2.5), ("10s", 10.0), ("1h", 3600.0)]
)
def test_start_timeout_accepted(text: str, seconds: float) -> None:
    assert from_env(**{START: text}).stream_start_timeout == seconds


@pytest.mark.parametrize("text", ["0", "500ms", "0.999", "1h1s", "-5", "5x"])
def test_start_timeout_rejected(text: str) -> None:
    (problem,) = problems(**{START: text})
    assert problem.startswith(f"{START}={text!r}: {IDLE_RULE}")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("4h", 14_400.0), ("24h", 86_400.0), ("1440m", 86_400.0), ("86400", 86_400.0)],
)
def test_max_duration_accepted(text: str, seconds: float) -> None:
    assert from_env(**{MAXDUR: text}).stream_max_duration == seconds


@pytest.mark.parametrize("text", ["0.5s", "999999us", "24h1s", "24h1ns", "25h", "86401", "inf"])
def test_max_duration_rejected(text: str) -> None:
    (problem,) = problems(**{MAXDUR: text})
    assert problem.startswith(f"{MAXDUR}={text!r}: {MAXDUR_RULE}")


def format_go(hours: int, minutes: int, seconds: int, millis: int) -> str:
    """Go's time.Duration.String() shape for whole units: 1h2m3.004s, 500ms, 0s."""
    parts = []
    if hours:
        parts.append(f"{hours}h")
    if minutes:
        parts.append(f"{minutes}m")
    if seconds and millis:
        parts.append(f"{seconds}.{millis:03d}s")
    elif seconds:
        parts.append(f"{seconds}s")
    elif millis:
        parts.append(f"{millis}ms")
    return "".join(parts) or "0s"


@given(
    st.integers(0, 10_000),
    st.integers(0, 59),
    st.integers(0, 59),
    st.integers(0, 999),
)
def test_parse_duration_round_trips_go_format(
    hours: int, minutes: int, seconds: int, millis: int
) -> None:
    text = format_go(hours, minutes, seconds, millis)
    total_ms = ((hours * 60 + minutes) * 60 + seconds) * 1000 + millis
    # int / int is correctly rounded, as is the parser's exact rational arithmetic.
    assert parse_duration(text) == total_ms / 1000


@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_parse_duration_unordered_units_sum(a: int, b: int) -> None:
    assert parse_duration(f"{a}s{b}m") == a + b * 60


@given(st.text(max_size=30))
def test_parse_duration_only_raises_value_error(text: str) -> None:
    try:
        value = parse_duration(text)
    except ValueError:
        return
    assert math.isfinite(value)
    assert value >= 0


# --- auth token -------------------------------------------------------------------------


def test_token_unset_and_empty_are_none() -> None:
    assert from_env().auth_token is None
    assert from_env(TALKIES_AUTH_TOKEN="").auth_token is None


def test_token_is_kept_verbatim_and_hidden_from_repr() -> None:
    s = from_env(TALKIES_AUTH_TOKEN=TOKEN)
    assert s.auth_token == TOKEN
    assert TOKEN not in repr(s)
    assert TOKEN not in str(s)
    assert "auth_token" not in repr(s)


@pytest.mark.parametrize(
    "token",
    [f"{TOKEN} ", f" {TOKEN}", f"{TOKEN}\n", f"a b{TOKEN}", f"{TOKEN}\x00", "\u200b" + TOKEN],
)
def test_bad_token_is_reported_without_its_value(token: str) -> None:
    (problem,) = problems(TALKIES_AUTH_TOKEN=token)
    assert problem == (
        "TALKIES_AUTH_TOKEN: must not contain whitespace or control characters (value not shown)"
    )
    assert TOKEN not in problem


def test_token_never_in_any_error_message() -> None:
    env = {
        "TALKIES_AUTH_TOKEN": f"{TOKEN}\t",
        "TALKIES_AUTH_TOKN": TOKEN,  # a typo'd variable holding the secret
        "TALKIES_PORT": "nope",
        "TALKIES_STREAM_MAX_BUFFER_SECONDS": "1",
    }
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert len(info.value.problems) == 4
    assert TOKEN not in str(info.value)
    assert TOKEN not in repr(info.value)
    assert all(TOKEN not in p for p in info.value.problems)


def test_token_not_in_override_errors() -> None:
    with pytest.raises(ConfigError) as info:
        Settings().with_overrides(auth_token=f"{TOKEN} x", port=-1)
    assert TOKEN not in str(info.value)
    assert info.value.problems[0].startswith("auth_token (TALKIES_AUTH_TOKEN): ")


# --- device -----------------------------------------------------------------------------


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:1", "cuda:12"])
def test_device_accepted(device: str) -> None:
    assert from_env(TALKIES_DEVICE=f" {device} ").device == device


@pytest.mark.parametrize(
    "device", ["gpu", "CUDA", "Auto", "cuda:", "cuda:-1", "cuda:01", "cuda:1.0", "mps", "cuda 0"]
)
def test_device_rejected(device: str) -> None:
    assert problems(TALKIES_DEVICE=device) == (
        f"TALKIES_DEVICE={device!r}: must be one of auto, cpu, cuda, cuda:N (N = 0, 1, 2, ...)",
    )


# --- models file ------------------------------------------------------------------------


def test_models_file_parsed_without_existence_check() -> None:
    assert from_env().models_file is None
    assert from_env(TALKIES_MODELS_FILE=" ").models_file is None
    assert from_env(TALKIES_MODELS_FILE="/no/such/models.toml").models_file == Path(
        "/no/such/models.toml"
    )
    assert from_env(TALKIES_MODELS_FILE="models.toml").models_file == Path("models.toml")


# --- enabled models ---------------------------------------------------------------------

ENABLED = "TALKIES_ENABLED_MODELS"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("whisper-base", ("whisper-base",)),
        (" a , b.c ,d_e ", ("a", "b.c", "d_e")),
        ("A1,0x", ("A1", "0x")),
        ("x" * 128, ("x" * 128,)),
    ],
)
def test_enabled_models_accepted(text: str, expected: tuple[str, ...]) -> None:
    assert from_env(**{ENABLED: text}).enabled_models == expected


def test_enabled_models_unset_means_all() -> None:
    assert from_env().enabled_models is None
    assert from_env(**{ENABLED: ""}).enabled_models is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a,,b", "item 2 is empty"),
        ("a,", "item 2 is empty"),
        (",a", "item 1 is empty"),
        ("a,a", "'a' is listed more than once"),
        ("-a", "'-a' is not a valid model slug"),
        (".a", "'.a' is not a valid model slug"),
        ("a b", "'a b' is not a valid model slug"),
        ("a/b", "'a/b' is not a valid model slug"),
        ("x" * 129, f"{'x' * 129!r} is not a valid model slug"),
    ],
)
def test_enabled_models_rejected(text: str, reason: str) -> None:
    (problem,) = problems(**{ENABLED: text})
    assert problem.startswith(f"{ENABLED}={text!r}: {reason}")


def test_enabled_models_reports_every_bad_item() -> None:
    assert len(problems(**{ENABLED: "a,,a,-b"})) == 3


# --- model concurrency ------------------------------------------------------------------

CONC = "TALKIES_MODEL_CONCURRENCY"


def test_model_concurrency_overrides() -> None:
    s = from_env(
        **{CONC: " qwen3-tts = 2 , whisper.base=1024,k=1", "TALKIES_MODEL_MAX_CONCURRENCY": "3"}
    )
    assert dict(s.model_concurrency) == {"qwen3-tts": 2, "whisper.base": 1024, "k": 1}
    assert isinstance(s.model_concurrency, MappingProxyType)
    assert s.concurrency_for("qwen3-tts") == 2
    assert s.concurrency_for("whisper.base") == 1024
    assert s.concurrency_for("other") == 3


def test_model_concurrency_default_is_empty() -> None:
    s = from_env()
    assert dict(s.model_concurrency) == {}
    assert s.concurrency_for("anything") == 1


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("a", "item 'a' must look like slug=N"),
        ("=3", "item '=3' must look like slug=N"),
        ("a=0", "'a': concurrency 0 must be an integer from 1 to 1024"),
        ("a=1025", "'a': concurrency 1025 must be an integer from 1 to 1024"),
        ("a=x", "'a': concurrency 'x' must be an integer from 1 to 1024"),
        ("a=", "'a': concurrency '' must be an integer from 1 to 1024"),
        ("a=1.5", "'a': concurrency '1.5' must be an integer from 1 to 1024"),
        ("a=1,a=2", "'a' is listed more than once"),
        ("a=1,,b=2", "item 2 is empty"),
        ("-a=1", "'-a' is not a valid model slug"),
    ],
)
def test_model_concurrency_rejected(text: str, reason: str) -> None:
    (problem,) = problems(**{CONC: text})
    assert problem.startswith(f"{CONC}={text!r}: {reason}")


def test_model_concurrency_reports_every_bad_item() -> None:
    assert len(problems(**{CONC: "a=0,b,a=2,c=x,,d=5"})) == 4


# --- host -------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::1", "localhost", "talkies.internal"])
def test_host_accepted(host: str) -> None:
    assert from_env(TALKIES_HOST=f" {host} ").host == host


@pytest.mark.parametrize("host", ["my host", "a\tb", "a\x00b"])
def test_host_rejected(host: str) -> None:
    assert problems(TALKIES_HOST=host) == (
        f"TALKIES_HOST={host!r}: must be a non-empty host name or IP address without whitespace",
    )


# --- uploads ------------------------------------------------------------------------------


def test_upload_timeout_is_a_duration_of_a_second_to_a_day() -> None:
    assert from_env().upload_timeout == 600.0  # 10 minutes
    assert from_env(TALKIES_UPLOAD_TIMEOUT="15m").upload_timeout == 900.0
    assert from_env(TALKIES_UPLOAD_TIMEOUT="24h").upload_timeout == 86_400.0
    for bad in ("0.5", "25h", "soon"):
        (problem,) = problems(TALKIES_UPLOAD_TIMEOUT=bad)
        assert problem.startswith(f"TALKIES_UPLOAD_TIMEOUT={bad!r}: must be a duration from 1s")


def test_file_decodes_default_to_the_cpus_this_process_may_use() -> None:
    import os

    assert from_env().file_max_concurrency == len(os.sched_getaffinity(0))


# --- unknown variables ------------------------------------------------------------------

_ALL_NAMES = [
    "TALKIES_STREAM_MAX_CONNECTIONS",
    "TALKIES_STREAM_MAX_FRAME_BYTES",
    "TALKIES_STREAM_MAX_BUFFER_SECONDS",
    "TALKIES_STREAM_IDLE_TIMEOUT",
    "TALKIES_STREAM_START_TIMEOUT",
    "TALKIES_STREAM_MAX_DURATION",
    "TALKIES_DECODE_TIMEOUT",
    "TALKIES_AUTH_TOKEN",
    "TALKIES_DEVICE",
    "TALKIES_ENGINE_ISOLATION",
    "TALKIES_MODELS_FILE",
    "TALKIES_DATA_DIR",
    "TALKIES_ENABLED_MODELS",
    "TALKIES_MODEL_MAX_CONCURRENCY",
    "TALKIES_MODEL_CONCURRENCY",
    "TALKIES_QWEN3_STREAM_CHUNK_SIZE",
    "TALKIES_MAX_UPLOAD_BYTES",
    "TALKIES_UPLOAD_TIMEOUT",
    "TALKIES_FILE_MAX_CONCURRENCY",
    "TALKIES_HOST",
    "TALKIES_PORT",
]


def test_unknown_variable_with_suggestion() -> None:
    (problem,) = problems(TALKIES_STREAM_MAX_CONECTIONS="4")
    assert problem.startswith(
        "TALKIES_STREAM_MAX_CONECTIONS: unknown setting; "
        "did you mean TALKIES_STREAM_MAX_CONNECTIONS? (known: "
    )
    for name in _ALL_NAMES:
        assert name in problem


def test_unknown_variable_wrong_case_is_caught() -> None:
    (problem,) = problems(talkies_port="1")
    assert problem.startswith("talkies_port: unknown setting; did you mean TALKIES_PORT?")


def test_unknown_variable_without_close_match() -> None:
    (problem,) = problems(TALKIES_ZZZZZZZZ="1")
    assert problem.startswith("TALKIES_ZZZZZZZZ: unknown setting (known: ")
    assert "did you mean" not in problem


def test_unknown_variable_value_is_not_shown() -> None:
    (problem,) = problems(TALKIES_PROT="very-distinctive-value")
    assert "very-distinctive-value" not in problem


# --- several problems at once -----------------------------------------------------------


def test_all_problems_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        from_env(
            TALKIES_STREAM_MAX_CONNECTIONS="0",
            TALKIES_STREAM_IDLE_TIMEOUT="2h",
            TALKIES_DEVICE="gpu",
            TALKIES_PORT="70000",
            TALKIES_STREAM_MAX_BUFFER_SECONDS="1",
            TALKIES_HSOT="x",
        )
    found = info.value.problems
    assert len(found) == 6
    assert found[0] == "TALKIES_STREAM_MAX_CONNECTIONS='0': must be an integer from 1 to 1024"
    assert found[1].startswith("TALKIES_STREAM_IDLE_TIMEOUT='2h': must be a duration")
    assert found[2].startswith("TALKIES_DEVICE='gpu': ")
    assert found[3] == "TALKIES_PORT='70000': must be an integer from 0 to 65535"
    assert found[4].startswith("TALKIES_STREAM_MAX_BUFFER_SECONDS=1.0 holds 32000 bytes")
    assert found[5].startswith("TALKIES_HSOT: unknown setting; did you mean TALKIES_HOST?")
    assert str(info.value).splitlines() == list(found)
    assert isinstance(info.value, ValueError)


# --- construction in code and with_overrides --------------------------------------------


def test_with_overrides_returns_validated_copy() -> None:
    base = from_env()
    changed = base.with_overrides(port=0, device="cuda:1")
    assert (changed.port, changed.device) == (0, "cuda:1")
    assert base.port == 8000
    assert changed.data_dir == base.data_dir


def test_with_overrides_reports_all_problems() -> None:
    with pytest.raises(ConfigError) as info:
        Settings().with_overrides(port=-1, stream_max_connections=2000, device="tpu")
    assert info.value.problems == (
        "stream_max_connections=2000 (TALKIES_STREAM_MAX_CONNECTIONS): "
        "must be an integer from 1 to 1024",
        "device='tpu' (TALKIES_DEVICE): must be one of auto, cpu, cuda, cuda:N (N = 0, 1, 2, ...)",
        "port=-1 (TALKIES_PORT): must be an integer from 0 to 65535",
    )


def test_with_overrides_checks_cross_field_rule() -> None:
    with pytest.raises(ConfigError, match="TALKIES_STREAM_MAX_FRAME_BYTES=65536"):
        Settings().with_overrides(stream_max_buffer_seconds=1.0)
    assert Settings().with_overrides(stream_max_buffer_seconds=1, stream_max_frame_bytes=32000)


def test_with_overrides_unknown_field_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        Settings().with_overrides(prot=1)


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ConfigError):
        Settings(port=65536)
    with pytest.raises(ConfigError):
        Settings(stream_idle_timeout=math.nan)
    with pytest.raises(ConfigError):
        Settings(stream_max_duration=math.inf)
    with pytest.raises(ConfigError):
        Settings(stream_start_timeout=0.5)
    with pytest.raises(ConfigError):
        Settings(port=True)
    with pytest.raises(ConfigError):
        Settings(port="80")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Settings(enabled_models=())
    with pytest.raises(ConfigError):
        Settings(enabled_models=("a", "a"))
    with pytest.raises(ConfigError):
        Settings(model_concurrency={"a": 0})
    with pytest.raises(ConfigError):
        Settings(auth_token="")


def test_construction_normalizes_convenient_spellings() -> None:
    limits = {"a": 2}
    s = Settings(
        stream_idle_timeout=60,
        stream_start_timeout=3,
        data_dir="/srv/t",  # type: ignore[arg-type]
        enabled_models=["a"],  # type: ignore[arg-type]
        model_concurrency=limits,
    )
    limits["a"] = 5  # the settings keep their own copy
    assert isinstance(s.stream_idle_timeout, float)
    assert isinstance(s.stream_start_timeout, float)
    assert s.data_dir == Path("/srv/t")
    assert s.enabled_models == ("a",)
    assert s.concurrency_for("a") == 2
    assert isinstance(s.model_concurrency, MappingProxyType)
