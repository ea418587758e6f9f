"""pytest plugin: every skipped test is counted, shown with its reason, and checked against the docs.

A skip hides a test from CI as surely as a deletion. So the suite lists, in
``docs/development.md`` (the table between ``<!-- skips -->`` and ``<!-- /skips -->``), every
test that may skip and the reason it may give. At the end of a run this plugin prints how many
tests skipped and why, and **fails the run** (exit status 1) when a test skipped that the table
does not list, or with a reason the table does not give for it.

A row's first cell is a test id (``path::name``, fnmatch patterns allowed, parametrized ids
match their base name); its second cell is the start of the skip's reason, in backticks.
"""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "development.md"
_BEGIN, _END = "<!-- skips -->", "<!-- /skips -->"
_CELL = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class AllowedSkip:
    test: str
    reason: str


@dataclass(frozen=True)
class Skip:
    test: str
    reason: str


def read_allowed(text: str) -> list[AllowedSkip]:
    """The rows of the skips table in ``text``; an empty list when it has none."""
    if _BEGIN not in text or _END not in text:
        return []
    table = text.split(_BEGIN, 1)[1].split(_END, 1)[0]
    rows = []
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`"):
            continue
        test, reason = _CELL.search(cells[0]), _CELL.search(cells[1])
        if test and reason:
            rows.append(AllowedSkip(test=test.group(1), reason=reason.group(1)))
    return rows


def decide_unlisted(skips: list[Skip], allowed: list[AllowedSkip]) -> list[Skip]:
    """The skips no row allows: the test id must match and the reason must start with the row's."""

    def listed(skip: Skip) -> bool:
        base = skip.test.split("[", 1)[0]
        return any(
            (fnmatch.fnmatchcase(skip.test, row.test) or fnmatch.fnmatchcase(base, row.test))
            and skip.reason.startswith(row.reason)
            for row in allowed
        )

    return [s for s in skips if not listed(s)]


def _reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return str(text).removeprefix("Skipped: ")


class SkipLedger:
    def __init__(self) -> None:
        self.skips: list[Skip] = []
        self.unlisted: list[Skip] = []

    def _record(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if report.skipped and not hasattr(report, "wasxfail"):
            self.skips.append(Skip(test=report.nodeid, reason=_reason(report)))

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report)

    @pytest.hookimpl
    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._record(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        allowed = read_allowed(DOC.read_text(encoding="utf-8")) if DOC.exists() else []
        self.unlisted = decide_unlisted(self.skips, allowed)
        if self.unlisted and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        by_reason = Counter(s.reason for s in self.skips)
        terminalreporter.section(f"skipped tests: {len(self.skips)}", sep="-")
        for reason, count in sorted(by_reason.items()):
            terminalreporter.line(f"{count:4d}  {reason}")
        if self.unlisted:
            terminalreporter.line(
                f"FAILED: {len(self.unlisted)} skip(s) that docs/development.md does not list "
                "(add a row to its skips table, or make the test run):",
                red=True,
            )
            for skip in self.unlisted:
                terminalreporter.line(f"  {skip.test}: {skip.reason}", red=True)


def pytest_configure(config: pytest.Config) -> None:
    # Only the process that reports: under xdist the controller sees every worker's reports.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(SkipLedger(), "helmhive-skip-ledger")
