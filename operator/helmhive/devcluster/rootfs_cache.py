"""The stage cache of the rootfs builder: a finished stage is reused while its inputs are unchanged.

``docker build`` reuses a layer while the instruction and everything it reads are the same; this
is that rule at the granularity of a whole stage. A stage's **key** is a SHA-256 over:

- the builder's cache format version and the build arguments in effect;
- its base: the key of an earlier stage, or a known base image's identity *as resolved* (the
  Debian point release the mirror serves, the Node.js and npm versions), so a new point release
  is a new key;
- each instruction's keyword and text, in order;
- for ``COPY`` from the build context, the relative path, mode and content of every file it copies
  (``.dockerignore`` applied); for ``COPY --from``, the key of that stage.

So a stage that copies the project's sources gets a new key with every change to them, and one that
only installs Debian or npm packages keeps its key until its instructions, its lock file or its base
change. Only stages with a ``RUN`` are stored (anything else is cheap to redo). One entry is kept
per (Dockerfile, stage): storing a stage replaces its older entry, so the cache holds at most one
tree per stage of each Dockerfile. An entry is written beside its place and renamed into it, under
the entry's lock (:mod:`helmhive.devcluster.cachelock`); an entry without its stamp is not used.

What this trusts, like Docker's cache: a ``RUN`` gives the same result while its text and inputs are
the same, so a ``RUN apt-get install`` is not repeated to pick up a newer package of the same
point release. ``HELMHIVE_ROOTFS_NO_CACHE=1`` turns the cache off (``docker build --no-cache``).

``build_*``/``decide_*`` are pure; ``digest_context_files`` reads files; ``restore_*``/``store_*``
write the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import IO, Any

from helmhive.devcluster import dockerfile as df
from helmhive.devcluster.cachelock import cache_entry_lock
from helmhive.devcluster.rootfs_bases import copy_tree, rootfs_cache_dir, say

__all__ = [
    "CACHE_FORMAT",
    "StageKey",
    "cache_enabled",
    "decide_cacheable",
    "digest_context_files",
    "digest_stage_inputs",
    "restore_stage",
    "store_stage",
]

CACHE_FORMAT = "helmhive-rootfs-stage-v1"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def cache_enabled() -> bool:
    return os.environ.get("HELMHIVE_ROOTFS_NO_CACHE", "") not in ("1", "true", "yes")


class StageKey:
    """The running digest of one stage's inputs (see the module docstring)."""

    def __init__(self, base_identity: str, build_args: dict[str, str]) -> None:
        self._hash = hashlib.sha256()
        self._feed(CACHE_FORMAT, json.dumps(build_args, sort_keys=True), base_identity)

    def _feed(self, *parts: str) -> None:
        for part in parts:
            data = part.encode("utf-8")
            self._hash.update(len(data).to_bytes(8, "big"))
            self._hash.update(data)

    def add_instruction(self, instruction: df.Instruction, *inputs: str) -> None:
        self._feed(instruction.keyword, instruction.args, *inputs)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def decide_cacheable(stage: df.Stage) -> bool:
    """A stage is worth storing when it runs something; copies and settings are cheap to redo.

    A stage whose ``COPY`` names its sources through a variable is never cached: the key is
    computed before the stage runs, when only the build arguments are known (fail closed).
    """
    runs = any(instruction.keyword == "RUN" for instruction in stage.instructions)
    variable_copy = any(i.keyword == "COPY" and "$" in i.args for i in stage.instructions)
    return runs and not variable_copy


def digest_stage_inputs(
    stage: df.Stage,
    base_key: str,
    *,
    build_args: dict[str, str],
    context: Path,
    rules: list[df.IgnoreRule],
    stage_keys: dict[str, str],
) -> str:
    """The stage's key: its base, instructions, and what each ``COPY`` reads (module docstring)."""
    key = StageKey(base_key, build_args)
    for instruction in stage.instructions:
        if instruction.keyword != "COPY":
            key.add_instruction(instruction)
            continue
        source_stage, sources, _ = df.parse_copy(instruction)
        if source_stage is None:
            key.add_instruction(instruction, digest_context_files(context, rules, sources))
        else:
            key.add_instruction(instruction, stage_keys.get(source_stage, f"unknown stage {source_stage}"))
    return key.hexdigest()


def digest_context_files(context: Path, rules: list[df.IgnoreRule], sources: list[str]) -> str:
    """Digest of what ``COPY sources`` takes from the context: paths, modes and contents, in order."""
    digest = hashlib.sha256()
    for source in sources:
        relative = source.strip("/")
        origin = context / relative
        paths = sorted(origin.rglob("*")) if origin.is_dir() else [origin]
        for path in paths:
            rel = path.relative_to(context).as_posix()
            if path.is_dir() or df.decide_ignored(rules, rel) or not path.exists():
                continue
            digest.update(f"{rel}\0{path.lstat().st_mode:o}\0".encode())
            digest.update(os.readlink(path).encode() if path.is_symlink() else path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def _slot(dockerfile: Path, stage: df.Stage) -> Path:
    name = _SAFE.sub("_", f"{dockerfile.parent.name}-{dockerfile.name}-{stage.ref}")
    return rootfs_cache_dir() / "stages" / name


def restore_stage(dockerfile: Path, stage: df.Stage, key: str, tree: Path, log: IO[str]) -> dict[str, Any] | None:
    """Fill ``tree`` from the cached stage with ``key``; its image config, or None on a miss."""
    slot = _slot(dockerfile, stage)
    with cache_entry_lock(slot, log, what=f"the cached stage {stage.ref}"):
        try:
            recorded = json.loads((slot / "stamp.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if recorded.get("key") != key or not (slot / "rootfs").is_dir():
            return None
        copy_tree(slot / "rootfs", tree)
    say(log, f"    stage {stage.ref} from the cache (inputs unchanged, key {key[:12]})")
    config: dict[str, Any] = recorded["config"]
    return config


def store_stage(
    dockerfile: Path, stage: df.Stage, key: str, tree: Path, *, config: dict[str, Any], log: IO[str]
) -> None:
    """Keep ``tree`` as the cached stage (replacing the stage's older entry)."""
    slot = _slot(dockerfile, stage)
    with cache_entry_lock(slot, log, what=f"the cached stage {stage.ref}"):
        partial = slot.with_name(slot.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        copy_tree(tree, partial / "rootfs")
        (partial / "stamp.json").write_text(json.dumps({"key": key, "config": config}), encoding="utf-8")
        shutil.rmtree(slot, ignore_errors=True)
        partial.rename(slot)
    say(log, f"    stage {stage.ref} stored in the cache (key {key[:12]})")
