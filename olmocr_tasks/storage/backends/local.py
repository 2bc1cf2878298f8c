"""Local folders (plain paths and ``file://`` URIs) as a storage backend.

Writes go to a temp file beside the target, are fsynced and renamed over it, so a reader never sees
half a file and a crash leaves at most a temp file that listings skip.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import BinaryIO

from olmocr_tasks.storage.backends import TEMP_SUFFIX, ObjectInfo
from olmocr_tasks.storage.uri import local_path

_COPY_CHUNK = 1024 * 1024
# errno values of a filesystem that cannot make hard links.
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS})
# Objects per listing page: bounds memory, not a filesystem limit.
_PAGE_SIZE = 1000


class LocalBackend:
    """Files under local paths. Local failures are not retried: a disk does not recover in seconds."""

    retries_transient_failures = False
    failure_types: tuple[type[BaseException], ...] = (OSError,)

    def read(self, uri: str) -> bytes:
        with open(local_path(uri), "rb") as handle:
            return handle.read()

    def open(self, uri: str, start: int, etag: str | None) -> _LocalBody:
        # Local reads are not resumed (a disk error is not retried), so there is no version to hold.
        handle = open(local_path(uri), "rb")  # noqa: SIM115 - closed by the body's close()
        try:
            handle.seek(start)
        except BaseException:
            handle.close()
            raise
        return _LocalBody(handle)

    def download_into(self, uri: str, temp_path: str) -> None:
        with open(local_path(uri), "rb") as source, open(temp_path, "wb") as target:
            while chunk := source.read(_COPY_CHUNK):
                target.write(chunk)

    def write(self, uri: str, data: bytes, content_type: str | None) -> None:
        def fill(temp: str) -> None:
            with open(temp, "r+b") as handle:
                handle.write(data)

        _atomic_local(local_path(uri), fill, make_dirs=True)

    def create(self, uri: str, data: bytes) -> bool:
        path = local_path(uri)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        temp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}{TEMP_SUFFIX}")
        try:
            with open(temp, "xb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            # A hard link appears complete and fails if the name exists: create-if-absent in one step.
            os.link(temp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            # Filesystems without hard links (some network mounts): exclusive create, then fill.
            try:
                with open(path, "xb") as handle:
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
            except FileExistsError:
                return False
        finally:
            with contextlib.suppress(OSError):
                os.remove(temp)
        _fsync_dir(folder)
        return True

    def write_file_atomically(self, path: str, fill: Callable[[str], None]) -> None:
        """Let ``fill`` write a temp file beside ``path``, then rename it over ``path`` (see ``_atomic_local``)."""
        _atomic_local(path, fill, make_dirs=True)

    def stat(self, uri: str) -> ObjectInfo | None:
        path = local_path(uri)
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not os.path.isfile(path):
            return None
        return ObjectInfo(uri, st.st_size, None, _mtime(st.st_mtime_ns))

    def delete(self, uri: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(local_path(uri))

    def list_pages(self, prefix_uri: str) -> _LocalListing:
        return _LocalListing(prefix_uri)


class _LocalBody:
    """An open local file as an ``ObjectBody``."""

    etag = None

    def __init__(self, handle: BinaryIO) -> None:
        self._handle = handle

    def read(self, size: int) -> bytes:
        return self._handle.read(size)

    def close(self) -> None:
        self._handle.close()


class _LocalListing:
    """Depth-first walk with one open directory iterator per level.

    Memory grows with depth, not with the number of files (a flat folder of 100,000 files is never
    held as a list). Entries that vanish or cannot be read while walking are not listable and skipped.
    """

    def __init__(self, prefix_uri: str) -> None:
        self._root = local_path(prefix_uri)
        self._base = prefix_uri.rstrip("/") or "/"
        self._stack: list[tuple[str, Iterator[os.DirEntry[str]]]] | None = None

    def next_page(self) -> list[ObjectInfo] | None:
        # Like an S3 listing, the first page is an answer even when empty (None: nothing more to ask),
        # so a listing counts as one request on both backends.
        first = self._stack is None
        if self._stack is None:
            if not os.path.isdir(self._root):
                self._stack = []
                return []
            self._stack = [("", os.scandir(self._root))]
        page: list[ObjectInfo] = []
        stack = self._stack
        while stack and len(page) < _PAGE_SIZE:
            relative_dir, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                _close(entries)
                stack.pop()
                continue
            relative = f"{relative_dir}/{entry.name}" if relative_dir else entry.name
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append((relative, os.scandir(entry.path)))
                    continue
                if entry.name.endswith(TEMP_SUFFIX) or not entry.is_file():
                    continue
                st = entry.stat()
            except OSError:
                continue
            uri = f"{self._base}/{relative}" if self._base != "/" else f"/{relative}"
            page.append(ObjectInfo(uri, st.st_size, None, _mtime(st.st_mtime_ns)))
        return page if page or first else None

    def close(self) -> None:
        for _, entries in self._stack or []:
            _close(entries)
        self._stack = []


def _mtime(mtime_ns: int) -> datetime:
    # Integer arithmetic so a listing and a stat of the same file give the identical timestamp.
    seconds, nanos = divmod(mtime_ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=nanos // 1000)


def _close(entries: Iterator[os.DirEntry[str]]) -> None:
    close = getattr(entries, "close", None)
    if close is not None:
        close()


def _atomic_local(path: str, fill: Callable[[str], None], *, make_dirs: bool = True) -> None:
    """Create a temp file next to ``path``, let ``fill`` write it, fsync, then rename over ``path``.

    The rename is atomic on POSIX within one filesystem, which is why the temp file lives in the
    target's own folder rather than in /tmp.
    """
    folder = os.path.dirname(os.path.abspath(path))
    if make_dirs:
        os.makedirs(folder, exist_ok=True)
    temp = os.path.join(folder, f".{os.path.basename(path)}.{secrets.token_hex(6)}{TEMP_SUFFIX}")
    # "x" mode gives normal umask permissions (mkstemp would force 0600) and never clobbers.
    with open(temp, "xb"):
        pass
    try:
        fill(temp)
        with open(temp, "r+b") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
    _fsync_dir(folder)


def _fsync_dir(folder: str) -> None:
    # Makes the rename itself durable; not every filesystem allows opening a folder.
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
