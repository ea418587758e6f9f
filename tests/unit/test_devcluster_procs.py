"""Process bookkeeping of the local control plane, with real (tiny) processes."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from harness import wait_for
from helmhive.devcluster import cluster, procs
from helmhive.devcluster.build import Binaries

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def test_free_ports_are_distinct_and_bindable() -> None:
    ports = procs.free_ports(4)
    assert len(set(ports)) == 4
    assert all(1024 < p < 65536 for p in ports)


def test_terminate_stops_the_recorded_process_only(tmp_path: Path) -> None:
    record = procs.spawn("sleeper", SLEEPER, log_path=tmp_path / "sleeper.log", pid_dir=tmp_path / "pids")
    assert procs.read_record(tmp_path / "pids", "sleeper") == record
    assert procs.is_alive(record.pid, record.start_ticks)
    impostor = replace(record, start_ticks=(record.start_ticks or 0) + 1)  # same pid, another process
    try:
        assert procs.terminate(impostor) is False
        assert procs.is_alive(record.pid, record.start_ticks)
    finally:
        assert procs.terminate(record, grace=5) is True
    assert not procs.is_alive(record.pid, record.start_ticks)


def test_log_tail_keeps_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)), encoding="utf-8")
    assert procs.log_tail(log, lines=3).splitlines() == ["line 97", "line 98", "line 99"]
    assert "no log" in procs.log_tail(tmp_path / "missing.log")


def _failing_binary(tmp_path: Path, name: str, message: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho '{message}' >&2\nexit 3\n", encoding="utf-8")
    path.chmod(0o755)
    return path


def test_start_failure_names_the_component_and_shows_its_log(tmp_path: Path) -> None:
    fake = Binaries(
        etcd=_failing_binary(tmp_path, "etcd", "etcdmain: listen tcp: bind: address already in use"),
        kube_apiserver=tmp_path / "kube-apiserver",
        kube_controller_manager=tmp_path / "kube-controller-manager",
        kubectl=tmp_path / "kubectl",
        kube_version="v1.37.2",
        etcd_version="v3.6.16",
    )
    state = tmp_path / "state"
    with pytest.raises(cluster.ClusterError) as err:
        cluster.start(fake, state, timeout=20)
    message = str(err.value)
    assert "etcd exited before it was ready" in message
    assert "address already in use" in message
    report = cluster.status(state)
    assert not report.anything_running
    assert cluster.load_info(state) is None


def test_stop_without_a_cluster_is_a_no_op(tmp_path: Path) -> None:
    assert cluster.stop(tmp_path) == []
    assert [c.detail for c in cluster.status(tmp_path).components] == ["not started"] * 3


@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signal is Linux-only")
def test_tied_processes_die_with_their_parent(tmp_path: Path) -> None:
    # The parent spawns a tied sleeper, prints its pid and exits at once.
    script = (
        "import sys, pathlib\n"
        "from helmhive.devcluster import procs\n"
        "t = pathlib.Path(sys.argv[1])\n"
        f"r = procs.spawn('s', {SLEEPER!r}, log_path=t / 's.log', pid_dir=t, tie_to_parent=True)\n"
        "print(r.pid, r.start_ticks)\n"
    )
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, check=True)
    pid, ticks = (int(x) for x in out.stdout.split())
    wait_for(lambda: not procs.is_alive(pid, ticks), timeout=30, describe=f"tied process {pid} to exit")
    assert os.path.exists(tmp_path / "s.json")
