"""Pure builders for kubeconfig documents (client certificate or bearer token)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from helmhive.api.manifest_yaml import ManifestDumper

__all__ = ["build_kubeconfig", "dump_kubeconfig"]


def build_kubeconfig(
    *,
    server: str,
    ca_file: Path,
    user: str,
    client_cert_file: Path | None = None,
    client_key_file: Path | None = None,
    token: str | None = None,
    cluster_name: str = "helmhive-dev",
    namespace: str | None = None,
) -> dict[str, Any]:
    """Return a kubeconfig with one cluster, one user and one current context.

    The user authenticates with a client certificate pair or with a bearer ``token``
    (exactly one of the two).
    """
    has_cert = client_cert_file is not None and client_key_file is not None
    if has_cert == (token is not None):
        raise ValueError("give either a client certificate and key, or a token")
    user_entry: dict[str, str] = (
        {"token": token}
        if token is not None
        else {"client-certificate": str(client_cert_file), "client-key": str(client_key_file)}
    )
    context: dict[str, str] = {"cluster": cluster_name, "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [{"name": f"{user}@{cluster_name}", "context": context}],
        "current-context": f"{user}@{cluster_name}",
        "preferences": {},
    }


def dump_kubeconfig(config: dict[str, Any]) -> str:
    """Render a kubeconfig as YAML text."""
    return yaml.dump(config, sort_keys=False, Dumper=ManifestDumper)
