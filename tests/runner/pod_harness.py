"""A runner program run as a runner pod runs it: uid 65532, no capabilities, its files its own.

Security tests run the runner this way wherever the machine allows (the tests themselves may run
as root): the runner then owns its state, credential copy and kubeconfig, exactly as in a pod, and
the kernel's ownership rules are the ones production sees. :func:`make_pod_python` gives an
interpreter uid 65532 can run (a virtual environment of the system's Python 3.11 that adds this
one's site-packages, when this one lives where uid 65532 cannot go); :func:`make_pod_root` a
directory it can reach; :func:`start_pod_runner` starts the runner program there, registered.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from .execution_harness import ExecutionRig, Runner
from .program_harness import RunnerProc, RunnerRig, reference_runner_json

POD_UID = 65532


def as_pod() -> dict[str, Any]:
    """``subprocess`` arguments that run a command as uid 65532 when the tests run as root."""
    return {"user": POD_UID, "group": POD_UID, "extra_groups": []} if os.getuid() == 0 else {}


@contextlib.contextmanager
def make_pod_python() -> Iterator[Path]:
    """An interpreter uid 65532 can run, that sees this project's packages."""
    if os.getuid() != 0:
        yield Path(sys.executable)
        return
    system = shutil.which("python3.11", path="/usr/bin:/usr/local/bin")
    if system is None:
        pytest.fail(
            "no system Python 3.11 (Debian's python3.11-minimal and python3.11-venv) to run the runner as uid 65532"
        )
    base = Path(tempfile.mkdtemp(prefix="helmhive-pod-python-"))
    try:
        subprocess.run([system, "-m", "venv", "--without-pip", str(base / "venv")], check=True, timeout=120)
        (site,) = (base / "venv" / "lib").glob("python3*/site-packages")
        ours = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
        (site / "helmhive-tests.pth").write_text(f"import site; site.addsitedir({ours!r})\n", encoding="utf-8")
        for path in (base, *base.rglob("*")):
            path.chmod(path.stat().st_mode | 0o755 if path.is_dir() else path.stat().st_mode | 0o444)
        python = base / "venv" / "bin" / "python"
        check = subprocess.run(
            [str(python), "-c", "import helmhive.runner.program.main, helmhive.reference_agent.agent"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            **as_pod(),
        )
        if check.returncode != 0:
            pytest.fail(f"uid {POD_UID} cannot import this project with {system}: {check.stderr[-500:]}")
        yield python
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def make_pod_root() -> Iterator[Path]:
    """A directory uid 65532 can reach (the usual tmp_path is under a root-only directory).

    Request it before ``execution``: fixtures are torn down in reverse, so the runners (stopped by
    ``execution``'s cleanup) end before their directory is removed."""
    root = Path(tempfile.mkdtemp(prefix="helmhive-pod-runner-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _inline_kubeconfig(source: Path, target: Path) -> Path:
    doc = yaml.safe_load(source.read_text(encoding="utf-8"))
    for entry in doc["clusters"]:
        ca = entry["cluster"].pop("certificate-authority", None)
        if ca:
            entry["cluster"]["certificate-authority-data"] = base64.b64encode(Path(ca).read_bytes()).decode()
    target.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return target


def chown_tree(root: Path, uid: int) -> None:
    for path in (root, *root.rglob("*")):
        os.chown(path, uid, uid, follow_symlinks=False)


def start_pod_runner(
    execution: ExecutionRig,
    *,
    root: Path,
    python: Path | None = None,
    job_limits: dict[str, int] | None = None,
    config: dict[str, Any] | None = None,
    concurrency: int = 1,
) -> Runner:
    """A runner program, the reference agent run by the same interpreter, with ``jobLimits`` and more
    pool settings (``config``) in its runner.json.

    With ``python`` (:func:`make_pod_python`) and tests that run as root, it runs as uid 65532, the pod's,
    and owns everything under ``root``."""
    pod = python is not None and os.getuid() == 0
    python = python or Path(sys.executable)
    rig = RunnerRig(kube=execution.kube, namespace=execution.namespace, identities=execution.identities, root=root)
    execution.sessions_secret(rig.name)
    runner_json = reference_runner_json(agent_state=rig.agent_state, concurrency=concurrency)
    runner_json["adapter"]["acp"].update({"command": str(python), "args": ["-m", "helmhive.reference_agent.agent"]})
    runner_json["sandbox"] = {"writePaths": [str(rig.agent_state)]}
    if job_limits is not None:
        runner_json["jobLimits"] = job_limits
    runner_json.update(config or {})
    env = rig.environ(runner_json)
    if pod:
        env["KUBECONFIG"] = str(_inline_kubeconfig(Path(env["KUBECONFIG"]), root / "kubeconfig"))
        chown_tree(root, POD_UID)
    log_path = root / "runner.log"
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            [str(python), "-m", "helmhive", "runner", "run"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=root,
            **(as_pod() if pod else {}),
        )
    proc = RunnerProc(popen=popen, log_path=log_path)
    rig.procs.append(proc)
    runner = Runner(rig=rig, proc=proc, runner_json=runner_json)
    execution.runners.append(runner)  # stopped with the others
    rig.wait_registered(proc)
    return runner
