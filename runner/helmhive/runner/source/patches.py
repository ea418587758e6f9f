"""Patches of governed jobs, made and applied by the runner with git, never by the agent.

A job's checkout has its git dir outside the work tree (``SandboxPlan.git_dir``), so the agent
cannot touch what the patch is computed against. After an implementation turn
:func:`run_patch_diff` stages the whole work tree into a *private* index (``GIT_INDEX_FILE``
in the runner's scratch dir) and diffs it against the exact commit::

    git add -A                                   # tracked, new and deleted files
    git diff --cached --binary --full-index <commit>

so the patch holds every change, binary files included, and applies with ``git apply`` to a
fresh checkout of that commit. It is kept byte for byte: over :data:`PATCH_MAX_BYTES` it is
refused (``PatchTooLarge``), never cut; output that is not UTF-8 (a text file in another
encoding) is refused too (``PatchNotText``), since a ConfigMap's ``data`` holds UTF-8 text.

A review job's runner rebuilds the patched tree with :func:`run_patch_apply` (``git apply
--binary`` into its own fresh checkout; ``PatchDoesNotApply`` otherwise).

Every git command runs with a minimal environment: no system or global git config (only the
job's own git dir's), no terminal prompt, ``LC_ALL=C``. ``build_*``/``count_*`` are pure;
``run_*`` run git (synchronously: call them in a thread).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from helmhive.api.governed import PatchRef
from helmhive.api.reasons import Reason
from helmhive.policy.agentjob.results import PATCH_MAX_BYTES

__all__ = [
    "GIT_TIMEOUT_S",
    "PATCH_KEY",
    "PROMPT_PATCH_MAX_BYTES",
    "ComputedPatch",
    "GitFailed",
    "GitTree",
    "PatchError",
    "build_patch_ref",
    "build_patch_section",
    "build_tree_git_env",
    "count_patch_files",
    "run_git",
    "run_patch_apply",
    "run_patch_diff",
]

PATCH_KEY = "patch.diff"
"""The key of the patch in the implementation job's artifacts ConfigMap."""
PROMPT_PATCH_MAX_BYTES = 64 * 1024
"""How much of the patch a reviewer's prompt shows; the whole patched tree is in its cwd."""
GIT_TIMEOUT_S = 300.0
_CHUNK = 64 * 1024
_STDERR_TAIL = 600
_FILE_HEADER = b"diff --git "
_DIFF_OPTIONS = (
    "--binary",
    "--full-index",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)


class PatchError(Exception):
    """The patch cannot be made, stored or applied; ``reason`` names why."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class GitFailed(OSError):
    """git itself failed where it should not have (the runner's trouble, not the job's)."""


@dataclass(frozen=True, kw_only=True)
class GitTree:
    """A checkout: its git dir, its work tree (no ``.git`` in it) and the runner's scratch dir."""

    git_dir: Path
    work_tree: Path
    scratch: Path


@dataclass(frozen=True, kw_only=True)
class ComputedPatch:
    """A patch exactly as git wrote it."""

    text: str
    sha256: str
    bytes: int
    files: int


def build_tree_git_env(*, tree: GitTree, index: Path | None = None, path: str | None = None) -> dict[str, str]:
    """The whole environment of a git command on ``tree`` (nothing inherited but ``PATH``)."""
    env = {
        "PATH": path if path is not None else os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tree.scratch),
        "LC_ALL": "C",
        "GIT_DIR": str(tree.git_dir),
        "GIT_WORK_TREE": str(tree.work_tree),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_OPTIONAL_LOCKS": "0",
    }
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    return env


def _tail(raw: bytes) -> str:
    return raw.decode(errors="replace").strip()[-_STDERR_TAIL:]


def run_git(
    tree: GitTree, *args: str, index: Path | None = None, timeout_s: float = GIT_TIMEOUT_S
) -> subprocess.CompletedProcess[bytes]:
    """Run ``git ARGS`` in the work tree; :class:`GitFailed` if it cannot start or times out."""
    try:
        return subprocess.run(
            ["git", *args],
            cwd=tree.work_tree,
            env=build_tree_git_env(tree=tree, index=index),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise GitFailed(f"git {args[0]} took longer than {timeout_s:.0f}s") from exc
    except OSError as exc:
        raise GitFailed(f"git could not be started: {exc.strerror or exc}") from exc


def _checked(tree: GitTree, *args: str, index: Path | None = None) -> bytes:
    done = run_git(tree, *args, index=index)
    if done.returncode != 0:
        raise GitFailed(f"git {args[0]} failed (exit {done.returncode}): {_tail(done.stderr)}")
    return done.stdout


def count_patch_files(text: str) -> int:
    """How many files a git patch touches (its ``diff --git`` headers; no content line starts so)."""
    return sum(1 for line in text.encode().splitlines() if line.startswith(_FILE_HEADER))


def _read_bounded(tree: GitTree, args: list[str], *, index: Path, max_bytes: int) -> tuple[bytes, int]:
    """Run ``git ARGS``; keep at most ``max_bytes + 1`` bytes of stdout but count all of it."""
    deadline = time.monotonic() + GIT_TIMEOUT_S
    kept = bytearray()
    total = 0
    errors = tree.scratch / "git-stderr"
    with (
        errors.open("w+b") as err,
        subprocess.Popen(
            ["git", *args],
            cwd=tree.work_tree,
            env=build_tree_git_env(tree=tree, index=index),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
        ) as proc,
    ):
        assert proc.stdout is not None
        while chunk := proc.stdout.read(_CHUNK):
            total += len(chunk)
            if len(kept) <= max_bytes:
                kept += chunk[: max_bytes + 1 - len(kept)]
            if time.monotonic() > deadline:
                proc.kill()
                raise GitFailed(f"git {args[0]} took longer than {GIT_TIMEOUT_S:.0f}s")
        code = proc.wait()
        err.seek(0)
        stderr = err.read(64 * 1024)
    errors.unlink(missing_ok=True)
    if code != 0:
        raise GitFailed(f"git {args[0]} failed (exit {code}): {_tail(stderr)}")
    return bytes(kept), total


def run_patch_diff(*, tree: GitTree, commit: str, max_bytes: int = PATCH_MAX_BYTES) -> ComputedPatch | None:
    """The work tree's changes against ``commit`` as one binary-safe patch; None if there are none.

    Raises :class:`PatchError` (``PatchTooLarge``, ``PatchNotText``) or :class:`GitFailed`.
    """
    index = tree.scratch / "patch.index"
    index.unlink(missing_ok=True)
    try:
        _checked(tree, "add", "--all", "--", ".", index=index)
        raw, total = _read_bounded(
            tree, ["diff", "--cached", *_DIFF_OPTIONS, commit, "--"], index=index, max_bytes=max_bytes
        )
    finally:
        index.unlink(missing_ok=True)
    if total == 0:
        return None
    if total > max_bytes:
        raise PatchError(
            Reason.PATCH_TOO_LARGE,
            f"the patch is {total} bytes, over the {max_bytes}-byte maximum; it is not stored (never cut)",
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchError(
            Reason.PATCH_NOT_TEXT,
            f"the patch is not UTF-8 text (byte {exc.start}): a changed text file is in another encoding; "
            "mark such files binary in the repository's .gitattributes",
        ) from exc
    return ComputedPatch(
        text=text, sha256=hashlib.sha256(raw).hexdigest(), bytes=len(raw), files=count_patch_files(text)
    )


def run_patch_apply(*, tree: GitTree, text: str) -> None:
    """Apply a stored patch to the work tree (not the index); :class:`PatchError` if it does not apply."""
    patch = tree.scratch / PATCH_KEY
    patch.write_bytes(text.encode())
    try:
        done = run_git(tree, "apply", "--binary", "--whitespace=nowarn", "--", str(patch))
    finally:
        patch.unlink(missing_ok=True)
    if done.returncode != 0:
        raise PatchError(
            Reason.PATCH_DOES_NOT_APPLY, f"git apply refused the patch: {_tail(done.stderr) or 'no reason given'}"
        )


def build_patch_ref(*, patch: ComputedPatch, config_map: str, key: str = PATCH_KEY) -> PatchRef:
    return PatchRef(config_map=config_map, key=key, bytes=patch.bytes, sha256=patch.sha256, files=patch.files)


def build_patch_section(*, text: str, sha256: str, max_bytes: int = PROMPT_PATCH_MAX_BYTES) -> str:
    """The ``## Patch`` section of a reviewer's prompt: the patch, cut at a line end past ``max_bytes``."""
    raw = text.encode()
    shown = raw
    note = ""
    if len(raw) > max_bytes:
        end = raw.rfind(b"\n", 0, max_bytes)
        shown = raw[: end + 1] if end >= 0 else b""
        note = (
            f"[cut: the patch is {len(raw)} bytes; only the first {len(shown)} are shown here. "
            "The whole patched tree is in the working directory.]\n"
        )
    body = shown.decode(errors="replace")
    if body and not body.endswith("\n"):
        body += "\n"
    return f"## Patch (sha256 {sha256}, {len(raw)} bytes)\n```diff\n{body}{note}```\n"
