"""The runner stops cleanly: no thread and no child process of its outlives its main loop.

A CI run saw the runner log ``runner stopped`` (Lease released) after SIGTERM and then die of
SIGABRT, with nothing in its log. The cause: its watch threads were still reading from the API
server over TLS while the interpreter finalized and OpenSSL cleaned up at ``exit()``
(docs/runners.md, "Stopping"). These tests pin what prevents it, each on real parts: the runner
program against the real API server with real signals, a real watch, a real child process.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx

from harness import wait_for
from harness.kube import Kube
from harness.operator import free_port
from helmhive.runner.adapters.claude_process import ClaudeCliConfig, run_short
from helmhive.runner.kube import RunnerKube
from helmhive.runner.metrics import serve_metrics

from .program_harness import RunnerProc, RunnerRig, reference_runner_json


def _exit_line(proc: RunnerProc) -> dict[str, Any]:
    lines = proc.lines()
    assert lines, proc.raw_log()[-3000:]
    return lines[-1]


def _assert_clean_exit(proc: RunnerProc, code: int) -> None:
    log = proc.raw_log()
    assert code == 0, f"the runner exited with {code} after SIGTERM:\n{log[-4000:]}"
    last = _exit_line(proc)
    assert last["message"] == "runner exiting", log[-3000:]
    assert last["exitCode"] == 0 and last["threads"] == [], last
    assert not proc.messages("watch threads did not stop in time"), log[-3000:]
    stopped = proc.messages("runner stopped")
    assert stopped and stopped[-1]["leaseReleased"] is True, log[-3000:]
    assert "Fatal Python error" not in log and "Current thread" not in log, log[-4000:]


def test_sigterm_right_after_registration_joins_every_thread(rig: RunnerRig) -> None:
    """The moment the image test stops its runner: the watches have only just started."""
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state))
    rig.wait_registered(proc)
    proc.terminate()
    _assert_clean_exit(proc, proc.wait(timeout=90))
    assert not rig.lease_exists()


def test_sigterm_while_the_watches_wait_for_events_joins_every_thread(rig: RunnerRig) -> None:
    """Later, both watches block in a read that lasts up to 30 s; the stop interrupts it."""
    proc = rig.start(reference_runner_json(agent_state=rig.agent_state))
    rig.wait_registered(proc)
    rig.wait_events("Registered")
    # Something the Runner watch sees: it is past its list and streaming.
    rig.set_control_state("Draining")
    wait_for(lambda: proc.messages("control state changed"), timeout=30, describe="the runner to see Draining")
    proc.terminate()
    _assert_clean_exit(proc, proc.wait(timeout=90))


def test_a_watch_blocked_in_a_long_read_is_interrupted_and_joined(kube: Kube, namespace: str, crds: list[str]) -> None:
    """A watch with nothing to report would block for its whole ``timeout_s``; join() ends it at once."""
    import threading

    runner_kube = RunnerKube(kube.api_client, namespace=namespace)
    listed = threading.Event()
    errors: list[Any] = []
    handle = runner_kube.watch_objects(
        "runners",
        field_selector="metadata.name=nobody",
        on_event=lambda kind, obj: None,
        on_list=lambda items: listed.set(),
        on_error=errors.append,
        stop=threading.Event(),
        timeout_s=600,
        thread_name="watch-test",
    )
    assert listed.wait(60), errors
    # Let the watch request reach the API server and block in its read (nothing will come).
    wait_for(lambda: handle._stream is not None and handle._stream._resp is not None, timeout=30)
    assert handle.join(timeout=60), "the watch thread is still blocked in its read"
    assert not handle.alive()
    assert errors == []


def test_a_list_asked_of_a_quiet_watch_is_made_at_once(kube: Kube, namespace: str, crds: list[str]) -> None:
    """A watch with nothing to report would wait for an event or a bookmark; relist() ends its read now."""
    import threading

    runner_kube = RunnerKube(kube.api_client, namespace=namespace)
    lists: list[int] = []
    errors: list[Any] = []
    handle = runner_kube.watch_objects(
        "runners",
        field_selector="metadata.name=nobody",
        on_event=lambda kind, obj: None,
        on_list=lambda items: lists.append(len(items)),
        on_error=errors.append,
        stop=threading.Event(),
        timeout_s=600,
        thread_name="watch-test",
    )
    try:
        wait_for(lambda: lists, timeout=60, describe="the first list")
        # The watch request is answered and its read blocks (nothing will come for a minute,
        # when the API server's first bookmark is due).
        wait_for(lambda: handle._response is not None, timeout=30, describe="the watch to be answered")
        handle.relist()
        # Without the interruption the list would wait for that bookmark.
        wait_for(lambda: len(lists) >= 2, timeout=20, describe="the list asked for")
        assert errors == []
    finally:
        assert handle.join(timeout=60)


async def test_a_cancelled_short_cli_run_kills_and_reaps_its_process(tmp_path: Path) -> None:
    """The probe's commands (``claude --version``, ...) cancelled mid-run leave no process behind."""
    marker = f"helmhive-shutdown-test-{os.getpid()}"
    config = ClaudeCliConfig(path=sys.executable, request_timeout_s=600, cwd=str(tmp_path))
    task = asyncio.create_task(run_short(config, "-c", "import time, sys; time.sleep(600)", marker))

    def child() -> int:
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if marker.encode() in cmdline:
                    return int(entry.name)
        raise AssertionError("the child has not started yet")

    pid = await asyncio.to_thread(wait_for, child, timeout=30)
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("run_short returned instead of being cancelled")
    # Killed and reaped: not running, not a zombie -- its pid is gone.
    assert _process_gone(pid)


def _process_gone(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    assert not status.exists(), status.read_text()
    return True


def test_the_metrics_server_stops_and_its_thread_ends() -> None:
    port = free_port()
    server = serve_metrics(addr="127.0.0.1", port=port)
    assert server is not None
    assert "helmhive_runner_heartbeats_total" in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    assert server.close()
    assert not server.thread.is_alive()
    try:
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    except httpx.ConnectError:
        pass
    else:
        raise AssertionError("/metrics still answers after close()")


def test_a_thread_left_at_exit_is_named_and_the_interpreter_is_not_finalized_around_it(tmp_path: Path) -> None:
    """The fail-safe: a thread still running is named in the last line; atexit never runs."""
    script = textwrap.dedent(
        """
        import atexit, sys, threading, time
        from helmhive.runner.logs import configure_logging
        from helmhive.runner.program.process import exit_process
        configure_logging()
        atexit.register(lambda: sys.stderr.write("finalized\\n"))
        threading.Thread(target=time.sleep, args=(600,), name="straggler", daemon=True).start()
        sys.exit(exit_process(0, runner="r"))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert '"message": "runner exiting"' in done.stderr and '"threads": ["straggler"]' in done.stderr, done.stderr
    assert "finalized" not in done.stderr, done.stderr
