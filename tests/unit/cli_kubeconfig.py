"""A kubeconfig for the CLI tests: one cluster at a given address, two contexts, a token never printed."""

from __future__ import annotations

from pathlib import Path


def write_kubeconfig(tmp_path: Path, server: str, namespace: str | None = "demo") -> Path:
    ns = f", namespace: {namespace}" if namespace else ""
    path = tmp_path / "kubeconfig"
    """``current-context: ctx`` (with ``namespace`` when given); the other context is ``other``."""
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f"clusters:\n- name: c\n  cluster: {{server: '{server}', insecure-skip-tls-verify: true}}\n"
        "users:\n- name: u\n  user: {token: not-a-secret-but-never-printed}\n"
        f"contexts:\n- name: other\n  context: {{cluster: c, user: u, namespace: other}}\n"
        f"- name: ctx\n  context: {{cluster: c, user: u{ns}}}\n"
        "current-context: ctx\n",
        encoding="utf-8",
    )
    return path
