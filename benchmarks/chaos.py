"""Chaos run: the real operator, real runner pods and the local control plane, broken at random moments.

Run by hand (pytest does not collect it; ``tests/operator/test_chaos_short.py`` runs a short one)::

    .venv/bin/python benchmarks/chaos.py --seed 7 --jobs 40 --operator-kills 3 --runner-kills 2 \\
        --apiserver-restarts 1 --etcd-restarts 1 --watch-drops 1

It starts its own control plane in a temporary directory (it restarts etcd and the API server,
so it never borrows a shared one), installs Helmhive, starts the operator (through a proxy
that can cut its connections) and a RunnerPool of reference-agent runners whose pods run as
``helmhive dev run-pod`` runs them, with a canary credential. Then, with ``random.Random(seed)``
(the seed is printed; ``--seed`` replays the same schedule of faults and delays):

1. the faults (``--operator-kills`` SIGKILLs of the operator, ``--runner-kills`` SIGKILLs of a
   runner pod holding a job, ``--apiserver-restarts``, ``--etcd-restarts``, ``--watch-drops``:
   every operator connection reset) are shuffled; before each, a burst of jobs is created, and
   the fault comes a random moment later (an operator kill while the burst is being routed);
2. after each fault it waits for the part to be back and checks the invariants recorded so far
   (:mod:`chaos_invariants`: no double assignment, no over-commit in the watch history and in a
   listed sample);
3. once the faults stop, every job must end (routed and finished, or failed closed with a
   reason) within the documented bound (:meth:`ChaosOptions.bound`); then the audit (every
   assignment's ``JobRouted`` record, every runner transition's record) and a canary sweep of
   objects, Events and logs.

It prints each fault as it goes, then the counts of each fault next to the violations found,
and exits 1 if there is any. ``--fault-minutes`` (or SIGUSR1) stops the faults early; the run
then settles and checks as usual, and reports the faults it did inject.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_config import (
    FAULTS,
    GROUP,
    NS,
    POOL,
    SWEPT,
    VERSION,
    ChaosOptions,
    ChaosResult,
    canary_for,
    job_doc,
    namespace_docs,
    render,
    retrying,
)
from chaos_invariants import (
    Violation,
    check_job_audit,
    check_job_history,
    check_over_commit,
    check_runner_audit,
    check_settled,
    is_settled,
    outcome,
    sweep_canary,
)
from chaos_rig import ControlPlane, CutProxy, Operator, Recorder, RunnerPods, wait_until
from kubernetes import client


class Chaos:
    """One run (see the module docstring)."""

    def __init__(self, opts: ChaosOptions, out: Callable[[str], None] = print) -> None:
        self.opts, self.out = opts, out
        self.rng = random.Random(opts.seed)
        self.result = ChaosResult(seed=opts.seed)
        self.canary = canary_for(opts.seed)
        self.workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="helmhive-chaos-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.plane = ControlPlane(self.workdir / "cluster")
        self.created = 0
        self.started = time.monotonic()
        self.recovery: dict[str, list[float]] = {k: [] for k in FAULTS}
        self.seen: set[str] = set()
        self.routing_kills = 0
        self.fault_log: list[tuple[float, str, str]] = []
        self.stop_faults = threading.Event()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGUSR1, lambda *_: self.stop_faults.set())

    # -- set-up --------------------------------------------------------------------------------
    def setup(self) -> None:
        info = self.plane.start()
        phases = {"control plane": time.monotonic() - self.started}
        api = self.plane.api()
        self.core, self.custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        self.proxy = CutProxy(info.ports.apiserver)
        self.operator = Operator(
            self.plane,
            self.workdir,
            self.proxy.url,
            env={"HELMHIVE_ROUTING_CAPACITY_DEADLINE_SECONDS": f"{self.opts.capacity_deadline:g}"},
        )
        self.operator.start()
        wait_until(
            lambda: len(self.custom.list_cluster_custom_object(GROUP, VERSION, "envelopes")["items"]) >= 7,
            timeout=90,
            what="the operator to publish the envelopes",
        )
        phases["operator"] = time.monotonic() - self.started
        self.core.create_namespace({"metadata": {"name": NS}})
        for doc in namespace_docs(self.opts, self.canary):
            self._create(doc)
        names = [f"{POOL}-{i}" for i in range(self.opts.runners)]
        wait_until(lambda: all(self.core.read_namespaced_pod(n, NS) for n in names), timeout=90, what="the pool's pods")
        self.pods = RunnerPods(self.plane, NS, names, self.workdir / "kubelet")
        self.recorder = Recorder(api, NS)
        self.recorder.start()
        for name in names:
            self.pods.start(name)
        self.pods.settled()
        phases["runner pods"] = time.monotonic() - self.started
        wait_until(lambda: self._schedulable() == self.opts.runners, timeout=120, what="every runner Schedulable")
        phases["runners schedulable"] = time.monotonic() - self.started
        self.result.figures["setup_seconds"] = {k: round(v, 1) for k, v in phases.items()}
        self.out(
            f"set up in {time.monotonic() - self.started:.1f} s ("
            + ", ".join(f"{k} at {v:.1f} s" for k, v in phases.items())
            + f"): {self.opts.runners} runners x {self.opts.concurrency} slots; work directory {self.workdir}"
        )

    def _create(self, doc: dict[str, Any]) -> None:
        if doc["kind"] == "Secret":
            retrying(lambda: self.core.create_namespaced_secret(NS, doc))
            return
        plural = doc["kind"].lower() + "s"
        retrying(lambda: self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, plural, doc))

    def _schedulable(self) -> int:
        runners = self.custom.list_namespaced_custom_object(GROUP, VERSION, NS, "runners")["items"]
        return sum(
            any(
                c["type"] == "Schedulable" and c["status"] == "True"
                for c in (r.get("status") or {}).get("conditions") or []
            )
            for r in runners
        )

    def _jobs(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.custom.list_namespaced_custom_object(GROUP, VERSION, NS, "agentjobs")[
            "items"
        ]
        return items

    # -- faults --------------------------------------------------------------------------------
    def burst(self, count: int) -> None:
        """Create ``count`` jobs, once some runner is schedulable again (up to a minute): jobs created while
        every runner is down only fail closed ``NoEligibleRunner``, which tests nothing more."""
        with contextlib.suppress(TimeoutError):
            wait_until(lambda: self._schedulable() > 0, timeout=60, what="a schedulable runner", interval=0.5)
        for _ in range(count):
            self._create(job_doc(self.created, self.opts.job_timeout))
            self.created += 1

    def inject(self, fault: str) -> str:
        """Break one part, wait until it is back; return what was done (for the progress line)."""
        started = time.monotonic()
        if fault == "operator-kill":
            routing = self._routing()
            self.routing_kills += routing > 0
            self.operator.kill()
            time.sleep(self.rng.uniform(0, 1.0))
            live = self.operator.start()
            what = f"operator SIGKILLed with {routing} jobs being routed; live again {live:.1f} s after its start"
        elif fault == "runner-kill":
            victim, busy = self._busy_runner()
            self.pods.kill(victim)
            # Restarted later, as a kubelet would, while the run goes on: past the 5 s Lease (+2 s grace) or not.
            down = self.rng.uniform(0, self.opts.runner_down_max)
            self.pods.start(victim, delay=down)
            what = f"runner {victim} SIGKILLed {'holding a job' if busy else 'idle'}, restarting in {down:.1f} s"
        elif fault in ("apiserver-restart", "etcd-restart"):
            component = "kube-apiserver" if fault == "apiserver-restart" else "etcd"
            down = self.rng.uniform(0, 3.0)
            seconds = self.plane.restart(component, down_seconds=down)
            what = (
                f"{component} stopped in {self.plane.last_stop_seconds:.1f} s, down {down:.1f} s more, "
                f"API ready {seconds:.1f} s after the stop began"
            )
        else:
            cut = self.proxy.cut()
            what = f"{cut} operator connections reset"
        self.recovery[fault].append(time.monotonic() - started)
        self.result.faults[fault] += 1
        self.fault_log.append((round(started - self.recorder.origin, 3), fault, what))
        return what

    def _routing(self) -> int:
        """Jobs bound to a profile and not yet assigned: the router's work in hand."""
        jobs = retrying(self._jobs)
        return sum(
            1
            for j in jobs
            if "profile" in (j.get("status") or {})
            and not (j.get("status") or {}).get("assignment")
            and not is_settled(j)
        )

    def _busy_runner(self) -> tuple[str, bool]:
        """A live runner holding an unfinished job (waiting up to 10 s for one), else any live one."""
        wait_until(lambda: self.pods.pods, timeout=60, what="a runner pod to be running")

        def busy() -> str | None:
            held = [
                (j["status"] or {}).get("assignment", {}).get("runner")
                for j in self._jobs()
                if (j.get("status") or {}).get("assignment") and not is_settled(j)
            ]
            alive = sorted({r for r in held if r in self.pods.pods})
            return self.rng.choice(alive) if alive else None

        with contextlib.suppress(TimeoutError):
            return str(wait_until(busy, timeout=10, what="a busy runner", interval=0.1)), True
        return self.rng.choice(sorted(self.pods.pods)), False

    # -- checks --------------------------------------------------------------------------------
    def _add(self, found: list[Violation]) -> int:
        new = [v for v in found if str(v) not in self.seen]
        self.seen |= {str(v) for v in new}
        self.result.violations += new
        for violation in new:
            self.out(f"  VIOLATION {violation}")
        return len(new)

    def check_now(self, when: str) -> int:
        found, _, _ = check_job_history(list(self.recorder.jobs), concurrency=self.opts.concurrency)
        sample = retrying(self._jobs)
        return self._add(found + check_over_commit(sample, concurrency=self.opts.concurrency, when=when))

    def settle(self) -> list[dict[str, Any]]:
        started = time.monotonic()
        deadline = started + self.opts.bound()
        while True:
            jobs = retrying(self._jobs)
            left = [j for j in jobs if not is_settled(j)]
            if len(jobs) >= self.created and not left:
                self.result.figures["settle_seconds"] = round(time.monotonic() - started, 1)
                return jobs
            if time.monotonic() > deadline:
                self._add(check_settled(jobs, bound=self.opts.bound()))
                return jobs
            time.sleep(0.5)

    def audits(self) -> list[dict[str, Any]]:
        """The AuditRecords once every expected one is there (or ``audit_seconds`` have passed)."""
        deadline = time.monotonic() + self.opts.audit_seconds
        while True:
            records: list[dict[str, Any]] = retrying(
                lambda: self.custom.list_namespaced_custom_object(GROUP, VERSION, NS, "auditrecords")["items"]
            )
            missing = check_job_audit(self.recorder.jobs, records) + check_runner_audit(self.recorder.runners, records)
            if not missing or time.monotonic() > deadline:
                self._add(missing)
                return records
            time.sleep(1)

    def sweep(self) -> None:
        texts: dict[str, str] = {}
        for plural in SWEPT:
            items = self.custom.list_namespaced_custom_object(GROUP, VERSION, NS, plural)["items"]
            texts |= {f"{plural}/{i['metadata']['name']}": json.dumps(i) for i in items}
        api = self.core.api_client
        for kind, items in (
            ("events", self.core.list_namespaced_event(NS).items),
            ("pods", self.core.list_namespaced_pod(NS).items),
            ("configmaps", self.core.list_namespaced_config_map(NS).items),
            ("operator events", self.core.list_namespaced_event("helmhive-system").items),
        ):
            texts |= {f"{kind}/{i.metadata.name}": json.dumps(api.sanitize_for_serialization(i)) for i in items}
        texts["operator log"] = self.operator.log_path.read_text(errors="replace")
        texts |= self.pods.logs()
        self.result.figures["swept_texts"] = len(texts)
        self._add(sweep_canary(self.canary, texts))

    # -- the run -------------------------------------------------------------------------------
    def schedule(self) -> list[str]:
        o = self.opts
        faults = (
            ["operator-kill"] * o.operator_kills
            + ["runner-kill"] * o.runner_kills
            + ["apiserver-restart"] * o.apiserver_restarts
            + ["etcd-restart"] * o.etcd_restarts
            + ["watch-drop"] * o.watch_drops
        )
        self.rng.shuffle(faults)
        return faults

    def run(self) -> ChaosResult:
        self.out(f"chaos seed {self.opts.seed} (replay with --seed {self.opts.seed})")
        faults = self.schedule()
        self.setup()
        per_burst = max(1, self.opts.jobs // (len(faults) + 1))
        stop_at = self.started + 60 * self.opts.fault_minutes if self.opts.fault_minutes else float("inf")
        for index, fault in enumerate(faults, 1):
            if time.monotonic() > stop_at or self.stop_faults.is_set():
                self.out(f"stopping the faults after {index - 1} of {len(faults)} (time limit or SIGUSR1)")
                break
            self.burst(min(per_burst, self.opts.jobs - self.created))
            time.sleep(self.rng.uniform(0, self.opts.max_delay))
            what = self.inject(fault)
            new = self.check_now(f"after fault {index}")
            self.out(
                f"[{index}/{len(faults)}] {time.monotonic() - self.started:6.1f} s {fault}: {what}; "
                f"{self.created} jobs created; {new} new violations"
            )
        self.burst(self.opts.jobs - self.created)
        self.pods.settled()
        for failure in self.pods.failures:
            self.out(f"  {failure}")
        self.out(f"faults done; waiting up to {self.opts.bound():g} s for all {self.created} jobs to end")
        jobs = self.settle()
        self.check_now("at the end")
        self.audits()
        self.recorder.stop()
        with (self.workdir / "history.jsonl").open("w") as history:
            for event in [*self.recorder.jobs, *self.recorder.runners]:
                history.write(json.dumps({"type": type(event).__name__, **asdict(event)}) + "\n")
            for at, fault, what in self.fault_log:
                history.write(json.dumps({"type": "Fault", "at": at, "fault": fault, "what": what}) + "\n")
        found, requeues, peak = check_job_history(self.recorder.jobs, concurrency=self.opts.concurrency)
        self._add(found)
        self.sweep()
        self.result.outcomes = Counter(outcome(j) for j in jobs)
        self.result.figures |= {
            "jobs": len(jobs),
            "requeues": requeues,
            "requeued_jobs": sorted({e.name for e in self.recorder.jobs if e.attempts > 0}),
            "peak_jobs_on_one_runner": peak,
            "job_events": len(self.recorder.jobs),
            "runner_events": len(self.recorder.runners),
            "watch_gaps": self.recorder.gaps,
            "watch_reconnects": self.recorder.reconnects,
            "connections_cut": self.proxy.cut_connections,
            "operator_kills_while_routing": self.routing_kills,
            "runner_starts": self.pods.starts,
            "wall_seconds": round(time.monotonic() - self.started, 1),
            "recovery_seconds": {
                k: {"median": round(statistics.median(v), 1), "max": round(max(v), 1)}
                for k, v in self.recovery.items()
                if v
            },
        }
        return self.result

    def close(self) -> None:
        for part, stop in (("pods", "stop_all"), ("operator", "stop"), ("proxy", "close")):
            if hasattr(self, part):  # set up only as far as it got
                with contextlib.suppress(Exception):
                    getattr(getattr(self, part), stop)()
        self.plane.stop()


def run_chaos(opts: ChaosOptions, out: Callable[[str], None] = print, *, keep: bool = False) -> ChaosResult:
    """Run once and clean up (the work directory stays if ``keep`` or if anything was violated)."""
    chaos = Chaos(opts, out)
    try:
        result = chaos.run()
    finally:
        chaos.close()
    if not keep and not result.violations and opts.workdir is None:
        shutil.rmtree(chaos.workdir, ignore_errors=True)
    else:
        out(f"(work directory {chaos.workdir})")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    defaults = ChaosOptions(seed=0)
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: a fresh random seed)")
    for name in (
        "jobs",
        "runners",
        "concurrency",
        "operator_kills",
        "runner_kills",
        "apiserver_restarts",
        "etcd_restarts",
        "watch_drops",
    ):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    for name in (
        "job_seconds",
        "capacity_deadline",
        "settle_seconds",
        "audit_seconds",
        "max_delay",
        "runner_down_max",
        "fault_minutes",
    ):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    parser.add_argument("--json", type=Path, help="also write the result here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4), "big")
    fields = {k: v for k, v in vars(args).items() if k not in ("seed", "json", "keep")}
    result = run_chaos(ChaosOptions(seed=seed, **fields), keep=args.keep)
    print()
    print(render(result))
    if args.json:
        doc = {
            "seed": result.seed,
            "faults": dict(result.faults),
            "violations": [str(v) for v in result.violations],
            "outcomes": dict(result.outcomes),
            "figures": result.figures,
        }  # asdict would garble the Counters
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    sys.exit(1 if result.violations else 0)


if __name__ == "__main__":
    main()
