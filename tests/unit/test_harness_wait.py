"""The harness's ``wait_for``: returns the first truthy value, or fails saying what it saw."""

from __future__ import annotations

import itertools

import pytest

from harness import WaitTimeout, wait_for


def test_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert wait_for(lambda: next(counter) >= 3 and "done", timeout=30, interval=0.01) == "done"


def test_timeout_reports_the_last_value_and_description() -> None:
    with pytest.raises(WaitTimeout) as err:
        wait_for(lambda: None, timeout=0.2, interval=0.01, describe="the thing")
    assert "waiting for the thing" in str(err.value)
    assert "last observed value: None" in str(err.value)
    assert isinstance(err.value, AssertionError)


def test_exceptions_and_failed_asserts_count_as_not_yet() -> None:
    attempts = itertools.count()

    def flaky() -> bool:
        n = next(attempts)
        if n < 2:
            raise ConnectionError("refused")
        assert n >= 4, f"only {n}"
        return True

    assert wait_for(flaky, timeout=30, interval=0.01) is True


def test_timeout_reports_the_last_exception() -> None:
    def never() -> bool:
        with pytest.raises(KeyError):
            pass
        return True

    with pytest.raises(WaitTimeout) as err:
        wait_for(never, timeout=0.1, interval=0.01)
    assert "DID NOT RAISE" in str(err.value)
    assert "never" in str(err.value)


def test_unlisted_exceptions_propagate_at_once() -> None:
    def broken() -> bool:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        wait_for(broken, timeout=5)
