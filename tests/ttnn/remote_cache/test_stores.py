# SPDX-License-Identifier: Apache-2.0
"""The store backends keep one contract on a real S3 server (SeaweedFS), a directory and that
directory served over HTTP: a key written exclusive is never replaced, an upload whose bytes are
not its digest leaves nothing (multipart included), a download resumes from its prefix, and a store
that cannot be used is one line naming it, never a credential."""

from __future__ import annotations

import os
import random
from pathlib import Path

import blake3
import pytest

from models.common.weight_cache.remote.s3 import S3Store
from models.common.weight_cache.remote.store_layout import object_key
from models.common.weight_cache.remote.stores import (
    DirectoryStore,
    HttpStore,
    ObjectMissing,
    StoreUnavailable,
    read_through,
)
from models.common.weight_cache.remote.transfer import PIECE_BYTES, DigestMismatch, fetch_object, verified_parts
from models.common.weight_cache.remote.urls import open_store
from models.testing.object_store import SECRET_KEY, free_ports, serve_directory

MiB = 1 << 20


@pytest.fixture(params=["s3", "directory"])
def writable(request, tmp_path):
    if request.param == "s3":
        return open_store(request.getfixturevalue("s3_url"))
    return DirectoryStore(tmp_path / "store", create=True)


def _file(path: Path, size: int, seed: int = 0) -> tuple[Path, str]:
    data = random.Random(seed).randbytes(size)
    path.write_bytes(data)
    return path, blake3.blake3(data).hexdigest()


def test_a_key_written_exclusive_is_never_replaced(writable):
    assert writable.write_small("variants/x/one", b"first", exclusive=True)
    assert not writable.write_small("variants/x/one", b"second", exclusive=True)
    assert writable.read_small("variants/x/one", 100) == b"first"
    assert writable.write_small("variants/x/one", b"third", exclusive=False)  # a pointer may move
    assert writable.read_small("variants/x/one", 100) == b"third"


def test_listing_sizes_and_ranged_reads(writable, tmp_path):
    source, digest = _file(tmp_path / "blob", 3 * MiB + 17)
    key = object_key(digest)
    assert writable.upload(key, verified_parts(source, digest, source.stat().st_size), source.stat().st_size)
    assert writable.list_sizes("objects/") == {key: 3 * MiB + 17}
    assert writable.size(key) == 3 * MiB + 17 and writable.size(object_key("0" * 64)) is None
    assert b"".join(writable.read(key, start=MiB + 5)) == source.read_bytes()[MiB + 5:]
    with pytest.raises(ObjectMissing):
        b"".join(writable.read(object_key("0" * 64)))


@pytest.mark.parametrize("kind", ["s3-single", "s3-multipart", "directory"])
def test_an_upload_whose_bytes_are_not_their_digest_leaves_nothing(kind, request, tmp_path):
    source, digest = _file(tmp_path / "blob", 11 * MiB)
    with open(source, "r+b") as stream:  # the file changed after its digest was recorded
        stream.seek(7 * MiB)
        stream.write(b"\xff")
    if kind == "directory":
        store = DirectoryStore(tmp_path / "store", create=True)
    else:
        url = request.getfixturevalue("s3_url")
        small = 5 * MiB if kind == "s3-multipart" else 64 * MiB
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        store = S3Store(bucket, prefix, part_bytes=5 * MiB, multipart_threshold=small)
    with pytest.raises(DigestMismatch):
        store.upload(object_key(digest), verified_parts(source, digest, 11 * MiB), 11 * MiB)
    assert store.size(object_key(digest)) is None and store.list_sizes("") == {}
    if kind.startswith("s3"):
        pending = store.client.list_multipart_uploads(Bucket=store.bucket, Prefix=store.prefix).get("Uploads", [])
        assert pending == []  # the parts sent were aborted


def test_a_multipart_upload_is_stored_whole_and_checksummed(s3_url, tmp_path):
    source, digest = _file(tmp_path / "blob", 11 * MiB + 3)
    bucket, _, prefix = s3_url.removeprefix("s3://").partition("/")
    store = S3Store(bucket, prefix, part_bytes=5 * MiB, multipart_threshold=5 * MiB)
    assert store.upload(object_key(digest), verified_parts(source, digest, 11 * MiB + 3), 11 * MiB + 3)
    head = store.client.head_object(Bucket=bucket, Key=store._key(object_key(digest)), ChecksumMode="ENABLED")
    assert head["ContentLength"] == 11 * MiB + 3 and head["ETag"].strip('"').endswith("-3")  # three parts
    assert head.get("ChecksumCRC32"), head  # each part was sent with a checksum the server checked
    assert blake3.blake3(b"".join(store.read(object_key(digest)))).hexdigest() == digest
    again = store.upload(object_key(digest), verified_parts(source, digest, 11 * MiB + 3), 11 * MiB + 3)
    assert again is False  # If-None-Match on the completion: the first one stands


def test_a_store_that_cannot_be_used_is_one_line_without_the_secret(seaweed, s3_env, monkeypatch, tmp_path):
    (dead_port,) = free_ports(1)
    cases = {
        "unknown bucket": lambda: open_store("s3://no-such-bucket/p").list_sizes(""),
        "invalid bucket name": lambda: open_store("s3://b1/p").list_sizes(""),
        "bucket name with a slash": lambda: open_store("s3://a_b/p").list_sizes(""),
        "endpoint not a URL": lambda: open_store(f"s3://{seaweed.bucket}/p", endpoint_url="not a url"),
        "unreachable endpoint": lambda: open_store(f"s3://{seaweed.bucket}/p",
                                                   endpoint_url=f"http://127.0.0.1:{dead_port}").list_sizes(""),
        "unreachable mirror": lambda: HttpStore(f"http://127.0.0.1:{dead_port}/m").size("x"),
        "missing directory": lambda: open_store(str(tmp_path / "nowhere")),
        "read-only mirror": lambda: HttpStore("http://127.0.0.1:1/m").write_small("k", b"", exclusive=True),
        "unknown scheme": lambda: open_store("ftp://host/x"),
    }
    for name, attempt in cases.items():
        with pytest.raises(StoreUnavailable) as refused:
            attempt()
        assert "\n" not in str(refused.value), name
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY + "-wrong")
    with pytest.raises(StoreUnavailable, match="refused the credentials") as refused:
        open_store(f"s3://{seaweed.bucket}/p").list_sizes("")
    assert SECRET_KEY not in str(refused.value)
    for name in ("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID"):
        monkeypatch.delenv(name)
    with pytest.raises(StoreUnavailable, match="no AWS credentials"):
        open_store(f"s3://{seaweed.bucket}/p").list_sizes("")


def test_a_download_resumes_with_a_range_request_and_checks_the_whole_object(tmp_path):
    root = tmp_path / "mirror"
    store = DirectoryStore(root, create=True)
    source, digest = _file(tmp_path / "blob", 2 * MiB + 11, seed=3)
    store.upload(object_key(digest), verified_parts(source, digest, 2 * MiB + 11), 2 * MiB + 11)
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / f"{digest}.part").write_bytes(source.read_bytes()[:MiB])  # what a killed pull had fetched
    with serve_directory(root) as http:
        staged, fetched = fetch_object(HttpStore(http.url), digest, 2 * MiB + 11, staging)
        assert (f"/{object_key(digest)}", f"bytes={MiB}-") in http.ranges  # only the rest was asked for
        assert fetched == MiB + 11 and staged.read_bytes() == source.read_bytes()
        assert sorted(os.listdir(staging)) == [digest]
        # a part file whose bytes are not the object's: the whole object fails its digest, nothing is kept
        staged.unlink()
        (staging / f"{digest}.part").write_bytes(b"\0" * MiB)
        with pytest.raises(DigestMismatch):
            fetch_object(HttpStore(http.url), digest, 2 * MiB + 11, staging)
        assert os.listdir(staging) == []
        # a staged object damaged since: fetched again whole
        fetch_object(HttpStore(http.url), digest, 2 * MiB + 11, staging)
        with open(staging / digest, "r+b") as stream:
            stream.write(b"\1")
        _, fetched = fetch_object(HttpStore(http.url), digest, 2 * MiB + 11, staging)
        assert fetched == 2 * MiB + 11 and (staging / digest).read_bytes() == source.read_bytes()


@pytest.mark.parametrize("backend", ["http", "s3", "directory"])
def test_a_large_object_comes_as_one_stream_and_resumes_from_its_prefix(backend, request, tmp_path):
    """An object of many pieces: one read from where the part file ends (over HTTP: one range
    request for the rest), hashed and written in order; a byte the store holds wrong keeps nothing."""
    size = 5 * PIECE_BYTES + 3 * MiB + 7
    root = tmp_path / "mirror"
    source, digest = _file(tmp_path / "blob", size, seed=5)
    data = source.read_bytes()
    store = open_store(request.getfixturevalue("s3_url")) if backend == "s3" else DirectoryStore(root, create=True)
    store.upload(object_key(digest), verified_parts(source, digest, size), size)
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / f"{digest}.part").write_bytes(data[:MiB])  # what a killed pull had fetched
    with serve_directory(root) as http:
        reader = HttpStore(http.url) if backend == "http" else store
        staged, fetched = fetch_object(reader, digest, size, staging)
        assert fetched == size - MiB and staged.read_bytes() == data
        if backend == "http":
            assert [wanted for path, wanted in http.ranges if path == f"/{object_key(digest)}"] == [f"bytes={MiB}-"]
        if backend == "directory":  # a byte wrong in the store: refused, nothing kept
            staged.unlink()
            damaged = bytearray(data)
            damaged[3 * PIECE_BYTES + 5] ^= 0xFF
            (root / object_key(digest)).write_bytes(damaged)
            with pytest.raises(DigestMismatch):
                fetch_object(reader, digest, size, staging)
            assert os.listdir(staging) == []


@pytest.mark.parametrize("backend", ["http", "s3"])
def test_a_body_cut_short_of_its_length_is_a_broken_download_not_a_short_object(backend, monkeypatch, tmp_path):
    """A server that announces a length and closes the connection before it: http.client ends the body
    quietly, which must not read as a short (corrupt) object, but as a store that stopped answering
    (retried, the verified prefix kept). Over S3 the body is received through :func:`read_through`."""
    import socket
    import threading

    from models.common.weight_cache.remote.stores import StoreUnreachable

    listener = socket.create_server(("127.0.0.1", 0))

    def answer_half() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 4096\r\nConnection: close\r\n\r\n" + b"x" * 2048)

    thread = threading.Thread(target=answer_half, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(StoreUnreachable, match="broke off after 2,048 of the 4,096 bytes"):
            if backend == "http":
                b"".join(HttpStore(url).read("objects/x"))
            else:
                for name, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                                    "AWS_CONFIG_FILE": str(tmp_path / "none"),
                                    "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}.items():
                    monkeypatch.setenv(name, value)
                list(read_through(S3Store("bucket", endpoint_url=url), "objects/x", 0, memoryview(bytearray(MiB))))
    finally:
        thread.join(10)
        listener.close()


def _own_connections_to(port: int) -> set[int]:
    """The local ports of this process's open connections to ``port`` on the loopback (its own
    sockets only: other test workers talk to the same server)."""
    own = {target.removeprefix("socket:[").rstrip("]") for target in
           (os.readlink(fd) for fd in Path("/proc/self/fd").iterdir() if fd.is_symlink()) if target.startswith("socket:[")}
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[2].endswith(f":{port:04X}") and fields[3] == "01" and fields[9] in own:
            found.add(int(fields[1].rpartition(":")[2], 16))
    return found


@pytest.mark.parametrize("backend", ["s3", "directory"])
def test_a_read_through_fills_the_callers_buffer_and_an_s3_connection_is_kept(backend, request, seaweed, tmp_path):
    """Every piece is a view of the caller's one buffer (no ``bytes`` per piece), from any offset;
    over S3 the body is received from the socket and the connection goes back to the pool."""
    size = 3 * MiB + 5
    source, digest = _file(tmp_path / "blob", size, seed=9)
    data = source.read_bytes()
    store = open_store(request.getfixturevalue("s3_url")) if backend == "s3" else DirectoryStore(tmp_path / "s", create=True)
    store.upload(object_key(digest), verified_parts(source, digest, size), size)
    port = int(seaweed.endpoint.rpartition(":")[2])
    buffer = bytearray(256 << 10)
    pooled = _own_connections_to(port)
    assert pooled or backend == "directory"
    for start in (0, MiB + 3, size - 1):
        pieces = list(read_through(store, object_key(digest), start, memoryview(buffer)))
        assert all(isinstance(piece, memoryview) and piece.obj is buffer for piece in pieces)
        assert sum(len(piece) for piece in pieces) == size - start
    received = bytearray()
    for piece in read_through(store, object_key(digest), MiB, memoryview(buffer)):
        received += piece
    assert received == data[MiB:]
    assert _own_connections_to(port) == pooled  # every body read to its end: the one connection went back to the pool
    with pytest.raises(ObjectMissing):
        list(read_through(store, object_key("0" * 64), 0, memoryview(buffer)))
