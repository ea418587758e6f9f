"""Each public name in the two programs means one thing (issue 9 §2: no second ``RunnerView``).

A class, or a module-level function, defined under the same public name in two modules of
``operator/`` and ``runner/`` is a trap for the reader and for imports. The allowed repeats are
conventions where the name means the same thing in each module, listed with the reason.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = (REPO / "operator" / "helmhive", REPO / "runner" / "helmhive")

SAME_MEANING = {
    "register": "each controller module registers its own Kopf handlers",
    "main": "a program's entry point",
    "run": "a CLI command's function (typer names the command)",
    "start": "used qualified: a job's start step (policy.agentjob_steps), the dev cluster's start",
    "fail": "used qualified: a job's fail step, the CLI's exit with a message",
    "status": "used qualified: the dev cluster's status, `helmhive change status`",
    "serve_metrics": "each program serves its own /metrics",
    "load_api_client": "a kubernetes ApiClient from a kubeconfig; the CLI's adds its timeout",
    "is_compact_prompt": "whether a prompt is the agent's /compact command, for each agent that has one",
}


def _public_definitions() -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for root in ROOTS:
        for path in sorted(root.rglob("*.py")):
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in tree.body:
                defines = isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                if defines and not node.name.startswith("_"):
                    where[node.name].append(f"{path.relative_to(REPO)}:{node.lineno}")
    return where


def test_no_two_modules_define_the_same_public_class_or_function_name() -> None:
    where = _public_definitions()
    assert len(where) > 500, "the scan found the sources"
    repeated = {name: places for name, places in where.items() if len(places) > 1 and name not in SAME_MEANING}
    assert repeated == {}, "rename one of each, so that each name means one thing"


def test_every_allowed_repeat_is_still_repeated() -> None:
    where = _public_definitions()
    stale = sorted(name for name in SAME_MEANING if len(where.get(name, ())) < 2)
    assert stale == [], "drop these from SAME_MEANING: each is defined once now"
