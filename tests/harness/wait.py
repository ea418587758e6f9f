"""``wait_for``: poll until something is true, and fail with what was last seen.

Tests never ``time.sleep`` to let the cluster catch up; they wait for the state they
need::

    from harness import wait_for

    pod = wait_for(lambda: core.read_namespaced_pod(name, ns) if ... else None,
                   timeout=30, describe=f"pod {ns}/{name} to exist")

The predicate's return value is the result: the first truthy value is returned. An
exception raised by the predicate (including a failed ``assert`` or ``pytest.raises``
inside it) counts as "not yet" and is shown as the last observation if time runs out, so a predicate may
simply assert::

    def deleted() -> bool:
        with pytest.raises(ApiException) as err:
            core.read_namespace(name)
        assert err.value.status == 404
        return True
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import TypeVar

import pytest

__all__ = ["WaitTimeout", "wait_for"]

T = TypeVar("T")

_MISSING = object()


class WaitTimeout(AssertionError):
    """``wait_for`` ran out of time; the message holds the last observed value or error."""


def _describe_value(value: object, limit: int = 2000) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float = 30.0,
    interval: float = 0.2,
    describe: str | None = None,
    ignore: tuple[type[BaseException], ...] = (Exception, pytest.fail.Exception),
) -> T:
    """Call ``predicate`` every ``interval`` seconds until it returns a truthy value; return it.

    Raise :class:`WaitTimeout` (an AssertionError, so the test fails) after ``timeout``
    seconds, naming ``describe`` and the last value or exception observed. Exceptions of
    types outside ``ignore`` propagate at once.
    """
    what = describe or getattr(predicate, "__name__", "condition")
    started = time.monotonic()
    deadline = started + timeout
    last: object = _MISSING
    last_error: BaseException | None = None
    attempts = 0
    while True:
        attempts += 1
        try:
            value = predicate()
        except ignore as err:
            last_error, last = err, _MISSING
        else:
            if value:
                return value
            last, last_error = value, None
        if time.monotonic() >= deadline:
            break
        time.sleep(max(0.0, min(interval, deadline - time.monotonic())))
    elapsed = time.monotonic() - started
    if last_error is not None:
        frames = "".join(traceback.format_exception_only(type(last_error), last_error)).strip()
        observed = f"last attempt raised {frames}"
    else:
        observed = f"last observed value: {_describe_value(last)}"
    message = f"timed out after {elapsed:.1f} s ({attempts} attempts) waiting for {what}; {observed}"
    raise WaitTimeout(message) from last_error
