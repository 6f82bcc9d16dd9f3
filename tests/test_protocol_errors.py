"""Error codes and close codes: the enum must be the spec's table, no more, no less."""

from __future__ import annotations

import pytest

from talkies.protocol import CloseCode, ErrorCode

from .spec import SHARED_SPEC_PATH, SPEC_PATH, spec_close_codes, spec_error_codes


def test_spec_copy_matches_shared_contract() -> None:
    if not SHARED_SPEC_PATH.exists():
        pytest.skip("no ../shared beside this checkout")
    assert SPEC_PATH.read_bytes() == SHARED_SPEC_PATH.read_bytes()


def test_every_spec_code_is_an_error_code_with_its_close_code() -> None:
    codes = spec_error_codes()
    assert len(codes) == 24
    assert {c.value: int(c.close_code) for c in ErrorCode} == codes


def test_close_codes_are_the_spec_table_plus_going_away() -> None:
    table = spec_close_codes()
    assert set(table) == {1000, 4400, 4401, 4404, 4408, 4409, 4429, 4500}
    assert {int(c) for c in CloseCode} == set(table) | {1001}


@pytest.mark.parametrize("code", list(ErrorCode))
def test_error_code_round_trips_by_value(code: ErrorCode) -> None:
    assert ErrorCode(code.value) is code
    assert str(code) == code.value
    assert code.close_code in CloseCode
