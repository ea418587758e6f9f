"""Building an image's filesystem from its Dockerfile without a Docker engine, and running it.

There is no Docker engine on the project's machines (``docs/development.md``, "Images"), so
:func:`build_image` carries out the stages of ``images/*/Dockerfile`` itself, as root:

- ``FROM`` starts from ``scratch``, an earlier stage, or a base image that
  :mod:`helmhive.devcluster.rootfs_bases` makes and caches: ``debian:*-slim`` is a
  ``debootstrap --variant=minbase`` tree, ``node:*-bookworm-slim`` that tree plus Node.js;
- ``RUN`` runs ``/bin/sh -c`` chrooted into the stage's tree (network shared, the host's DNS
  configuration bound in), ``COPY`` copies from the build context (``.dockerignore`` applies) or
  from another stage, and ``ENV``/``USER``/``WORKDIR``/``ENTRYPOINT``/``CMD`` are recorded.

The result is ``<output>/rootfs`` and ``<output>/config.json`` (user, environment, entrypoint,
cmd, working directory). :func:`run_image` runs it like a container with
``readOnlyRootFilesystem: true``: the tree read-only, ``/tmp`` a tmpfs, volumes bound in, and
the command as the image's user (:mod:`helmhive.devcluster.rootfs_exec`). Every step prints
what it does to the ``log``.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from helmhive.devcluster import dockerfile as df
from helmhive.devcluster.rootfs_bases import (
    RootfsError,
    base_identity,
    copy_tree,
    ensure_base_tree,
    run_logged,
    say,
)
from helmhive.devcluster.rootfs_cache import (
    cache_enabled,
    decide_cacheable,
    digest_stage_inputs,
    restore_stage,
    store_stage,
)
from helmhive.devcluster.rootfs_exec import inside

__all__ = [
    "DEFAULT_PATH",
    "Bind",
    "ImageConfig",
    "RootfsError",
    "build_image",
    "image_command",
    "run_image",
]

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass
class ImageConfig:
    """What a container runtime takes from an image: its user, environment and command."""

    env: dict[str, str] = field(default_factory=lambda: {"PATH": DEFAULT_PATH})
    user: str = "0"
    workdir: str = "/"
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ImageConfig:
        return cls(**data)

    def ids(self) -> tuple[int, int]:
        """Numeric (uid, gid) of ``user`` (the project's Dockerfiles write ``USER uid:gid``)."""
        uid, _, gid = self.user.partition(":")
        if not uid.isdigit() or not (gid or uid).isdigit():
            raise RootfsError(f"USER {self.user!r}: only numeric uid[:gid] is supported")
        return int(uid), int(gid or uid)


@dataclass(frozen=True)
class Bind:
    source: Path
    target: str
    read_only: bool = False


def _copy_from_context(context: Path, rules: list[df.IgnoreRule], sources: list[str], dest: str, tree: Path) -> int:
    """COPY from the build context: a directory's contents, or files; owned by root. Returns files copied."""
    copied = 0
    into_dir = dest.endswith("/") or len(sources) > 1
    for source in sources:
        relative = source.strip("/")
        origin = context / relative
        if not origin.exists() or df.decide_ignored(rules, relative):
            raise RootfsError(f"COPY {source}: not in the build context (missing, or left out by .dockerignore)")
        target = inside(tree, dest)
        if origin.is_dir():
            for path in sorted(origin.rglob("*")):
                rel = path.relative_to(context).as_posix()
                if df.decide_ignored(rules, rel) or path.is_dir():
                    continue
                out = target / path.relative_to(origin)
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, out, follow_symlinks=False)
                os.lchown(out, 0, 0)
                copied += 1
        else:
            out = target / origin.name if into_dir else target
            out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, out)
            os.chown(out, 0, 0)
            copied += 1
    return copied


def _copy_from_stage(stage_tree: Path, sources: list[str], dest: str, tree: Path) -> None:
    for source in sources:
        origin = inside(stage_tree, source)
        target = inside(tree, dest)
        if origin.is_dir():
            copy_tree(origin, target)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-a", str(origin), str(target)], check=True)


def exec_command(spec: dict[str, Any]) -> list[str]:
    """The command that runs ``spec`` (see :mod:`helmhive.devcluster.rootfs_exec`) in a new mount namespace."""
    for tool in ("unshare", "mount"):
        if shutil.which(tool) is None:
            raise RootfsError(f"{tool} is not on PATH (util-linux / mount)")
    if os.geteuid() != 0:
        raise RootfsError("building or running an image tree needs root (mounts and chroot)")
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        sys.executable,
        "-m",
        "helmhive.devcluster.rootfs_exec",
        json.dumps(spec),
    ]


BUILD_CA_TARGET = "/run/helmhive-build/ca-certificates.crt"
"""Where RUN steps see the host's CA bundle (:func:`_build_ca`); never part of the image."""
_CA_VARIABLES = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "NPM_CONFIG_CAFILE")


def _build_ca() -> Path | None:
    """The host's CA bundle (``$HELMHIVE_BUILD_CA_FILE``, else Debian's), for networks that inspect TLS."""
    path = Path(os.environ.get("HELMHIVE_BUILD_CA_FILE") or "/etc/ssl/certs/ca-certificates.crt")
    return path if path.is_file() else None


def _build_mounts() -> tuple[list[dict[str, Any]], dict[str, str]]:
    """What a RUN step gets from the host, as ``docker build`` would: DNS, hosts, and the CA bundle."""
    binds = [
        {"source": path, "target": path, "read_only": True}
        for path in ("/etc/resolv.conf", "/etc/hosts")
        if Path(path).exists()
    ]
    env: dict[str, str] = {}
    ca = _build_ca()
    if ca is not None:
        binds.append({"source": str(ca), "target": BUILD_CA_TARGET, "read_only": True})
        env = dict.fromkeys(_CA_VARIABLES, BUILD_CA_TARGET)
    return binds, env


def build_image(
    dockerfile: Path,
    *,
    context: Path,
    target: str,
    output: Path,
    log: IO[str],
    build_args: dict[str, str] | None = None,
) -> ImageConfig:
    """Carry out ``target``'s stages of ``dockerfile``; the tree goes to ``output/rootfs``."""
    global_args, stages = df.parse_dockerfile(dockerfile.read_text(encoding="utf-8"), build_args)
    order = df.decide_stage_order(stages, target)
    ignore = context / ".dockerignore"
    rules = df.build_ignore_rules(ignore.read_text(encoding="utf-8")) if ignore.exists() else []
    work = output.with_name(output.name + ".stages")
    shutil.rmtree(work, ignore_errors=True)
    trees: dict[str, Path] = {}
    configs: dict[str, ImageConfig] = {}
    steps = sum(len(stage.instructions) + 1 for stage in order)
    step = 0
    started = time.monotonic()
    keys: dict[str, str] = {}
    use_cache = cache_enabled()
    for stage in order:
        step += 1
        tree = work / stage.ref
        say(log, f"[{step}/{steps}] stage {stage.ref}: FROM {stage.base}")
        base_key = keys[stage.base] if stage.base in keys else base_identity(stage.base)
        keys[stage.ref] = digest_stage_inputs(
            stage, base_key, build_args=build_args or {}, context=context, rules=rules, stage_keys=keys
        )
        cacheable = use_cache and decide_cacheable(stage)
        cached = restore_stage(dockerfile, stage, keys[stage.ref], tree, log) if cacheable else None
        if cached is not None:
            step += len(stage.instructions)
            trees[stage.ref] = tree
            configs[stage.ref] = ImageConfig.from_json(cached)
            continue
        ensure_base_tree(stage.base, trees, tree, log)
        inherited = configs.get(stage.base)
        config = ImageConfig.from_json(json.loads(json.dumps(inherited.to_json()))) if inherited else ImageConfig()
        args: dict[str, str] = {}
        for instruction in stage.instructions:
            step += 1
            text = " ".join(instruction.args.split())
            say(log, f"[{step}/{steps}] {instruction.keyword} {text[:110]}{'…' if len(text) > 110 else ''}")
            _apply(
                instruction,
                tree,
                config=config,
                args=args,
                global_args=global_args,
                build_args=build_args or {},
                trees=trees,
                context=context,
                rules=rules,
                log=log,
            )
        trees[stage.ref] = tree
        configs[stage.ref] = config
        if cacheable:
            store_stage(dockerfile, stage, keys[stage.ref], tree, config=config.to_json(), log=log)
    final = trees[order[-1].ref]
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    final.rename(output / "rootfs")
    (output / "config.json").write_text(json.dumps(configs[order[-1].ref].to_json(), indent=2), encoding="utf-8")
    shutil.rmtree(work, ignore_errors=True)
    say(log, f"target {target} of {dockerfile} built in {time.monotonic() - started:.1f} s: {output / 'rootfs'}")
    return configs[order[-1].ref]


def _apply(
    instruction: df.Instruction,
    tree: Path,
    *,
    config: ImageConfig,
    args: dict[str, str],
    global_args: dict[str, str],
    build_args: dict[str, str],
    trees: dict[str, Path],
    context: Path,
    rules: list[df.IgnoreRule],
    log: IO[str],
) -> None:
    values = {**args, **config.env}
    keyword = instruction.keyword
    if keyword == "ARG":
        name, sep, default = instruction.args.partition("=")
        args[name] = build_args.get(name, default if sep else global_args.get(name, ""))
    elif keyword == "ENV":
        config.env.update(df.parse_env(instruction, values))
    elif keyword == "LABEL":
        config.labels.update(df.parse_env(instruction, values))
    elif keyword == "USER":
        config.user = df.substitute(instruction.args, values)
    elif keyword == "WORKDIR":
        config.workdir = df.substitute(instruction.args, values)
        inside(tree, config.workdir).mkdir(parents=True, exist_ok=True)
    elif keyword in ("ENTRYPOINT", "CMD"):
        command = df.parse_exec_form(instruction)
        if keyword == "ENTRYPOINT":
            config.entrypoint, config.cmd = command, []
        else:
            config.cmd = command
    elif keyword == "COPY":
        source_stage, sources, dest = df.parse_copy(instruction)
        sources = [df.substitute(s, values) for s in sources]
        dest = df.substitute(dest, values)
        if not dest.startswith("/"):  # relative to WORKDIR, as in Docker ("./" keeps its trailing slash)
            dest = posixpath.join(config.workdir, dest)
        if source_stage is None:
            count = _copy_from_context(context, rules, sources, dest, tree)
            say(log, f"    {count} files from the build context")
        elif source_stage in trees:
            _copy_from_stage(trees[source_stage], sources, dest, tree)
        else:
            raise RootfsError(f"line {instruction.line}: COPY --from={source_stage}: no such earlier stage")
    elif keyword == "RUN":
        uid, gid = config.ids()
        binds, ca_env = _build_mounts()
        spec = {
            "root": str(tree),
            "read_only": False,
            "binds": binds,
            "uid": uid,
            "gid": gid,
            "cwd": config.workdir,
            "env": {**ca_env, **args, **config.env},
            "argv": ["/bin/sh", "-c", instruction.args],
        }
        try:
            run_logged(exec_command(spec), log, f"line {instruction.line}: RUN")
        finally:
            shutil.rmtree(tree / BUILD_CA_TARGET.lstrip("/")[: -len("/ca-certificates.crt")], ignore_errors=True)


def image_command(config: ImageConfig, args: Sequence[str] | None) -> list[str]:
    """ENTRYPOINT + (``args`` or CMD), as ``docker run IMAGE [args]``."""
    return [*config.entrypoint, *(config.cmd if args is None else args)]


def run_image(
    image: Path,
    args: Sequence[str] | None = None,
    *,
    env: dict[str, str] | None = None,
    binds: Sequence[Bind] = (),
    tmpfs: Sequence[str] = ("/tmp",),
    entrypoint: Sequence[str] | None = None,
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
) -> subprocess.Popen[bytes]:
    """Start the image at ``image`` (from :func:`build_image`) with a read-only root, as its user.

    ``binds`` are the pod's volumes; ``tmpfs`` paths get an empty tmpfs (an emptyDir).
    """
    config = ImageConfig.from_json(json.loads((image / "config.json").read_text(encoding="utf-8")))
    if entrypoint is not None:  # docker run --entrypoint: the image's CMD no longer applies
        config.entrypoint, config.cmd = list(entrypoint), []
    uid, gid = config.ids()
    spec = {
        "root": str(image / "rootfs"),
        "read_only": True,
        "binds": [{"source": str(b.source), "target": b.target, "read_only": b.read_only} for b in binds],
        "tmpfs": list(tmpfs),
        "uid": uid,
        "gid": gid,
        "cwd": config.workdir,
        "env": {**config.env, **(env or {})},
        "argv": image_command(config, args),
    }
    return subprocess.Popen(exec_command(spec), stdout=stdout, stderr=stderr)
