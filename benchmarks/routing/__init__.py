"""Benchmark: how fast the operator routes a burst of queued jobs, and what it costs the API server.

Run by hand (pytest does not collect it)::

    .venv/bin/python benchmarks/bench_routing.py --jobs 2000 --runners 200 --concurrency 10

It starts its own local control plane (``helmhive.devcluster``) in a temporary directory,
installs Helmhive and then, in one run:

1. **raw patch rates**: before the operator starts, a plain client (httpx, admin certificate,
   ``--writers`` requests in flight) merge-patches the status of scratch AgentJobs for
   ``--raw-seconds``: a tiny status (two counters; the issue's raw rate, also one at a time),
   then a status the shape and size of the router's write (the binding, ``MAX_CANDIDATES``
   candidate rows, the assignment, Routed/Ready; built by the router's pure core,
   :func:`build_like_router_status`: the like-for-like rate), the same status as a conditional
   PUT of the whole status (as the router writes it), then the tiny status again on the
   same jobs, which now hold a routed-size status (the API server's cost follows the stored
   object), and last the tiny status on fresh jobs again (how steady the raw rate was); the
   tiny patch first runs untimed for ``--raw-warmup`` seconds, since a control plane just
   started may serve it slower than a moment later; the scratch jobs are deleted again (and,
   after everything else, with the operator stopped, the tiny patch runs once more on fresh
   jobs: the machine's speed drifts over minutes, and the backlog's ratio is also given against
   the mean of the rates before and after it);
2. starts the real operator (its own ServiceAccount token) and M runners in pools of up to
   100, each writing its Runner, report and Lease as its own Pod (``runner_fleet``), reporting
   ``--concurrency`` slots; waits until all are schedulable;
3. **the burst**: creates N AgentJobs as fast as the client can (16 in flight) and watches
   them; for each job it records when the create returned, when the watch first showed its
   profile bound (the queue step) and when it first showed ``status.assignment``;
4. reports jobs routed per second, p50/p95 queue-to-assigned latency, API mutating calls per
   job (``apiserver_request_total``, by resource), the operator's RSS, routing throughput as
   a ratio of the raw patch rate and of the like-for-like rate, and how many runners ended over
   their concurrency (must be 0);
4a. **where the CPU goes**: the CPU seconds (``/proc/PID/stat``) of this cluster's kube-apiserver
   and etcd (their pid records), the operator and the bench process, and the machine's busy
   cores (``/proc/stat``), per patch in each raw phase and per routed job in the burst (first
   create to last assignment) and, with ``--backlog``, from the first assignment to the last;
5. **decide_route alone**: the pure decision for one job over 1,000 runners, timed in-process.

``--raw-only`` runs the raw phases alone; ``--raw-status`` has them write a smaller status than
the router's (:data:`RAW_STATUSES`), to bound what a smaller status could gain; and
``--apiserver-profile DIR`` has the API server serve its Go profiles and writes its CPU profile
of each raw phase into ``DIR`` (``go tool pprof -top <kube-apiserver> DIR/apiserver-tiny.pb.gz``).

The modules, one concern each (the package is imported with ``benchmarks/`` on ``sys.path``, as
the script beside it runs, so it imports its siblings ``bench_runners`` and ``runner_fleet``
as they do):

- ``settings``: the names and shapes every phase shares (namespaces, the bench Profile, the
  runners' labels and models, a job's body); no I/O;
- ``cli``: the command line;
- ``baseline``: the raw-rate baseline (phase 1), the denominators of the ratios;
- ``fleet``: the RunnerPools and the simulated runners (phase 2);
- ``burst``: the jobs, as a burst, at a steady rate or as a backlog, watched until assigned (phase 3);
- ``process``: the operator under test as a process: started, stopped, profiled, restarted;
- ``decision``: ``decide_route`` timed in-process (phase 5); no cluster;
- ``report``: the figures computed from a run's result and the printed report; no I/O;
- ``main``: one run, in that order, against its own control plane.
"""
