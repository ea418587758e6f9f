"""The users' CI path: examples/ci/kind-e2e.sh, as the example workflow runs it, on our kind cluster.

It runs after the uninstall test, so it also shows a fresh install over the kept CRDs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from e2e_rig import CHART, REPO, Rig

SCRIPT = REPO / "examples" / "ci" / "kind-e2e.sh"
MANIFESTS = Path(__file__).parent / "manifests"


def _script(rig: Rig, manifests: Path, *, wait: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{rig.helm_bin.parent}:{rig.env.kubectl.parent}:{os.environ['PATH']}",
        "HOME": os.environ.get("HOME", "/tmp"),
        "KUBECONFIG": str(rig.env.kubeconfig),
        "HELMHIVE_CHART": str(CHART),
        "HELMHIVE_HELM_ARGS": " ".join(rig.install_values()),
        "HELMHIVE_WAIT": wait,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), str(manifests)], env=env, capture_output=True, text=True, timeout=1200, check=False
    )


def test_the_ci_script_installs_applies_and_waits_until_ready(rig: Rig) -> None:
    proc = _script(rig, MANIFESTS / "ready", wait="300s")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    for line in ("Workspace ci-e2e/ci-shop: Ready", "Profile ci-e2e/ci-connection-check: Valid",
                 "RunnerPool ci-e2e/ci-reference: Ready", "every Helmhive object"):  # fmt: skip
        assert line in out, out


def test_the_ci_script_fails_with_the_reason_and_field_path(rig: Rig) -> None:
    proc = _script(rig, MANIFESTS / "waiting", wait="30s")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "::error title=Workspace ci-e2e/ci-orphan not Ready::" in out, out
    assert "Ready=False" in out, out
    assert "spec.profiles[0]" in out, out
    assert "no-such-profile" in out, out
    assert "Traceback" not in out
