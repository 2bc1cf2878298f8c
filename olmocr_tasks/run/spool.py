"""Documents as local files, for the renderer: a local one where it lies, an S3 object in a spool folder.

Documents sit on local disk, not in memory, until they are done; the spool folder is the engine's
for its lifetime (``open`` / ``close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile

from olmocr_tasks.core.errors import OutsideAllowedError, UnreadableSourceError
from olmocr_tasks.location.documents import SourceDocument
from olmocr_tasks.storage.access import AccessPolicy, LocationNotAllowedError
from olmocr_tasks.storage.store import Storage
from olmocr_tasks.storage.uri import is_s3


class Spool:
    """Local copies of the documents being converted."""

    def __init__(self, storage: Storage, access: AccessPolicy) -> None:
        self._storage = storage
        # Checked for each document just before it is opened (``localise``).
        self._access = access
        self._dir: str | None = None

    def open(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="olmocr-tasks-")

    def close(self) -> None:
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    async def localise(self, source: SourceDocument) -> str:
        """The document as a local file: a local one by its real path, an S3 object in the spool.

        Checked against the run's allowed inputs first, resolved (``OutsideAllowedError``): a local
        name whose file lies outside (a symbolic link), or a URI a tampered batch file holds, is
        never opened. The path opened is the one the check resolved, parsed by ``local_path`` (the
        check's own parser: a ``file://`` URI is percent-decoded for both).
        """
        try:
            path = self._access.check_input(source.uri)
        except LocationNotAllowedError as exc:
            raise OutsideAllowedError(str(exc)) from None
        except ValueError as exc:
            raise UnreadableSourceError(f"{source.uri} is not a location this worker can read: {exc}") from None
        if not is_s3(source.uri):
            if not os.path.isfile(path):
                raise UnreadableSourceError(f"{source.uri} does not exist or is not a file")
            return path
        assert self._dir is not None
        fd, path = tempfile.mkstemp(suffix=".pdf", dir=self._dir)
        os.close(fd)
        await asyncio.to_thread(self._storage.download, source.uri, path)
        return path

    async def discard(self, path: str) -> None:
        """Remove ``path`` once its document is done, if it is a spooled copy (never a local original)."""
        if path.startswith(self._dir or "\0"):
            await asyncio.to_thread(_remove_quietly, path)


def _remove_quietly(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
