"""kstatus itself, for the tests: the Go program in ``tests/harness/kstatus/``, built once and cached.

Flux judges a resource with ``sigs.k8s.io/cli-utils/pkg/kstatus/status``; rather than describe
its rules again in Python, the tests ask it. The program reads a JSON array of objects on stdin
and prints kstatus's result for each (``status``, ``message``, the conditions it derived).

Built from the Go module proxy at the ``sigs.k8s.io/cli-utils`` version its ``go.mod`` pins, into
``<cache>/kstatus/<version>-<digest of the sources>/kstatus`` (the cache of the Kubernetes
binaries, :func:`helmhive.devcluster.build.cache_root`), under the same per-entry lock and with a
stamp written last, so parallel test workers build it once and an interrupted build is redone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pytest

from helmhive.devcluster.build import BuildError, cache_root
from helmhive.devcluster.cachelock import cache_entry_lock
from helmhive.devcluster.progress import step

__all__ = ["SOURCE", "Kstatus", "KstatusResult", "cli_utils_version", "ensure_kstatus", "kstatus_binary"]

SOURCE = Path(__file__).resolve().parent / "kstatus"
_FILES = ("go.mod", "go.sum", "main.go")
_STAMP = ".complete.json"


def cli_utils_version() -> str:
    """The ``sigs.k8s.io/cli-utils`` version the program's ``go.mod`` requires."""
    found = re.search(r"^\s*sigs\.k8s\.io/cli-utils (v\S+)", (SOURCE / "go.mod").read_text(), flags=re.MULTILINE)
    if found is None:
        raise BuildError(f"{SOURCE / 'go.mod'} requires no sigs.k8s.io/cli-utils version")
    return found.group(1)


def _digest() -> str:
    sha = hashlib.sha256()
    for name in _FILES:
        sha.update(name.encode() + b"\0" + (SOURCE / name).read_bytes() + b"\0")
    return sha.hexdigest()[:12]


def ensure_kstatus(*, log: TextIO, root: Path | None = None) -> Path:
    """The built program, building it with ``go build`` (about a minute, cold) if the cache lacks it."""
    version = cli_utils_version()
    directory = (root or cache_root()) / "kstatus" / f"{version}-{_digest()}"
    binary = directory / "kstatus"
    if (directory / _STAMP).is_file() and binary.is_file():
        return binary
    if shutil.which("go") is None:
        raise BuildError("Go is needed to build the kstatus test program, and `go` is not on PATH")
    with cache_entry_lock(directory, log, what=f"kstatus (cli-utils {version})"):
        if (directory / _STAMP).is_file() and binary.is_file():  # built by another process while we waited
            return binary
        directory.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local", GOFLAGS="-buildvcs=false -mod=readonly")
        cmd = ["go", "build", "-trimpath", "-ldflags", "-s -w", "-o", str(binary), "."]
        logfile = directory / "build.log"
        started = time.monotonic()
        with (
            logfile.open("w", encoding="utf-8") as out,
            step(log, f"building kstatus (sigs.k8s.io/cli-utils {version}) into {directory}"),
        ):
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=SOURCE, check=False)
        if proc.returncode != 0 or not binary.is_file():
            tail = logfile.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise BuildError(f"building kstatus failed ({proc.returncode}); {logfile}:\n{tail}")
        seconds = round(time.monotonic() - started, 1)
        (directory / _STAMP).write_text(json.dumps({"cli-utils": version, "build_seconds": seconds}) + "\n")
    return binary


@dataclass(frozen=True, kw_only=True)
class KstatusResult:
    """What kstatus computed for one object."""

    status: str
    """``InProgress``, ``Current``, ``Failed``, ``Terminating``, ``NotFound`` or ``Unknown``."""
    message: str
    conditions: tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class Kstatus:
    """The built program: :meth:`compute` runs it once for any number of objects."""

    binary: Path

    def compute(self, objects: Sequence[Mapping[str, Any]]) -> list[KstatusResult]:
        proc = subprocess.run(
            [str(self.binary)], input=json.dumps(list(objects)), capture_output=True, text=True, timeout=60, check=False
        )
        if proc.returncode != 0:
            raise AssertionError(f"kstatus exited {proc.returncode}: {proc.stderr.strip()}")
        return [
            KstatusResult(status=r["status"], message=r["message"], conditions=tuple(r["conditions"]))
            for r in json.loads(proc.stdout)
        ]

    def status(self, obj: Mapping[str, Any]) -> str:
        """kstatus's status of one object."""
        return self.compute([obj])[0].status


def kstatus_binary(tmp_path_factory: pytest.TempPathFactory) -> Kstatus:
    """The program for a test session; the first run builds it, later runs reuse the cache."""
    log_path = tmp_path_factory.mktemp("kstatus") / "build.log"
    with log_path.open("w", encoding="utf-8") as log:
        try:
            return Kstatus(ensure_kstatus(log=log))
        except BuildError as err:
            pytest.fail(f"{err}\n{log_path.read_text()[-4000:]}", pytrace=False)
