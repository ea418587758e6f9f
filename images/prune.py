"""Reduce a Debian tree to the runtime closure of a few packages (a distroless-style image).

Run inside the image being built, with the image's own python3 and nothing else (standard
library only), as the last step of a stage that a ``FROM scratch`` stage then copies whole::

    python3 /tmp/prune.py --keep python3 --keep ca-certificates

It reads dpkg's database, keeps the ``Depends``/``Pre-Depends`` closure of the ``--keep``
packages (the first installed alternative of each ``a | b``, virtual names through
``Provides``) without descending into the tools in :data:`DROP` (dpkg, debconf, perl, openssl,
...: dependencies that serve only maintainer scripts), and deletes every file of every other
package, apt's and dpkg's state and caches, and this script. ``/var/lib/dpkg/status`` is
rewritten with the kept packages only, so image scanners still see what the image holds.
Files that belong to no package (``/etc/passwd``, ``/opt``, ...) are left alone. It prints
what it keeps and what it removed, and fails if a shell is left behind.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

DROP = frozenset(
    {
        "apt",
        "bash",
        "coreutils",
        "dash",
        "debconf",
        "debianutils",
        "dpkg",
        "mawk",
        "perl-base",
        "openssl",
        "sed",
        "tar",
        "util-linux",
    }
)
"""Never kept, even as a dependency: the package manager, shells and tools a runtime does not call."""

ALWAYS = ("base-files", "netbase", "tzdata")
"""Kept when installed: /etc/os-release (read by scanners), /etc/services and /etc/protocols, zoneinfo."""

SHELLS = ("bin/sh", "bin/bash", "bin/dash", "usr/bin/sh", "usr/bin/bash", "usr/bin/dash")
STATE = ("var/lib/apt", "var/cache/apt", "var/cache/debconf", "var/cache/ldconfig", "var/log", "var/lib/dpkg/info")


def parse_status(text: str) -> dict[str, dict[str, str]]:
    """dpkg's status file: installed package name -> its fields (continuation lines joined)."""
    packages: dict[str, dict[str, str]] = {}
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            packages[fields["Package"]] = {**fields, "_stanza": stanza.strip("\n")}
    return packages


def _names(field: str) -> list[list[str]]:
    """``a (>= 1) | b:any, c`` -> ``[["a", "b"], ["c"]]``."""
    groups = []
    for group in field.split(","):
        alternatives = [re.split(r"[\s(:\[]", alt.strip(), maxsplit=1)[0] for alt in group.split("|")]
        groups.append([a for a in alternatives if a])
    return [g for g in groups if g]


def closure(packages: dict[str, dict[str, str]], roots: list[str]) -> set[str]:
    """The installed packages ``roots`` need at run time, without :data:`DROP`."""
    provides: dict[str, str] = {}
    for name, fields in packages.items():
        for group in _names(fields.get("Provides", "")):
            provides.setdefault(group[0], name)
    keep: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in keep or name in DROP:
            continue
        keep.add(name)
        fields = packages[name]
        for field in ("Pre-Depends", "Depends"):
            for group in _names(fields.get(field, "")):
                installed = [provides.get(a, a) for a in group if provides.get(a, a) in packages]
                if installed:
                    todo.append(installed[0])
    return keep


def prune(root: Path, keep_roots: list[str]) -> tuple[set[str], int]:
    """Delete every file of the packages outside the closure; return (kept packages, files removed)."""
    dpkg = root / "var/lib/dpkg"
    packages = parse_status((dpkg / "status").read_text(encoding="utf-8"))
    missing = [name for name in keep_roots if name not in packages]
    if missing:
        raise SystemExit(f"prune: not installed: {', '.join(missing)}")
    keep = closure(packages, [*keep_roots, *(name for name in ALWAYS if name in packages)])
    kept_files: set[str] = set()
    for name in keep:
        kept_files.update(_listed(dpkg, name))
    removed = 0
    directories: set[Path] = set()
    for name in sorted(set(packages) - keep):
        for entry in _listed(dpkg, name):
            if entry in kept_files:
                continue
            path = root / entry.lstrip("/")
            if path.is_dir():  # a directory, or a symlink to one (/bin -> usr/bin): never removed here
                directories.add(path)
            elif path.is_symlink() or path.is_file():
                path.unlink()
                removed += 1
    for directory in sorted(directories, key=lambda p: len(p.parts), reverse=True):
        if directory.is_dir() and not directory.is_symlink() and not any(directory.iterdir()):
            directory.rmdir()
    removed += _remove_dangling_links(root)
    status = "\n\n".join(packages[name]["_stanza"] for name in sorted(keep)) + "\n"
    for relative in STATE:
        shutil.rmtree(root / relative, ignore_errors=True)
    for leftover in dpkg.iterdir() if dpkg.is_dir() else ():
        if leftover.is_file():
            leftover.unlink()
    dpkg.mkdir(parents=True, exist_ok=True)
    (dpkg / "status").write_text(status, encoding="utf-8")
    return keep, removed


def _resolve(root: Path, path: Path, hops: int = 16) -> Path | None:
    """Where the symlink ``path`` ends inside ``root`` (absolute targets are taken inside it), or None."""
    for _ in range(hops):
        if not path.is_symlink():
            return path if path.exists() else None
        target = Path(path.readlink())
        path = root / str(target).lstrip("/") if target.is_absolute() else path.parent / target
    return None


def _remove_dangling_links(root: Path) -> int:
    """Links left pointing at removed files: update-alternatives' (awk, pager, which) and the like."""
    removed = 0
    for directory in ("etc/alternatives", "usr/bin", "usr/sbin", "usr/local/bin"):
        base = root / directory
        for path in sorted(base.iterdir()) if base.is_dir() and not base.is_symlink() else ():
            if path.is_symlink() and _resolve(root, path) is None:
                path.unlink()
                removed += 1
    return removed


def _listed(dpkg: Path, name: str) -> list[str]:
    for candidate in (dpkg / "info" / f"{name}.list", *sorted((dpkg / "info").glob(f"{name}:*.list"))):
        if candidate.exists():
            return [line for line in candidate.read_text(encoding="utf-8").splitlines() if line not in ("", "/.")]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="append", required=True, help="a package whose runtime closure stays")
    parser.add_argument("--root", type=Path, default=Path("/"), help="the tree to prune (default /)")
    args = parser.parse_args(argv)
    keep, removed = prune(args.root, args.keep)
    print(f"prune: kept {len(keep)} packages: {' '.join(sorted(keep))}")
    print(f"prune: removed {removed} files of the other packages, and apt's and dpkg's state")
    left = [shell for shell in SHELLS if (args.root / shell).exists() or (args.root / shell).is_symlink()]
    Path(__file__).unlink(missing_ok=True)
    if left:
        print(f"prune: a shell is left behind: {', '.join(left)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
