"""Run kubectl against the test cluster, as a person or CI would.

The ``kubectl`` fixture is a :class:`Kubectl` bound to the session's cluster and admin
kubeconfig; with the local control plane it runs the kubectl built with it::

    def test_get(kubectl, namespace):
        kubectl("apply", "-f", "examples/profile.yaml", "-n", namespace)
        obj = kubectl.json("get", "profiles", "-n", namespace)
        out = kubectl("describe", "profile", "x", "-n", namespace).stdout
        res = kubectl("delete", "ns", "nope", check=False)   # inspect a failure yourself

A failing command (with ``check=True``, the default) fails the test with the command
line, exit code, stdout and stderr.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = ["Kubectl", "KubectlError"]


class KubectlError(AssertionError):
    """A kubectl command exited non-zero."""


@dataclass(frozen=True)
class Kubectl:
    """``kubectl --kubeconfig <kubeconfig>`` with a default timeout."""

    binary: Path
    kubeconfig: Path
    timeout: float = 60.0

    def as_user(self, kubeconfig: Path) -> Kubectl:
        """The same kubectl with another kubeconfig (for example an Identity's)."""
        return replace(self, kubeconfig=kubeconfig)

    def __call__(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
        proc = subprocess.run(
            cmd,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout or self.timeout,
            env=env,
            check=False,
        )
        if check and proc.returncode != 0:
            raise KubectlError(
                f"`{shlex.join(cmd)}` exited {proc.returncode}\n"
                f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
            )
        return proc

    def json(self, *args: str, **kwargs: Any) -> Any:
        """Run with ``-o json`` and return the parsed output."""
        return json.loads(self(*args, "-o", "json", **kwargs).stdout)
