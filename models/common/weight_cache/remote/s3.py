# SPDX-License-Identifier: Apache-2.0
"""The S3 backend of a shared cache (boto3): any S3 API, AWS's or a server's on the fleet's network.

* **Endpoint**: the ``endpoint_url`` argument, else ``AWS_ENDPOINT_URL`` as boto3 reads it.
* **Credentials** come only from boto3's standard chain (environment, shared files, instance
  roles); this module never reads, prints, logs or writes one, and its error lines carry the
  service's error code and message only.
* **Checksummed**: every PUT and every part carries a CRC32 the server checks (``BadDigest``
  otherwise), on top of the BLAKE3 every object is named by and every download is checked against
  (so botocore's own check of a download is off; SHA-256 instead of CRC32 made a push 20% slower).
* **Multipart** above :data:`MULTIPART_THRESHOLD`: parts read in order (the name's digest is checked
  as they are read) and sent :data:`PART_THREADS` at a time; the upload is completed only after the
  last part proved the digest, and aborted otherwise, so a wrong object never becomes visible.
* **Retries**: botocore's are off; an object transfer is retried by :mod:`.retry`'s one rule, and
  errors are sorted for it here (:class:`StoreUnreachable`: no answer, a broken stream, a 5xx).
* **Conditional writes**: objects and manifests are written with ``If-None-Match: *``; a store that
  does not implement it (HTTP 501) is written unconditionally, which content addressing makes safe.
"""

from __future__ import annotations

import contextlib
import http.client
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from models.common.weight_cache.remote.stores import (
    READ_CHUNK,
    TRANSFER_THREADS,
    ObjectMissing,
    RemoteStoreError,
    StoredKey,
    StoreUnavailable,
    StoreUnreachable,
)

MULTIPART_THRESHOLD = 64 << 20
PART_BYTES = 16 << 20  # S3's least part is 5 MiB; its most parts 10,000 (160 GB at this size)
PART_THREADS = 4  # parts of one object in flight (memory: PART_THREADS + 1 parts per object)
CHECKSUM_ALGORITHM = "CRC32"  # the server checks each PUT and part against it (BadDigest otherwise)
_CREDENTIAL_CODES = frozenset(("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
                               "InvalidToken", "AuthorizationHeaderMalformed", "403"))
_MISSING_CODES = frozenset(("NoSuchKey", "404", "NotFound"))
_BAD_NAME_CODES = frozenset(("InvalidBucketName", "NoSuchBucket"))


class S3Store:
    """``s3://bucket/prefix`` through one boto3 client (thread-safe; pooled connections)."""

    can_list = True

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 part_bytes: int = PART_BYTES, multipart_threshold: int = MULTIPART_THRESHOLD) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = f"{prefix.strip('/')}/" if prefix.strip("/") else ""
        self.url = f"s3://{bucket}/{self.prefix}"
        self.part_bytes = part_bytes
        self.multipart_threshold = max(multipart_threshold, part_bytes)
        self._conditional = True
        session = boto3.session.Session()
        config = Config(retries={"total_max_attempts": 1, "mode": "standard"},  # retry.py's rule is the only one
                        connect_timeout=5, read_timeout=60,
                        max_pool_connections=TRANSFER_THREADS * PART_THREADS,
                        response_checksum_validation="when_required")  # a download is checked against its BLAKE3
        try:
            with self._errors():
                self.client = session.client("s3", endpoint_url=endpoint_url or None, config=config,
                                             region_name=session.region_name or "us-east-1")
        except ValueError as error:  # botocore's word for an endpoint that is not a URL
            raise StoreUnavailable(f"{self.url}: {error}") from None

    def _key(self, key: str) -> str:
        return self.prefix + key

    @contextlib.contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        """botocore's errors as one line each: bad input (:class:`StoreUnavailable`), or a missing key."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            HTTPClientError,
            IncompleteReadError,
            NoCredentialsError,
            ParamValidationError,
            PartialCredentialsError,
        )
        from botocore.exceptions import ConnectionError as BotoConnectionError

        where = self.url + (key or "")
        try:
            yield
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            message = str(error.response.get("Error", {}).get("Message", "")) or code
            if code in _BAD_NAME_CODES:
                raise StoreUnavailable(f"{self.url}: no such bucket {self.bucket!r} ({code})") from None
            if code in _CREDENTIAL_CODES:
                raise StoreUnavailable(f"{self.url}: the store refused the credentials ({code}: {message})") from None
            if code in _MISSING_CODES:
                raise ObjectMissing(f"{where} is missing") from None
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if status >= 500 and status != 501:  # the server is there but failing (SlowDown, a gateway)
                raise StoreUnreachable(f"{where}: the store answered {status} ({code}: {message})") from None
            raise RemoteStoreError(f"{where}: {code}: {message}") from None
        except (NoCredentialsError, PartialCredentialsError):
            raise StoreUnavailable(f"{self.url}: no AWS credentials (the standard chain: AWS_ACCESS_KEY_ID and "
                                   "AWS_SECRET_ACCESS_KEY, ~/.aws, an instance role)") from None
        except ParamValidationError as error:
            raise StoreUnavailable(f"{self.url}: {error}") from None
        except (BotoConnectionError, HTTPClientError, IncompleteReadError) as error:  # refused, reset, timed out
            raise StoreUnreachable(f"{where}: cannot reach the store ({type(error).__name__}: {error})") from None
        except BotoCoreError as error:
            raise StoreUnavailable(f"{self.url}: {type(error).__name__}: {error}") from None

    # -- reading ----------------------------------------------------------------------------

    def list_sizes(self, prefix: str) -> dict[str, int]:
        return {key: stored.size for key, stored in self.list_keys(prefix).items()}

    def list_keys(self, prefix: str) -> dict[str, StoredKey]:
        found: dict[str, StoredKey] = {}
        with self._errors(prefix):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key(prefix))
            for page in pages:
                for entry in page.get("Contents", ()):
                    found[entry["Key"][len(self.prefix):]] = StoredKey(int(entry["Size"]),
                                                                       entry["LastModified"].timestamp())
        return found

    def size(self, key: str) -> int | None:
        try:
            with self._errors(key):
                return int(self.client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"])
        except ObjectMissing:
            return None

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        answer = self._get(key, start, end)
        if answer is None:
            return
        with contextlib.closing(answer["Body"]) as body, self._errors(key):
            yield from body.iter_chunks(READ_CHUNK)

    def _get(self, key: str, start: int = 0, end: int | None = None) -> dict[str, Any] | None:
        """The GET of ``key`` from ``start`` (to ``end``, exclusive); None when a resumed download
        asks from the very end of the object (it has every byte already)."""
        extra = {"Range": f"bytes={start}-{'' if end is None else end - 1}"} if start or end is not None else {}
        try:
            with self._errors(key):
                return self.client.get_object(Bucket=self.bucket, Key=self._key(key), **extra)
        except RemoteStoreError as error:
            if start and "InvalidRange" in str(error) and self.size(key) == start:
                return None
            raise

    def read_through(self, key: str, start: int, buffer: memoryview) -> Iterator[bytes | memoryview]:
        """One GET of ``key`` from ``start``, its body received from the socket straight into
        ``buffer`` piece by piece (see :func:`~models.common.weight_cache.remote.stores.read_through`).

        botocore's and urllib3's ``read`` make a new ``bytes`` per read and copy it: a fresh
        allocation and a page fault per 4 KiB. When the body is urllib3's response over
        ``http.client``'s (every botocore so far), its ``readinto`` fills ``buffer``; a body cut
        short of the length the server announced is a broken transfer (http.client ends it
        quietly), and the connection goes back to the pool once the body was read to its end, as
        urllib3 does itself. Any other body is read through botocore. The caller checks the size
        and the digest whatever the path."""
        answer = self._get(key, start)
        if answer is None:
            return
        body = answer["Body"]
        raw = getattr(body, "_raw_stream", None)
        socket_body = getattr(raw, "_fp", None)
        with contextlib.closing(body), self._errors(key):
            if not callable(getattr(socket_body, "readinto", None)) or not callable(getattr(raw, "release_conn", None)):
                yield from body.iter_chunks(READ_CHUNK)
                return
            promised = int(answer.get("ContentLength", -1))
            received = 0
            while count := _receive(socket_body, buffer, self.url + key):
                received += count
                yield buffer[:count]
            if received < promised:
                raise StoreUnreachable(f"{self.url}{key}: the download broke off after {received:,} of the "
                                       f"{promised:,} bytes the server announced")
            if socket_body.isclosed():  # read to its end: the connection is reusable
                raw.release_conn()

    def read_small(self, key: str, max_bytes: int) -> bytes | None:
        try:
            with self._errors(key):
                body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
                with contextlib.closing(body):
                    return body.read(max_bytes + 1)
        except ObjectMissing:
            return None

    # -- writing ----------------------------------------------------------------------------

    def delete(self, key: str) -> None:
        with self._errors(key):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))  # an absent key: S3 answers 204

    def write_small(self, key: str, data: bytes, *, exclusive: bool) -> bool:
        return self._put(key, data, exclusive)

    def upload(self, key: str, parts: Iterable[bytes], size: int, *, exclusive: bool = True) -> bool:
        if size < self.multipart_threshold:
            return self._put(key, b"".join(parts), exclusive)
        return self._put_multipart(key, parts, exclusive)

    def _conditions(self, exclusive: bool) -> dict[str, str]:
        return {"IfNoneMatch": "*"} if exclusive and self._conditional else {}

    def _conditional_call(self, call, exclusive: bool, **kwargs: Any) -> bool:
        """``call`` with ``If-None-Match: *`` when exclusive: False when the key exists; once without
        it for a store that does not implement conditions."""
        from botocore.exceptions import ClientError

        try:
            call(**kwargs, **self._conditions(exclusive))
            return True
        except ClientError as error:
            code = str(error.response.get("Error", {}).get("Code", ""))
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if exclusive and (code in ("PreconditionFailed", "ConditionalRequestConflict") or status == 412):
                return False
            if exclusive and self._conditional and (code == "NotImplemented" or status == 501):
                self._conditional = False
                call(**kwargs)
                return True
            raise

    def _put(self, key: str, data: bytes, exclusive: bool) -> bool:
        with self._errors(key):
            return self._conditional_call(self.client.put_object, exclusive, Bucket=self.bucket, Key=self._key(key),
                                          Body=data, ChecksumAlgorithm=CHECKSUM_ALGORITHM)

    def _put_multipart(self, key: str, parts: Iterable[bytes], exclusive: bool) -> bool:
        """Parts in order from ``parts`` (which checks the digest as it goes), :data:`PART_THREADS`
        in flight; completed only when ``parts`` ended without error, aborted otherwise."""
        full_key = self._key(key)
        with self._errors(key):
            upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=full_key,
                                                            ChecksumAlgorithm=CHECKSUM_ALGORITHM)["UploadId"]
        slots = threading.BoundedSemaphore(PART_THREADS + 1)
        sent: list[Future] = []

        def send(number: int, body: bytes) -> dict[str, Any]:
            try:
                with self._errors(key):
                    answer = self.client.upload_part(Bucket=self.bucket, Key=full_key, UploadId=upload_id,
                                                     PartNumber=number, Body=body, ChecksumAlgorithm=CHECKSUM_ALGORITHM)
                return {"PartNumber": number, "ETag": answer["ETag"],
                        f"Checksum{CHECKSUM_ALGORITHM}": answer[f"Checksum{CHECKSUM_ALGORITHM}"]}
            finally:
                slots.release()

        completed = False
        try:
            with ThreadPoolExecutor(PART_THREADS, thread_name_prefix="s3-part") as pool:
                for number, body in enumerate(_in_parts(parts, self.part_bytes), start=1):
                    slots.acquire()
                    sent.append(pool.submit(send, number, body))
                    if any(f.done() and f.exception() for f in sent):
                        break
                uploaded = [future.result() for future in sent]
            with self._errors(key):
                completed = self._conditional_call(
                    self.client.complete_multipart_upload, exclusive, Bucket=self.bucket, Key=full_key,
                    UploadId=upload_id, MultipartUpload={"Parts": uploaded})
            return completed
        finally:
            if not completed:
                with contextlib.suppress(Exception):
                    self.client.abort_multipart_upload(Bucket=self.bucket, Key=full_key, UploadId=upload_id)


def _in_parts(chunks: Iterable[bytes], part_bytes: int) -> Iterator[bytes]:
    """``chunks`` regrouped into parts of exactly ``part_bytes`` (the last one shorter)."""
    pending = bytearray()
    for chunk in chunks:
        pending += chunk
        while len(pending) >= part_bytes:
            yield bytes(pending[:part_bytes])
            del pending[:part_bytes]
    if pending:
        yield bytes(pending)


def _receive(socket_body: Any, buffer: memoryview, where: str) -> int:
    """One ``readinto`` of an ``http.client`` body; a connection that dropped is a broken transfer."""
    try:
        return socket_body.readinto(buffer)
    except (http.client.HTTPException, OSError) as error:
        raise StoreUnreachable(f"{where}: the download broke off ({type(error).__name__})") from None
