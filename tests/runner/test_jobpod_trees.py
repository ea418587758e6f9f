"""Trees over the job pod link: a round trip through the agent, and hostile tars refused."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from helmhive.runner.jobpod.frames import LinkError
from helmhive.runner.jobpod.trees import extract

from .test_jobpod_link import JobPod, job_pod

__all__ = ["job_pod"]  # the rig's fixture, used here


def _tree(root: Path) -> dict[str, tuple[str, int, str]]:
    """path -> (kind, permission bits, content or link target)."""
    found: dict[str, tuple[str, int, str]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        info = path.lstat()
        if path.is_symlink():
            found[rel] = ("link", 0, os.readlink(path))
        elif path.is_dir():
            found[rel] = ("dir", 0, "")
        else:
            found[rel] = ("file", info.st_mode & 0o777, path.read_text())
    return found


async def test_tree_round_trip_through_the_agent(job_pod: JobPod, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg" / "deep").mkdir(parents=True)
    (src / "run.sh").write_text("#!/bin/sh\necho run\n")
    (src / "run.sh").chmod(0o755)
    (src / "pkg" / "data.txt").write_text("data\n")
    (src / "pkg" / "data.txt").chmod(0o640)
    (src / "pkg" / "deep" / "secret.txt").write_text("mine\n")
    (src / "pkg" / "deep" / "secret.txt").chmod(0o600)
    (src / "gone.txt").write_text("to be removed\n")
    (src / "link").symlink_to("pkg/data.txt")
    home = tmp_path / "home"
    (home / ".config").mkdir(parents=True)
    (home / ".config" / "settings.json").write_text("{}\n")

    async with job_pod.connect() as link:
        assert link.pod_state == "idle"
        stats = await link.put_tree("workspace", src)
        assert (stats.files, stats.bytes) == (4, len("#!/bin/sh\necho run\n") + 5 + 5 + 14)
        assert (await link.put_tree("home", home)).files == 1
        script = "echo changed > new.txt; rm gone.txt; echo $HOME; cat link"
        agent = await link.start(
            ["/bin/sh", "-c", script], env={"HOME": str(job_pod.job_root / "home")}, cwd=str(job_pod.workspace)
        )
        ended, out, _ = await agent.wait()
    assert ended.code == 0
    assert out == f"{job_pod.job_root / 'home'}\ndata\n".encode()

    back = tmp_path / "back"
    async with job_pod.connect() as link:
        assert link.pod_state == "done"
        await link.get_tree("workspace", back)
        await link.get_tree("home", tmp_path / "home-back")
    expected = _tree(src)
    del expected["gone.txt"]
    expected["new.txt"] = ("file", 0o644, "changed\n")
    assert _tree(back) == expected
    assert os.readlink(back / "link") == "pkg/data.txt"
    assert _tree(tmp_path / "home-back") == _tree(home)


def _hostile(kind: str, outside: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        ok = tarfile.TarInfo("fine.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        member = tarfile.TarInfo()
        if kind == "absolute":
            member.name, member.size = str(outside / "abs.txt"), 4
        elif kind == "dotdot":
            member.name, member.size = "sub/../../" + outside.name + "/dotdot.txt", 4
        elif kind == "symlink-out":
            member.name, member.type, member.linkname = "escape", tarfile.SYMTYPE, "../../../" + outside.name
        elif kind == "symlink-absolute":
            member.name, member.type, member.linkname = "escape", tarfile.SYMTYPE, str(outside)
        elif kind == "hardlink-out":
            member.name, member.type, member.linkname = "hard", tarfile.LNKTYPE, str(outside / "target.txt")
        elif kind == "fifo":
            member.name, member.type = "pipe", tarfile.FIFOTYPE
        tar.addfile(member, io.BytesIO(b"evil") if member.size else None)
        if kind.startswith("symlink"):
            through = tarfile.TarInfo("escape/through.txt")
            through.size = 4
            tar.addfile(through, io.BytesIO(b"evil"))
    return buffer.getvalue()


async def test_hostile_tars_are_refused_and_nothing_is_written_outside(job_pod: JobPod, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("target\n")
    kinds = ["absolute", "dotdot", "symlink-out", "symlink-absolute", "hardlink-out", "fifo"]
    async with job_pod.connect() as link:
        for kind in kinds:
            with pytest.raises(LinkError) as refused:
                await link.put_tar("workspace", io.BytesIO(_hostile(kind, outside)))
            assert refused.value.reason == "tree", kind
            assert sorted(p.name for p in outside.iterdir()) == ["target.txt"], kind
            assert list(job_pod.workspace.iterdir()) == [], f"{kind}: a half tree was left"
        # The connection is still in step after every refusal: a good tree goes through.
        good = tmp_path / "good"
        good.mkdir()
        (good / "a.txt").write_text("a")
        assert (await link.put_tree("workspace", good)).files == 1
    assert (job_pod.workspace / "a.txt").read_text() == "a"
    assert (outside / "target.txt").read_text() == "target\n"


@pytest.mark.parametrize("library", [True, False], ids=["data-filter", "before-3.11.4"])
def test_extract_refuses_the_same_with_or_without_the_librarys_filter(
    library: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner image's Python (Debian bookworm's 3.11.2) has no ``tarfile.data_filter``: our own
    check refuses what it would, and a good tree keeps its links inside and its executable bits."""
    if not library:
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "target.txt").write_text("target\n")
    for kind in ["absolute", "dotdot", "symlink-out", "symlink-absolute", "hardlink-out", "fifo"]:
        dest = tmp_path / f"dest-{kind}"
        dest.mkdir()
        with pytest.raises(LinkError) as refused:
            extract(io.BytesIO(_hostile(kind, outside)), dest)
        assert refused.value.reason == "tree", kind
        assert sorted(p.name for p in outside.iterdir()) == ["target.txt"], kind
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        script = tarfile.TarInfo("bin/run.sh")
        script.size, script.mode = 3, 0o4777  # setuid and world-writable are dropped, exec kept
        tar.addfile(script, io.BytesIO(b"#!\n"))
        link = tarfile.TarInfo("bin/link")
        link.type, link.linkname = tarfile.SYMTYPE, "run.sh"
        tar.addfile(link)
    good = tmp_path / "good"
    good.mkdir()
    assert extract(io.BytesIO(buffer.getvalue()), good).files == 1
    assert (good / "bin" / "link").read_text() == "#!\n"
    assert (good / "bin" / "run.sh").stat().st_mode & 0o7777 == 0o755
