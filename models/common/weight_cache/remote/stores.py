# SPDX-License-Identifier: Apache-2.0
"""Where a shared cache lives: one small interface, and the backends that are plain files.

:func:`~models.common.weight_cache.remote.urls.open_store` picks the backend by the URL's scheme:

* ``s3://bucket/prefix`` :class:`~models.common.weight_cache.remote.s3.S3Store` (boto3);
* a directory (a path or ``file://``): :class:`DirectoryStore`, what ``tt-cache push --to DIR``
  writes, laid out so that any static web server can serve it;
* ``http://`` / ``https://``: :class:`HttpStore`, that directory served: read-only, no listing
  (readers follow each variant's ``latest`` pointer), range requests to resume a download.

**One rule for writes**: an object or a manifest appears whole or not at all (a temp file renamed
or linked in, an S3 PUT or a completed multipart upload) and only after the bytes it is made of
were proved to be what its name says (:func:`~models.common.weight_cache.remote.transfer.verified_parts`
raises before the last part is handed over). A key written ``exclusive`` is never replaced.

Errors are of two kinds: :class:`StoreUnavailable` (bad input: an unknown bucket, refused
credentials, an endpoint that does not answer: the CLI's exit 2) and :class:`StoreIntegrityError`
(the store's content is wrong or incomplete: exit 1).
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from models.common.fileio import fsync_dir, is_temp_path, unique_temp_path, write_all

READ_CHUNK = 1 << 20
TRANSFER_THREADS = 8  # objects moved at once
HTTP_TIMEOUT = 30.0


class RemoteStoreError(RuntimeError):
    """A shared store cannot be used as asked; the message is one line, never a credential."""


class StoreUnavailable(RemoteStoreError):
    """The store itself cannot be reached or used: unknown bucket, refused credentials, no answer."""


class StoreUnreachable(StoreUnavailable):
    """The store stopped answering: no connection, a transfer broken off or timed out, a 5xx (the
    one kind :mod:`.retry` tries again)."""


class StoreIntegrityError(RemoteStoreError):
    """The store's content is not what a manifest promises: a missing, short or corrupt object."""


class ObjectMissing(StoreIntegrityError):
    """A key the caller needs is not in the store."""


@dataclass(frozen=True)
class StoredKey:
    """One key as a listing shows it: its size, and when the store last wrote it (seconds, the
    store's clock)."""

    size: int
    modified: float


class Store(Protocol):
    """A flat key space of immutable blobs (keys as :mod:`.store_layout` makes them)."""

    url: str
    can_list: bool  # False: readers follow ``latest`` pointers instead of listing

    def list_sizes(self, prefix: str) -> dict[str, int]:
        """Every key under ``prefix`` with its size."""
        ...

    def list_keys(self, prefix: str) -> dict[str, StoredKey]:
        """Every key under ``prefix`` with its size and when it was written (what gc plans from)."""
        ...

    def size(self, key: str) -> int | None:
        """The size of ``key``, or None when it is absent."""
        ...

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """``key``'s bytes from offset ``start`` on (up to ``end``, exclusive, when given: a ranged
        read), in chunks; raises :class:`ObjectMissing`."""
        ...

    def read_small(self, key: str, max_bytes: int) -> bytes | None:
        """All of a small ``key`` (at most ``max_bytes + 1`` are read, so a caller sees it is too
        large), or None when it is absent."""
        ...

    def write_small(self, key: str, data: bytes, *, exclusive: bool) -> bool:
        """Write a small ``key`` whole; False when ``exclusive`` and it exists already."""
        ...

    def upload(self, key: str, parts: Iterable[bytes], size: int, *, exclusive: bool = True) -> bool:
        """Store ``parts`` as ``key``, published only once every part was taken without error;
        False when ``exclusive`` and the key exists already (its bytes are then left alone)."""
        ...

    def delete(self, key: str) -> None:
        """Remove ``key`` (gc only, by the rule of :mod:`.store_layout`); an absent key is no error."""
        ...


def read_through(store: Store, key: str, start: int, buffer: memoryview) -> Iterator[bytes | memoryview]:
    """``key``'s bytes from ``start`` on, in order, each piece received into ``buffer`` and yielded
    as a view of it, valid until the next is asked for (no ``bytes`` per piece, and a piece small
    enough to be hashed and written while it is still in the CPU's cache). A store without a
    ``read_through`` of its own yields :meth:`Store.read`'s chunks."""
    own = getattr(store, "read_through", None)
    if own is not None:
        return own(key, start, buffer)
    return store.read(key, start=start)


# --------------------------------------------------------------------------------------------
# A directory
# --------------------------------------------------------------------------------------------


class DirectoryStore:
    """The layout as files under ``root`` (a local disk, an NFS export, a web server's document root)."""

    can_list = True

    def __init__(self, root: Path, *, create: bool = False) -> None:
        self.root = Path(root)
        self.url = str(self.root)
        if create:
            try:
                self.root.mkdir(exist_ok=True)
            except OSError as error:
                raise StoreUnavailable(f"{self.root}: cannot make the store directory ({error.strerror})") from None
        if not self.root.is_dir():
            raise StoreUnavailable(f"{self.root}: no such directory")

    def _path(self, key: str) -> Path:
        return self.root / key

    def list_sizes(self, prefix: str) -> dict[str, int]:
        return {key: stored.size for key, stored in self.list_keys(prefix).items()}

    def list_keys(self, prefix: str) -> dict[str, StoredKey]:
        found: dict[str, StoredKey] = {}
        for directory, _, names in os.walk(self._path(prefix)):
            for name in names:
                if is_temp_path(Path(name)):
                    continue
                path = Path(directory, name)
                with contextlib.suppress(OSError):
                    info = path.lstat()
                    found[path.relative_to(self.root).as_posix()] = StoredKey(info.st_size, info.st_mtime)
        return found

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            return
        except OSError as error:
            raise StoreUnavailable(f"{self.url}: cannot delete {key} ({error.strerror})") from None

    def size(self, key: str) -> int | None:
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None

    def _open_read(self, key: str):  # noqa: ANN202 - a binary file
        try:
            return open(self._path(key), "rb", buffering=0)  # noqa: SIM115 - the caller's to close
        except FileNotFoundError:
            raise ObjectMissing(f"{self.url}: {key} is missing") from None
        except OSError as error:
            raise StoreUnavailable(f"{self.url}: cannot read {key} ({error.strerror})") from None

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        with self._open_read(key) as stream:
            stream.seek(start)
            left = -1 if end is None else end - start
            while left and (chunk := stream.read(READ_CHUNK if left < 0 else min(READ_CHUNK, left))):
                left -= len(chunk) if left > 0 else 0
                yield chunk

    def read_through(self, key: str, start: int, buffer: memoryview) -> Iterator[memoryview]:
        """See :func:`read_through`."""
        with self._open_read(key) as stream:
            stream.seek(start)
            while count := stream.readinto(buffer):
                yield buffer[:count]

    def read_small(self, key: str, max_bytes: int) -> bytes | None:
        try:
            with open(self._path(key), "rb") as stream:
                return stream.read(max_bytes + 1)
        except FileNotFoundError:
            return None

    def write_small(self, key: str, data: bytes, *, exclusive: bool) -> bool:
        return self.upload(key, [data], len(data), exclusive=exclusive)

    def upload(self, key: str, parts: Iterable[bytes], size: int, *, exclusive: bool = True) -> bool:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = unique_temp_path(path)
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except OSError as error:
            raise StoreUnavailable(f"{self.url}: cannot write {key} ({error.strerror})") from None
        try:
            try:
                for part in parts:
                    write_all(fd, part)
                os.fsync(fd)
            finally:
                os.close(fd)
            if exclusive:
                try:
                    os.link(temp, path)  # never replaces: two writers of one key, the first one stands
                except FileExistsError:
                    return False
            else:
                os.replace(temp, path)
            fsync_dir(path.parent)
            return True
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EROFS):
                raise StoreUnavailable(f"{self.url}: cannot write {key} ({error.strerror})") from None
            raise
        finally:
            with contextlib.suppress(OSError):
                temp.unlink()


# --------------------------------------------------------------------------------------------
# A mirror over HTTP
# --------------------------------------------------------------------------------------------


class HttpStore:
    """A :class:`DirectoryStore` served by a static web server: read-only, no listing."""

    can_list = False

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _open(self, key: str, method: str = "GET", start: int = 0, end: int | None = None):
        request = urllib.request.Request(f"{self.url}/{urllib.parse.quote(key)}", method=method)
        if start or end is not None:
            request.add_header("Range", f"bytes={start}-{'' if end is None else end - 1}")
        try:
            return urllib.request.urlopen(request, timeout=HTTP_TIMEOUT)  # noqa: S310 - http(s) only
        except urllib.error.HTTPError as error:
            error.close()
            if error.code == 404:
                return None
            if error.code == 416:  # asked from the end of the object: nothing more to read
                return None
            if error.code >= 500 and error.code != 501:
                raise StoreUnreachable(f"{self.url}/{key}: HTTP {error.code} {error.reason}") from None
            raise StoreUnavailable(f"{self.url}/{key}: HTTP {error.code} {error.reason}") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise StoreUnreachable(f"{self.url}: cannot reach the server ({reason})") from None

    def list_sizes(self, prefix: str) -> dict[str, int]:
        raise StoreUnavailable(f"{self.url}: an HTTP mirror cannot be listed")

    def list_keys(self, prefix: str) -> dict[str, StoredKey]:
        raise StoreUnavailable(f"{self.url}: an HTTP mirror cannot be listed")

    def delete(self, key: str) -> None:
        raise StoreUnavailable(f"{self.url}: an HTTP mirror is read-only (gc the directory it serves)")

    def size(self, key: str) -> int | None:
        response = self._open(key, "HEAD")
        if response is None:
            return None
        with response:
            length = response.headers.get("Content-Length")
        return int(length) if length is not None and length.isdigit() else None

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        response = self._open(key, start=start, end=end)
        if response is None:
            if start and self.size(key) == start:
                return  # a resumed download that already has every byte
            raise ObjectMissing(f"{self.url}: {key} is missing")
        with response:
            ranged = response.status == 206
            skip = start if start and not ranged else 0  # a server that ignores Range: skip ahead
            left = -1 if end is None or ranged else end - start  # ... and stop at the range's end
            promised = response.headers.get("Content-Length", "")
            received = 0
            while left and (chunk := self._chunk(response, key)):
                received += len(chunk)
                if skip:
                    dropped = min(skip, len(chunk))
                    chunk, skip = chunk[dropped:], skip - dropped
                if left > 0:
                    chunk = chunk[:left]
                    left -= len(chunk)
                if chunk:
                    yield chunk
            if left and promised.isdigit() and received < int(promised):  # http.client ends a cut body quietly
                raise StoreUnreachable(f"{self.url}/{key}: the download broke off after {received:,} of the "
                                       f"{int(promised):,} bytes the server announced")

    def _chunk(self, response, key: str) -> bytes:
        try:
            return response.read(READ_CHUNK)
        except (http.client.HTTPException, OSError) as error:  # the connection dropped mid-object
            raise StoreUnreachable(f"{self.url}/{key}: the download broke off ({type(error).__name__})") from None

    def read_small(self, key: str, max_bytes: int) -> bytes | None:
        response = self._open(key)
        if response is None:
            return None
        with response:
            return response.read(max_bytes + 1)

    def write_small(self, key: str, data: bytes, *, exclusive: bool) -> bool:
        raise StoreUnavailable(f"{self.url}: an HTTP mirror is read-only (push --to the directory it serves)")

    def upload(self, key: str, parts: Iterable[bytes], size: int, *, exclusive: bool = True) -> bool:
        raise StoreUnavailable(f"{self.url}: an HTTP mirror is read-only (push --to the directory it serves)")

