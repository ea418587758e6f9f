"""The skip ledger: a skip the docs do not list fails the run; a listed one is counted and shown."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.skips import DOC, AllowedSkip, Skip, decide_unlisted, read_allowed

TABLE = """
<!-- skips -->
| Test | Reason | Why |
|---|---|---|
| `tests/a.py::test_one` | `no user namespaces` | here |
| `tests/b.py::*` | `symbolic links` | there |
<!-- /skips -->
"""


def test_the_table_is_read_from_its_markers() -> None:
    assert read_allowed(TABLE) == [
        AllowedSkip(test="tests/a.py::test_one", reason="no user namespaces"),
        AllowedSkip(test="tests/b.py::*", reason="symbolic links"),
    ]
    assert read_allowed("no table here") == []


def test_a_skip_is_listed_only_by_its_test_and_its_reason() -> None:
    allowed = read_allowed(TABLE)
    ok = Skip(test="tests/a.py::test_one", reason="no user namespaces on this kernel")
    param = Skip(test="tests/b.py::test_x[case-1]", reason="symbolic links")
    wrong_reason = Skip(test="tests/a.py::test_one", reason="something else")
    wrong_test = Skip(test="tests/c.py::test_one", reason="no user namespaces")
    assert decide_unlisted([ok, param, wrong_reason, wrong_test], allowed) == [wrong_reason, wrong_test]


def test_the_docs_list_every_skip_the_suite_can_make() -> None:
    rows = read_allowed(DOC.read_text(encoding="utf-8"))
    tests = {row.test for row in rows}
    assert "tests/runner/test_execution_limits.py::test_a_root_runner_limits_processes_with_the_jobs_cgroup" in tests
    assert "tests/runner/test_execution_limits.py::test_each_limit_ends_its_job_and_the_runner_goes_on" in tests


def test_an_unlisted_skip_fails_the_run_and_a_listed_one_does_not(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    tests_dir = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tests_dir), os.environ.get("PYTHONPATH", "")]))
    pytester.makeconftest('pytest_plugins = ["harness.skips"]\n')
    pytester.makepyfile(
        test_inner=(
            "import pytest\n"
            "def test_runs():\n    assert True\n"
            "def test_hides():\n    pytest.skip('nobody listed this reason')\n"
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*skipped tests: 1*", "*1  nobody listed this reason*", "*FAILED: 1 skip(s)*"])
    assert "test_inner.py::test_hides: nobody listed this reason" in result.stdout.str()

    pytester.makepyfile(test_inner="def test_runs():\n    assert True\n")
    clean = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert clean.ret == pytest.ExitCode.OK
    clean.stdout.fnmatch_lines(["*skipped tests: 0*"])
