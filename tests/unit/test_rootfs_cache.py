"""The rootfs builder's stage cache: what changes a stage's key, and one stored tree per stage."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from helmhive.devcluster import dockerfile as df
from helmhive.devcluster.rootfs_cache import decide_cacheable, digest_stage_inputs, restore_stage, store_stage

DOCKERFILE = """\
FROM debian:12.15-slim AS python
RUN apt-get update
FROM python AS deps
COPY images/constraints.txt /src/constraints.txt
RUN pip install -r /src/constraints.txt
FROM deps AS build
COPY operator /src/operator
COPY --from=python /etc/os-release /etc/os-release
RUN pip wheel /src
FROM build AS final
ENV A=1
"""


def _stages() -> dict[str, df.Stage]:
    _, stages = df.parse_dockerfile(DOCKERFILE, None)
    return {stage.ref: stage for stage in stages}


def _context(tmp_path: Path) -> Path:
    context = tmp_path / "context"
    (context / "images").mkdir(parents=True)
    (context / "images/constraints.txt").write_text("a==1\n")
    (context / "operator/pkg").mkdir(parents=True)
    (context / "operator/pkg/mod.py").write_text("x = 1\n")
    (context / "operator/pkg/mod.pyc").write_bytes(b"\0")
    return context


def _key(stage: df.Stage, context: Path, *, base: str = "debian 12.15", keys: dict[str, str] | None = None) -> str:
    rules = df.build_ignore_rules("**/*.pyc\n")
    return digest_stage_inputs(stage, base, build_args={}, context=context, rules=rules, stage_keys=keys or {})


def test_a_stage_key_follows_exactly_what_the_stage_reads(tmp_path: Path) -> None:
    stages, context = _stages(), _context(tmp_path)
    deps, build = stages["deps"], stages["build"]
    keys = {"python": "k-python"}
    before = (_key(deps, context), _key(build, context, keys=keys))
    assert before == (_key(deps, context), _key(build, context, keys=keys))  # deterministic

    (context / "operator/pkg/mod.pyc").write_bytes(b"changed")  # left out by .dockerignore
    assert (_key(deps, context), _key(build, context, keys=keys)) == before

    (context / "operator/pkg/mod.py").write_text("x = 2\n")  # a source the build stage copies
    assert _key(deps, context) == before[0]
    assert _key(build, context, keys=keys) != before[1]

    after_source = _key(build, context, keys=keys)
    os.chmod(context / "operator/pkg/mod.py", 0o755)  # a mode is an input too
    assert _key(build, context, keys=keys) != after_source

    (context / "images/constraints.txt").write_text("a==2\n")  # the pins the deps stage copies
    assert _key(deps, context) != before[0]

    assert _key(deps, context, base="debian 12.16") != _key(deps, context)  # a new point release
    moved = _key(build, context, keys={"python": "k-other"})  # the stage it copies from changed
    assert moved != _key(build, context, keys=keys)


def test_only_stages_that_run_something_are_stored() -> None:
    stages = _stages()
    assert decide_cacheable(stages["python"]) and decide_cacheable(stages["build"])
    assert not decide_cacheable(stages["final"])
    _, variable = df.parse_dockerfile("FROM debian:12.15-slim\nARG SRC=x\nCOPY $SRC /x\nRUN true\n", None)
    assert not decide_cacheable(variable[0])  # its sources are only known while it runs


def test_a_stored_stage_is_restored_only_for_its_key_and_replaces_the_older_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HELMHIVE_CACHE_DIR", str(tmp_path / "cache"))
    stage, dockerfile, log = _stages()["deps"], tmp_path / "images/runner/Dockerfile", io.StringIO()
    tree = tmp_path / "tree"
    (tree / "opt").mkdir(parents=True)
    (tree / "opt/venv").write_text("one")
    store_stage(dockerfile, stage, "key-1", tree, config={"user": "0"}, log=log)
    (tree / "opt/venv").write_text("two")
    store_stage(dockerfile, stage, "key-2", tree, config={"user": "65532"}, log=log)

    assert restore_stage(dockerfile, stage, "key-1", tmp_path / "miss", log) is None  # replaced
    assert not (tmp_path / "miss").exists()
    config = restore_stage(dockerfile, stage, "key-2", tmp_path / "hit", log)
    assert config == {"user": "65532"}
    assert (tmp_path / "hit/opt/venv").read_text() == "two"
    slots = [p.name for p in (tmp_path / "cache/rootfs/stages").iterdir() if p.is_dir()]
    assert slots == ["runner-Dockerfile-deps"]
    assert "stage deps from the cache" in log.getvalue()
