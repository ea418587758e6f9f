"""Benchmark: how fast the operator routes a burst of queued jobs, and what it costs the API server.

Run by hand (pytest does not collect it)::

    .venv/bin/python benchmarks/bench_routing.py --jobs 2000 --runners 200 --concurrency 10

The benchmark is the package ``routing/`` beside this script: its docstring says what one run
measures, and which module owns each phase. This file is the command.
"""

from routing.main import main

if __name__ == "__main__":
    main()
