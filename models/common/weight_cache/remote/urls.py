# SPDX-License-Identifier: Apache-2.0
"""Which store a URL names (the one place that knows the schemes)."""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from models.common.weight_cache.remote.stores import DirectoryStore, HttpStore, Store, StoreUnavailable


def open_store(url: str, *, endpoint_url: str | None = None, create: bool = False) -> Store:
    """The store a URL names (``create``: for a push, which a directory may be made for and an HTTP
    mirror refuses)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme == "s3":
        from models.common.weight_cache.remote.s3 import S3Store

        if not parsed.netloc:
            raise StoreUnavailable(f"{url}: no bucket (s3://BUCKET/PREFIX)")
        return S3Store(parsed.netloc, parsed.path.strip("/"), endpoint_url=endpoint_url)
    if parsed.scheme in ("http", "https"):
        if create:
            raise StoreUnavailable(f"{url}: an HTTP mirror is read-only (push --to the directory it serves)")
        return HttpStore(url)
    if parsed.scheme in ("", "file"):
        return DirectoryStore(Path(parsed.path if parsed.scheme else url), create=create)
    raise StoreUnavailable(f"{url}: unknown store scheme {parsed.scheme!r} (s3://, http(s)://, file:// or a directory)")
