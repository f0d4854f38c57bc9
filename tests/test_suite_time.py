"""The suite's last line: its wall time against CI's 35 minutes (tests/conftest.py)."""

from __future__ import annotations

from tests.conftest import suite_time


def test_the_suite_says_its_time_against_the_budget_from_ci_s_start_when_it_knows_it() -> None:
    assert suite_time(1000.0 + 1900, "1000", 1500.0) == "suite 31:40 of 35:00 (since .ci/run started; 3:20 left)"
    assert suite_time(1500.0 + 600, None, 1500.0) == "suite 10:00 of 35:00 (pytest only; 25:00 left)"
    assert suite_time(1000.0 + 2165, "1000", 1500.0) == "suite 36:05 of 35:00 (since .ci/run started; 1:05 OVER)"
