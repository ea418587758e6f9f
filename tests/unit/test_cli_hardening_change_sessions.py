"""The pure parts of ``helmhive change|sessions`` hardening: showing object text, namespace, timeout, server.

Agent-written text never reaches the terminal as rich markup or as a control sequence. The
commands' behaviour end to end is in ``test_cli_hardening_cli_errors.py`` (offline) and
``tests/operator/test_cli_hardening_change_status.py`` (a real API server).
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from cli_kubeconfig import write_kubeconfig
from rich.console import Console

from helmhive.api.change import ChangeStatus
from helmhive.cli import change, client_policy, sessions
from helmhive.cli.kubeapi import (
    DEFAULT_TIMEOUT_SECONDS,
    TIMEOUT_ENV,
    context_namespace,
    decide_current_context,
    decide_namespace,
    decide_timeout,
    server_address,
)
from helmhive.cli.render import printable

HOSTILE = "x[/i] [bold red]markup[/] \x1b[31mred"


# Showing object text ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("planted", "shown"),
    [
        ("\x1b[31mred", "\\x1b[31mred"),
        ("bell\x07", "bell\\x07"),
        ("del\x7f", "del\\x7f"),
        ("c1\x9b2J", "c1\\x9b2J"),
        ("osc\x1b]0;title\x07", "osc\\x1b]0;title\\x07"),
        ("back\rspace\x08", "back\\rspace\\x08"),
        ("bidi\u202eevil", "bidi\\u202eevil"),
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("tab\tand\nnewline", "tab\tand\nnewline"),
        ("x[/i] [bold]plain[/bold] ünïcödé\u00a0ok", "x[/i] [bold]plain[/bold] ünïcödé\u00a0ok"),
    ],
)
def test_printable_shows_every_control_character_escaped(planted: str, shown: str) -> None:
    assert printable(planted) == shown


def test_printable_on_one_line_escapes_line_breaks_too() -> None:
    assert printable("a\nApproved by alice\tb", one_line=True) == "a\\nApproved by alice\\tb"


def _hostile_status() -> ChangeStatus:
    at = "2024-01-01T00:00:00Z"
    return ChangeStatus.model_validate(
        {
            "iteration": 1,
            "conditions": [
                {
                    "type": "Planned",
                    "status": "True",
                    "reason": "PlanReady",
                    "message": "see [/tmp]",
                    "lastTransitionTime": at,
                },
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "AwaitingApproval",
                    "message": HOSTILE,
                    "lastTransitionTime": at,
                },
            ],
            "jobs": [{"stage": "planning", "iteration": 1, "name": "c-plan", "outcome": "[/i]\x1b[2J"}],
            "plan": {"job": "c-plan", "digest": "sha256:" + "a" * 64, "summary": HOSTILE + "\nApproved by alice"},
            "approval": {"digest": "sha256:" + "a" * 64, "by": "bob\x1b[8m", "at": at},
            "review": {
                "job": "c-review-1",
                "iteration": 1,
                "verdict": "approve",
                "criteria": [{"criterion": 0, "met": True, "note": "[/i] \x1b[31mnote"}],
            },
        }
    )


def test_change_status_renders_agent_text_as_plain_escaped_text() -> None:
    out = io.StringIO()
    change.render_status(Console(file=out, width=400), namespace="demo", name="c[/b]", st=_hostile_status())
    text = out.getvalue()
    assert "\x1b" not in text
    assert "x[/i] [bold red]markup[/] \\x1b[31mred" in text  # the plan summary, the Ready headline
    assert "see [/tmp]" in text and "[/i]\\x1b[2J" in text and "bob\\x1b[8m" in text
    assert "\\x1b[31mred\\nApproved by alice" in text  # no forged line of its own
    assert "criterion 1: met ([/i] \\x1b[31mnote)" in text
    assert "Change demo/c[/b]" in text


def test_change_status_on_a_terminal_styles_only_its_own_text() -> None:
    out = io.StringIO()
    console = Console(file=out, width=400, force_terminal=True, color_system="standard")
    change.render_status(console, namespace="demo", name="c", st=_hostile_status())
    text = out.getvalue()
    assert "\x1b[31m" not in text and "\x1b[2J" not in text and "\x1b[8m" not in text
    assert "\\x1b[31mred" in text


def test_sessions_list_renders_binding_text_as_plain_escaped_text() -> None:
    out = io.StringIO()
    rows: list[dict[str, object]] = [{"name": "sb-1", "workspace": "w[/i]", "profile": "\x1b[31mp", "stored": True}]
    sessions.render_bindings(Console(file=out, width=400), namespace="n[/x]", rows=rows)
    text = out.getvalue()
    assert "\x1b" not in text
    assert "w[/i]" in text and "\\x1b[31mp" in text and "n[/x]" in text and "True" in text


@pytest.mark.parametrize(
    ("data", "terminal", "expected", "escaped"),
    [
        (b"+a\x1b[2J\n", False, b"+a\x1b[2J\n", False),
        (b"+a\x1b[2J\n", True, b"+a\\x1b[2J\n", True),
        (b"+plain\n\tline\n", True, b"+plain\n\tline\n", False),
    ],
)
def test_change_patch_is_exact_when_piped_and_escaped_on_a_terminal(
    data: bytes, terminal: bool, expected: bytes, escaped: bool
) -> None:
    assert change.decide_patch_output(data, terminal=terminal) == (expected, escaped)


# Namespace -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("context", "in_cluster", "expected"),
    [
        ({"name": "c", "context": {"namespace": "demo"}}, "pod-ns", "demo"),
        ({"name": "c", "context": {"cluster": "x"}}, "pod-ns", "default"),
        ({"name": "c", "context": None}, None, "default"),
        ({}, None, "default"),
        (None, "pod-ns\n", "pod-ns"),
        (None, "", "default"),
        (None, None, "default"),
    ],
)
def test_the_default_namespace_is_kubectls(
    context: dict[str, object] | None, in_cluster: str | None, expected: str
) -> None:
    assert decide_namespace(context=context, in_cluster=in_cluster) == expected


def test_the_namespace_is_read_from_the_current_context(tmp_path: Path) -> None:
    assert context_namespace(str(write_kubeconfig(tmp_path, "https://127.0.0.1:1"))) == "demo"
    assert context_namespace(str(write_kubeconfig(tmp_path, "https://127.0.0.1:1", namespace=None))) == "default"


def _context(name: str, namespace: str) -> dict[str, object]:
    return {"name": name, "context": {"namespace": namespace}}


@pytest.mark.parametrize(
    ("configs", "expected"),
    [
        pytest.param(
            [{"current-context": "a", "contexts": [_context("a", "first")]}, {"current-context": "b"}],
            ("a", _context("a", "first")),
            id="first-current-context-wins",
        ),
        pytest.param(
            [{"contexts": [_context("a", "first")]}, {"current-context": "a", "contexts": [_context("a", "second")]}],
            ("a", _context("a", "first")),
            id="first-context-of-a-name-wins",
        ),
        pytest.param([{"current-context": "gone"}], ("gone", {}), id="no-such-context"),
        pytest.param([None, ["a"], "text", {"contexts": "x"}], (None, {}), id="not-kubeconfigs"),
    ],
)
def test_the_current_context_is_merged_as_kubectl_mergeswrite_kubeconfig(
    configs: list[object], expected: tuple[str | None, dict[str, object]]
) -> None:
    assert decide_current_context(configs) == expected


def test_kubeconfig_may_list_several_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = tmp_path / "first"
    first.mkdir()
    listed = os.pathsep.join(
        [str(tmp_path / "absent"), str(write_kubeconfig(first, "https://127.0.0.1:1", namespace="one")), ""]
    )
    assert context_namespace(listed) == "one"
    monkeypatch.setenv("KUBECONFIG", listed)
    assert context_namespace(None) == "one"


def test_without_a_kubeconfig_the_namespace_is_the_pods(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    pod = tmp_path / "namespace"
    pod.write_text("pod-ns\n", encoding="utf-8")
    monkeypatch.setattr(client_policy, "SERVICE_ACCOUNT_NAMESPACE", pod)
    assert context_namespace(None) == "pod-ns"
    monkeypatch.setattr(client_policy, "SERVICE_ACCOUNT_NAMESPACE", tmp_path / "absent")
    assert context_namespace(None) == "default"


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, DEFAULT_TIMEOUT_SECONDS), ("", DEFAULT_TIMEOUT_SECONDS), ("2", 2.0), ("0.5", 0.5)]
)
def test_the_timeout_is_read_from_the_environment(raw: str | None, expected: float) -> None:
    assert decide_timeout(raw) == expected


@pytest.mark.parametrize("raw", ["abc", "0", "-1", "nan", "inf", "3601"])
def test_an_unusable_timeout_is_refused_with_a_reason(raw: str) -> None:
    with pytest.raises(ValueError, match=TIMEOUT_ENV):
        decide_timeout(raw)


@pytest.mark.parametrize(
    ("host", "shown"),
    [
        ("https://127.0.0.1:6443", "127.0.0.1:6443"),
        ("https://user:secret@api.example.com:443/k8s/clusters/c-1", "api.example.com:443"),
        ("https://[::1]:6443", "[::1]:6443"),
        ("https://api.example.com", "api.example.com"),
    ],
)
def test_the_server_is_named_by_host_and_port_only(host: str, shown: str) -> None:
    assert server_address(host) == shown
