"""The test tree itself: every test module's basename is unique.

The test directories are not packages, so pytest imports each test module by its basename; a
second ``test_x.py`` anywhere under ``tests/`` makes collection of the whole suite fail.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    assert names, "no test modules found"
    duplicates = sorted(name for name, count in names.items() if count > 1)
    assert duplicates == [], f"test modules sharing a basename (pytest cannot import both): {duplicates}"
