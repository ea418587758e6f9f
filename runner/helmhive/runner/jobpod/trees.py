"""Trees over the link: a tar stream as ``DATA`` frames and ``END``, extracted safely; the shim's private copy.

Both ends use the same code. The sender tars a directory (regular files, directories, symlinks
and hard links only; owners dropped) in a thread and sends it in chunks; the receiver extracts
it in a thread with :func:`safe_member`: Python's ``data`` filter (no device or special files,
no link or path leading out of the destination, no setuid bits) and, stricter than that filter,
no absolute name (the filter would silently strip the slash) and no ``..`` component at all. A
refused tree fails with ``LinkError(tree)``; the receiver reads on to the stream's end, so the
connection stays usable, and empties the destination, so no half tree is left.

:func:`snapshot_tree` is the shim's copy of ``/job/<part>`` into its private directory before it is
handed back: walked by file descriptor (``O_NOFOLLOW`` at every step), so a symlink swapped in
cannot lead the copy out of the tree, and special files (a FIFO would block a reader) are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import stat
import tarfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar, cast

from helmhive.runner.jobpod.frames import ErrorPayload, FrameStream, FrameType, LinkError, LinkReason, expect

__all__ = [
    "CHUNK",
    "TreeStats",
    "clear_dir",
    "discard_tree",
    "extract",
    "receive_tree",
    "safe_member",
    "send_tar",
    "snapshot_tree",
]

CHUNK = 256 * 1024
_MAX_DEPTH = 512
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class TreeStats:
    files: int
    bytes: int


class _Counter:
    def __init__(self) -> None:
        self.files = 0
        self.bytes = 0

    def count(self, member: tarfile.TarInfo) -> None:
        if member.isreg():
            self.files += 1
            self.bytes += member.size

    def stats(self) -> TreeStats:
        return TreeStats(self.files, self.bytes)


def _refuse(why: str, name: str) -> LinkError:
    return LinkError(LinkReason.TREE, f"{why}: {name[:200]!r}")


def safe_member(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """The member as it may be extracted below ``dest``, or ``LinkError(tree)`` naming why not."""
    name = member.name
    if name.startswith("/") or os.path.isabs(name):
        raise _refuse("absolute path", name)
    if ".." in name.replace("\\", "/").split("/"):
        raise _refuse("path with '..'", name)
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise _refuse("not a regular file, directory or link", name)
    if (member.issym() or member.islnk()) and os.path.isabs(member.linkname):
        raise _refuse("link to an absolute path", name)
    library = getattr(tarfile, "data_filter", None)
    if library is None:  # Python before 3.11.4 (Debian bookworm's 3.11.2, the runner image's)
        return _data_filter(member, dest)
    try:
        checked: tarfile.TarInfo = library(member, dest)
    except tarfile.TarError as exc:  # tarfile.FilterError and its kinds
        why = type(exc).__name__.removesuffix("Error")  # OutsideDestination, LinkOutsideDestination, ...
        raise _refuse(f"refused ({why})", name) from None
    return checked


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _data_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """What Python's ``data`` filter does, for a Python without it: the member and its link target must
    resolve below ``dest``; modes lose setuid, setgid, sticky and group/other write; owners are dropped."""
    root = os.path.realpath(dest)
    target = os.path.realpath(os.path.join(root, member.name))
    if not _inside(target, root):
        raise _refuse("refused (OutsideDestination)", member.name)
    if member.issym():
        linked = os.path.realpath(os.path.join(os.path.dirname(target), member.linkname))
        if not _inside(linked, root):
            raise _refuse("refused (LinkOutsideDestination)", member.name)
    if member.islnk():
        linked = os.path.realpath(os.path.join(root, member.linkname))
        if not _inside(linked, root):
            raise _refuse("refused (LinkOutsideDestination)", member.name)
    if member.isreg() or member.islnk():
        member.mode = (member.mode & 0o755) | 0o600
    elif member.isdir():
        member.mode = (member.mode & 0o755) | 0o700
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    return member


def extract(fileobj: BinaryIO, dest: Path) -> TreeStats:
    """Extract a tar stream below ``dest`` (which exists), every member through :func:`safe_member`."""
    counter = _Counter()
    root = os.path.realpath(dest)

    def check(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
        checked = safe_member(member, path)
        counter.count(checked)
        return checked

    # Checked member by member (not ``extractall(filter=...)``, which Python before 3.11.4 lacks);
    # each one already passed :func:`safe_member`, so the library adds no filter of its own.
    trusted: dict[str, str] = {"filter": "fully_trusted"} if hasattr(tarfile, "data_filter") else {}
    try:
        with tarfile.open(fileobj=fileobj, mode="r|", errorlevel=1) as tar:
            for member in tar:
                tar.extract(check(member, root), root, **trusted)  # type: ignore[arg-type]
    except (tarfile.TarError, ValueError) as exc:  # ValueError: e.g. a PAX header that is not one
        raise LinkError(LinkReason.TREE, f"not a readable tar stream: {exc}"[:300]) from None
    except OSError as exc:
        raise LinkError(LinkReason.TREE, f"cannot write the tree: {exc.strerror or exc}") from None
    return counter.stats()


def _strip(counter: _Counter) -> Callable[[tarfile.TarInfo], tarfile.TarInfo | None]:
    def strip(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            return None  # sockets, FIFOs, devices: not part of a tree
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        counter.count(member)
        return member

    return strip


def write_tar(fileobj: BinaryIO, source: Path) -> TreeStats:
    """Tar the contents of ``source`` (names relative to it, symlinks kept as links)."""
    counter = _Counter()
    with tarfile.open(fileobj=fileobj, mode="w|", format=tarfile.PAX_FORMAT, dereference=False) as tar:
        for name in sorted(os.listdir(source)):
            tar.add(source / name, arcname=name, recursive=True, filter=_strip(counter))
    return counter.stats()


class _Sink(io.RawIOBase):
    """A writable file for a worker thread: each full chunk becomes a DATA frame sent on the loop."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self._send = send
        self._buffer = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        self._buffer += data
        while len(self._buffer) >= CHUNK:
            self._send(bytes(self._buffer[:CHUNK]))
            del self._buffer[:CHUNK]
        return len(data)

    def flush_all(self) -> None:
        if self._buffer:
            self._send(bytes(self._buffer))
            self._buffer.clear()


class _Source(io.RawIOBase):
    """A readable file for a worker thread: DATA payloads fetched from the loop, EOF at END."""

    def __init__(self, fetch: Callable[[], bytes]) -> None:
        self._fetch = fetch
        self._buffer = b""
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, target: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._buffer and not self._eof:
            self._buffer = self._fetch()
            self._eof = not self._buffer
        count = min(len(target), len(self._buffer))
        target[:count] = self._buffer[:count]
        self._buffer = self._buffer[count:]
        return count


def _blocking(loop: asyncio.AbstractEventLoop, make: Callable[[], Awaitable[T]]) -> Callable[[], T]:
    async def run() -> T:
        return await make()

    return lambda: asyncio.run_coroutine_threadsafe(run(), loop).result()


async def send_tar(stream: FrameStream, produce: Callable[[BinaryIO], object]) -> None:
    """Run ``produce(file)`` in a thread, sending what it writes as DATA frames, then END.

    If ``produce`` fails, the stream ends with ``ERROR tree`` instead of END and the error is raised."""
    loop = asyncio.get_running_loop()

    def send(chunk: bytes) -> None:
        _blocking(loop, lambda: stream.send(FrameType.DATA, chunk))()

    def work() -> None:
        sink = _Sink(send)
        produce(cast(BinaryIO, sink))
        sink.flush_all()

    try:
        await asyncio.to_thread(work)
    except LinkError as exc:
        if exc.reason in (LinkReason.CLOSED, LinkReason.EOF):
            raise
        await stream.send(FrameType.ERROR, ErrorPayload(reason=exc.reason[:64], message=exc.message[:1000]))
        raise
    except OSError as exc:
        error = LinkError(LinkReason.TREE, f"cannot read the tree: {exc.strerror or exc}")
        await stream.send(FrameType.ERROR, ErrorPayload(reason=error.reason, message=error.message))
        raise error from None
    await stream.send(FrameType.END)


async def receive_tree(stream: FrameStream, dest: Path, *, seconds: float | None) -> TreeStats:
    """Extract the DATA frames up to END below ``dest``; on a refusal, read to END and empty ``dest``."""
    loop = asyncio.get_running_loop()
    ended = False
    broken: LinkError | None = None

    async def next_chunk() -> bytes:
        nonlocal ended, broken
        while not ended:
            try:
                frame = expect(await stream.read(seconds), FrameType.DATA, FrameType.END)
            except LinkError as exc:
                ended, broken = True, exc  # the stream is over (the peer's ERROR, a broken connection)
                raise
            if frame.type is FrameType.END:
                ended = True
            elif frame.payload:
                return frame.payload
        return b""

    fetch = _blocking(loop, next_chunk)
    try:
        return await asyncio.to_thread(extract, cast(BinaryIO, _Source(fetch)), dest)
    except LinkError:
        if broken is None:
            with contextlib.suppress(LinkError):
                while not ended:  # keep the connection in step: read to the stream's end
                    await next_chunk()
        await asyncio.to_thread(clear_dir, dest)
        raise
    finally:
        if broken is None and not ended:  # tar stops at its end-of-archive blocks; the padding follows
            while not ended:
                await next_chunk()


async def discard_tree(stream: FrameStream, *, seconds: float | None) -> None:
    """Read a refused tree's DATA frames to its END (or the sender's ERROR), keeping the stream in step."""
    while True:
        frame = await stream.read(seconds)
        if frame.type in (FrameType.END, FrameType.ERROR):
            return
        expect(frame, FrameType.DATA)


def clear_dir(path: Path) -> None:
    """Remove everything below ``path``, keeping ``path`` (symlinks removed, never followed)."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(path):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)


def snapshot_tree(source: Path, dest: Path) -> None:
    """Copy the tree at ``source`` to ``dest`` (replaced), by descriptor, never following a symlink."""
    if dest.exists() or dest.is_symlink():
        shutil.rmtree(dest)
    dest.mkdir(mode=0o700, parents=True)
    try:
        src_fd = os.open(source, _DIR_FLAGS)
    except FileNotFoundError:
        return  # nothing there: an empty tree
    except OSError as exc:
        raise LinkError(LinkReason.TREE, f"cannot open the tree: {exc.strerror or exc}") from None
    dst_fd = os.open(dest, _DIR_FLAGS)
    try:
        _copy_dir(src_fd, dst_fd, depth=0)
    except OSError as exc:
        raise LinkError(LinkReason.TREE, f"cannot copy the tree: {exc.strerror or exc}") from None
    finally:
        os.close(src_fd)
        os.close(dst_fd)


def _copy_dir(src_fd: int, dst_fd: int, *, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise LinkError(LinkReason.TREE, f"the tree is more than {_MAX_DEPTH} directories deep")
    for name in sorted(os.listdir(src_fd)):
        info = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            os.mkdir(name, 0o700, dir_fd=dst_fd)
            sub_src = os.open(name, _DIR_FLAGS, dir_fd=src_fd)
            sub_dst = os.open(name, _DIR_FLAGS, dir_fd=dst_fd)
            try:
                _copy_dir(sub_src, sub_dst, depth=depth + 1)
                # Owner rwx kept: the copy must stay readable for the tar and the checks.
                os.fchmod(sub_dst, (stat.S_IMODE(info.st_mode) & 0o777) | 0o700)
                os.utime(sub_dst, ns=(info.st_atime_ns, info.st_mtime_ns))
            finally:
                os.close(sub_src)
                os.close(sub_dst)
        elif stat.S_ISLNK(info.st_mode):
            os.symlink(os.readlink(name, dir_fd=src_fd), name, dir_fd=dst_fd)
        elif stat.S_ISREG(info.st_mode):
            _copy_file(name, src_fd, dst_fd)


def _copy_file(name: str, src_fd: int, dst_fd: int) -> None:
    # O_NONBLOCK: if a FIFO was swapped in after the stat, opening it must not wait for a writer.
    try:
        fd_in = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=src_fd)
    except FileNotFoundError:
        return
    try:
        info = os.fstat(fd_in)
        if not stat.S_ISREG(info.st_mode):
            return
        mode = (stat.S_IMODE(info.st_mode) & 0o777) | 0o600
        fd_out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode, dir_fd=dst_fd)
        try:
            with os.fdopen(fd_in, "rb", closefd=False) as fin, os.fdopen(fd_out, "wb", closefd=False) as fout:
                shutil.copyfileobj(fin, fout, CHUNK)
            os.fchmod(fd_out, mode)
            os.utime(fd_out, ns=(info.st_atime_ns, info.st_mtime_ns))
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)
