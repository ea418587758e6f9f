"""No test asserts how fast something was: an upper bound on a measured time fails on a loaded machine.

CI shares a 2-core machine with other work, so a test checks what was done (the outcome, who
cancelled, that no kill was sent, that the same process answered), never that it took less than
some seconds. A lower bound that follows from the rules stays (a watchdog fires no earlier than
its timeout). ``docs/development.md`` ("Tests on a loaded machine") has the rules; this test
catches the most common way to break them, by reading every test module's syntax tree:

* an ``assert`` that bounds from above (``<``, ``<=``, or ``>``/``>=`` read the other way) a value
  named like a measured time (``duration_s``, ``durationSeconds``, ``elapsed``, ``took``,
  ``latency``), or
* one that bounds from above a reading of the machine's clock (``time.monotonic()``,
  ``time.time()``, ``time.perf_counter()``), or a local variable computed from one.

``datetime.now()`` is left out: tests use it to write timestamps (an ``expiresAt``), not to time.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
TIME_WORDS = {"duration", "elapsed", "took", "latency"}
CLOCKS = {"monotonic", "time", "perf_counter", "monotonic_ns", "time_ns", "perf_counter_ns"}


def _words(identifier: str) -> set[str]:
    """``durationSeconds`` and ``duration_s`` -> {"duration", "seconds"} / {"duration", "s"}."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", identifier)
    return {w.lower() for w in spaced.split("_") if w}


def _is_clock_call(node: ast.AST) -> bool:
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    return node.func.attr in CLOCKS and getattr(node.func.value, "id", "") == "time"


def _clock_locals(function: ast.AST) -> set[str]:
    """Names assigned, in ``function``, from an expression that reads the clock."""
    names: set[str] = set()
    for node in ast.walk(function):
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        if any(_is_clock_call(inner) for inner in ast.walk(node.value)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _is_time_key(node: ast.AST) -> bool:
    """A string such as ``"durationSeconds"`` (a key of a measured time), not a message that says one."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    return bool(re.fullmatch(r"[A-Za-z_]+", node.value)) and bool(_words(node.value) & TIME_WORDS)


def _time_like(node: ast.AST, clock_names: set[str]) -> bool:
    for inner in ast.walk(node):
        if _is_clock_call(inner):
            return True
        if isinstance(inner, ast.Name) and (inner.id in clock_names or _words(inner.id) & TIME_WORDS):
            return True
        if isinstance(inner, ast.Attribute) and _words(inner.attr) & TIME_WORDS:
            return True
        if _is_time_key(inner):
            return True
    return False


def _upper_bounded(compare: ast.Compare) -> list[ast.expr]:
    """The operands that ``compare`` bounds from above (``x < 3``, ``3 > x``, ``1 <= x < 3``)."""
    operands = [compare.left, *compare.comparators]
    bounded = []
    for op, left, right in zip(compare.ops, operands[:-1], operands[1:], strict=True):
        if isinstance(op, ast.Lt | ast.LtE):
            bounded.append(left)
        elif isinstance(op, ast.Gt | ast.GtE):
            bounded.append(right)
    return bounded


def find_wall_clock_asserts(source: str) -> list[int]:
    """The line numbers of asserts that bound a measured time from above."""
    tree = ast.parse(source)
    found: list[int] = []
    scopes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))]
    for scope in scopes:
        clock_names = _clock_locals(scope)
        body = scope.body if isinstance(scope, ast.Module) else [scope]
        for node in (n for top in body for n in ast.walk(top)):
            if not isinstance(node, ast.Assert):
                continue
            for compare in (c for c in ast.walk(node.test) if isinstance(c, ast.Compare)):
                if any(_time_like(operand, clock_names) for operand in _upper_bounded(compare)):
                    found.append(node.lineno)
    return sorted(set(found))


@pytest.mark.parametrize(
    "source",
    [
        "def test(r):\n    assert r.duration_s < 1.9\n",
        "def test(r):\n    assert 1.9 <= r.duration_s < 10\n",
        "def test(r):\n    assert 5 > r['durationSeconds']\n",
        "def test():\n    elapsed = 3\n    assert elapsed <= 2\n",
        "import time\ndef test(s):\n    burst = time.monotonic() - s\n    assert burst < 0.1\n",
        "import time\ndef test(s):\n    assert time.perf_counter() - s < 1\n",
    ],
)
def test_the_check_finds_an_upper_bound_on_a_measured_time(source: str) -> None:
    assert find_wall_clock_asserts(source), source


@pytest.mark.parametrize(
    "source",
    [
        "def test(r):\n    assert r.duration_s >= 1.0  # a lower bound from the rules\n",
        "def test(r):\n    assert r['durationSeconds'] >= 2\n",
        "def test(job):\n    assert len(str(job)) < 64 * 1024\n",
        "def test(r):\n    assert 'duration' in r.message and r.retries < 3\n",
    ],
)
def test_the_check_leaves_lower_bounds_and_other_comparisons_alone(source: str) -> None:
    assert find_wall_clock_asserts(source) == []


def test_no_test_bounds_a_measured_time_from_above() -> None:
    offenders = {
        str(path.relative_to(TESTS)): lines
        for path in sorted(TESTS.rglob("*.py"))
        if (lines := find_wall_clock_asserts(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}, (
        f"assert what was done, not how fast (docs/development.md, 'Tests on a loaded machine'): {offenders}"
    )
