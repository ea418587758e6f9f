"""Helpers of the chart tests: run helm, render the chart, index the rendered objects."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "CHART",
    "EXAMPLES",
    "KUBE_VERSION",
    "REPO",
    "by_key",
    "helm_fails",
    "key",
    "non_hooks",
    "render",
    "run",
    "template_fails",
]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "helmhive"
EXAMPLES = REPO / "examples" / "helm"
KUBE_VERSION = "1.37.2"

Doc = dict[str, Any]


def run(*cmd: str | Path, timeout: float = 300) -> str:
    """Run a command; fail the test with its output unless it succeeds. Returns stdout."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def helm_fails(*cmd: str | Path) -> str:
    """Run a command that must fail; return its stderr."""
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0, f"{' '.join(map(str, cmd))} succeeded but must fail:\n{proc.stdout}"
    return proc.stderr


def template_fails(helm: Path, *args: str | Path) -> str:
    """``helm template`` that must fail; returns its stderr."""
    return helm_fails(helm, "template", "hh", CHART, "--kube-version", KUBE_VERSION, *args)


def render(helm: Path, *args: str | Path, release: str = "helmhive", namespace: str = "platform") -> list[Doc]:
    """``helm template`` the chart (hooks included) and parse every document."""
    out = run(helm, "template", release, CHART, "-n", namespace, "--kube-version", KUBE_VERSION, *args)
    return [d for d in yaml.safe_load_all(out) if d]


def key(doc: Doc) -> tuple[str, str]:
    return (doc["kind"], doc["metadata"]["name"])


def by_key(docs: list[Doc]) -> dict[tuple[str, str], Doc]:
    index = {key(d): d for d in docs}
    assert len(index) == len(docs), "two rendered objects share a kind and a name"
    return index


def non_hooks(docs: list[Doc]) -> list[Doc]:
    """The objects Helm installs as the release (``helm test`` pods and other hooks left out)."""
    return [d for d in docs if "helm.sh/hook" not in (d["metadata"].get("annotations") or {})]
