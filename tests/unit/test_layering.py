"""Import layering: the pure core loads no Kubernetes, Kopf, HTTP or Prometheus client, even transitively."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PURE = ("api", "policy", "deploy")
IO_CLIENTS = {"kopf", "kubernetes", "httpx", "aiohttp", "prometheus_client"}


def test_importing_the_pure_core_loads_no_io_client() -> None:
    code = (
        "import importlib, json, pkgutil, sys\n"
        "import helmhive\n"
        f"for pkg in {PURE!r}:\n"
        "    mod = importlib.import_module('helmhive.' + pkg)\n"
        "    for info in pkgutil.walk_packages(mod.__path__, mod.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert "helmhive" in loaded
    assert loaded & IO_CLIENTS == set()


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_the_runner_never_imports_the_operator_side() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(
            n for n in _imports(path) if n.startswith(("helmhive.controller", "helmhive.cli", "kopf"))
        )
        for path in (REPO / "runner" / "helmhive").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_reference_agent_and_the_runner_do_not_import_each_other() -> None:
    # Two programs: lint-imports has this as an independence contract; the AST walk also sees
    # imports nested in functions.
    root = REPO / "runner" / "helmhive"
    agent = {n for path in (root / "reference_agent").rglob("*.py") for n in _imports(path)}
    runner = {n for path in (root / "runner").rglob("*.py") for n in _imports(path)}
    assert {n for n in agent if n.startswith("helmhive.runner")} == set()
    assert {n for n in runner if n.startswith("helmhive.reference_agent")} == set()
    assert "helmhive.version" in agent


KUBE_DOORS = {
    "operator/helmhive/kubeclient.py",
    "operator/helmhive/controller/kube/door.py",
    "operator/helmhive/cli/kubeapi.py",
    "operator/helmhive/devcluster/localpod.py",
    "runner/helmhive/runner/kube.py",
}
"""The only modules that import the ``kubernetes`` client (the contract in pyproject.toml, for both roots)."""


def _kube_importers(root: Path, relative_to: Path = REPO) -> set[str]:
    return {
        str(path.relative_to(relative_to))
        for path in root.rglob("*.py")
        if any(n == "kubernetes" or n.startswith("kubernetes.") for n in _imports(path))
    }


def test_only_the_doors_import_the_kubernetes_client() -> None:
    # Checked twice: here, by AST (which also sees imports nested in functions), and by
    # lint-imports, which sees both source roots (tests/harness/lint_imports.py).
    runner = _kube_importers(REPO / "runner" / "helmhive" / "runner")
    operator = _kube_importers(REPO / "operator" / "helmhive")
    assert runner == {"runner/helmhive/runner/kube.py"}
    assert operator == KUBE_DOORS - runner


def test_a_module_outside_the_doors_importing_kubernetes_is_caught(tmp_path: Path) -> None:
    # The AST walk above must see every import form, including one nested in a function.
    module = tmp_path / "sneaky.py"
    module.write_text(
        "def f():\n    from kubernetes.client import CoreV1Api\n    import kubernetes\n", encoding="utf-8"
    )
    (tmp_path / "clean.py").write_text("import json\n", encoding="utf-8")
    assert {"kubernetes.client", "kubernetes"} <= _imports(module)
    assert _kube_importers(tmp_path, tmp_path) == {"sneaky.py"}


def test_the_error_tree_is_pure_and_shared() -> None:
    from helmhive.api import kubeerrors
    from helmhive.controller.kube import door as operator_door
    from helmhive.runner import kube as runner_door

    for name in ("KubeError", "NotFound", "Conflict", "Forbidden", "Invalid", "Unavailable"):
        assert getattr(operator_door, name) is getattr(kubeerrors, name)
        assert getattr(runner_door, name) is getattr(kubeerrors, name)


def test_api_is_the_bottom_layer() -> None:
    offenders = {
        str(path.relative_to(REPO)): sorted(
            n for n in _imports(path) if n.startswith("helmhive.") and not n.startswith("helmhive.api")
        )
        for path in (REPO / "operator" / "helmhive" / "api").rglob("*.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_operator_directory_does_not_shadow_the_standard_library() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import operator; print(operator.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    assert "site-packages" not in out.stdout
    assert not out.stdout.strip().startswith(str(REPO))
