"""Paths inside an image tree resolve inside it: the builder and the runner never write to the host by a link."""

from __future__ import annotations

from pathlib import Path

import pytest

from helmhive.devcluster.rootfs_exec import inside


def test_absolute_and_relative_links_and_dotdot_stay_in_the_tree(tmp_path: Path) -> None:
    root = tmp_path / "tree"
    (root / "run").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "var").mkdir()
    (root / "var/run").symlink_to("/run")  # Debian's absolute link: on the host it is the host's /run
    (root / "bin").symlink_to("usr/bin")
    (root / "loop").symlink_to("/loop")

    assert inside(root, "/var/run/helmhive-test") == root / "run/helmhive-test"
    assert inside(root, "/bin/sh") == root / "usr/bin/sh"
    assert inside(root, "/../../etc/passwd") == root / "etc/passwd"
    assert inside(root, "relative/dir/") == root / "relative/dir"
    with pytest.raises(SystemExit, match="too many symlinks"):
        inside(root, "/loop/x")
