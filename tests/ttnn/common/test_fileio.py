# SPDX-License-Identifier: Apache-2.0
"""fileio's temp-file rules: exact temp names, and writer liveness decided by a lock the writer
holds (not by a pid, which means nothing in another PID namespace or on another host)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.fileio import (
    atomic_write_bytes,
    create_whole,
    is_temp_path,
    temp_writer_alive,
    unique_temp_path,
    writing_into,
)
from models.testing import REPO_ROOT


@pytest.mark.parametrize("name", [".zshrc.tmp.orig", ".env.tmp.2024", ".x.tmp.12.ab.cd", "a.tmp.1.2.deadbeef",
                                  ".x.tmp.1.2.deadbee", ".x.tmp.pid.2.deadbeef"])
def test_user_files_that_look_temporary_are_not_temp_files(name):
    assert not is_temp_path(Path(name))


def test_every_name_unique_temp_path_makes_is_a_temp_file(tmp_path):
    for suffix in ("", ".tensorbin", ".partial"):
        assert is_temp_path(unique_temp_path(tmp_path / "layers.0" / "wq.tensorbin", suffix))


def test_a_dead_writers_temp_is_debris_and_a_live_writers_is_not(tmp_path):
    temp = unique_temp_path(tmp_path / "w.tensorbin")
    temp.write_bytes(b"x")
    assert not temp_writer_alive(temp)
    with writing_into(tmp_path):
        assert temp_writer_alive(temp)
    assert not temp_writer_alive(temp)


WRITER = """
import os, sys, time
from pathlib import Path
from models.common.fileio import writing_into, unique_temp_path
directory = Path(sys.argv[1])
with writing_into(directory):
    temp = unique_temp_path(directory / "w.tensorbin")
    temp.write_bytes(b"half")
    print(os.getpid(), temp, flush=True)
    time.sleep(60)
"""


def test_a_live_writer_in_another_pid_namespace_keeps_its_temp(tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) on this machine")
    probe = subprocess.run(["unshare", "--pid", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a PID namespace here: {probe.stderr.decode().strip()}")
    writer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-c", WRITER,
                               str(tmp_path)], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                              env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"})
    try:
        pid, temp = writer.stdout.readline().split()
        assert pid == "1"  # its pid means nothing here (in this namespace pid 1 is another process)
        assert temp_writer_alive(Path(temp))
    finally:
        writer.kill()
        writer.wait()
    deadline = time.monotonic() + 10  # --kill-child kills the namespace's pid 1 as unshare dies
    while temp_writer_alive(Path(temp)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not temp_writer_alive(Path(temp))  # the kernel dropped its lock with it


def test_atomic_writes_hold_the_writer_lock_only_while_writing(tmp_path):
    atomic_write_bytes(tmp_path / "f", b"data")
    assert (tmp_path / "f").read_bytes() == b"data"
    leftover = unique_temp_path(tmp_path / "f")
    leftover.write_bytes(b"x")
    assert not temp_writer_alive(leftover)


@pytest.mark.parametrize("tmpfile", ["O_TMPFILE", "no O_TMPFILE"])
def test_a_whole_file_is_created_once_and_leaves_no_temp(tmp_path, monkeypatch, tmpfile):
    """With ``O_TMPFILE`` (Linux) and without it (a temp file hard-linked in, as on a platform or
    Python that lacks it): the data whole, an existing file refused and kept, no temp name left."""
    if tmpfile == "no O_TMPFILE":
        monkeypatch.delattr("os.O_TMPFILE")
    record = tmp_path / ".generation.g1"
    create_whole(record, b'{"owner": "this build"}')
    assert record.read_bytes() == b'{"owner": "this build"}'
    with pytest.raises(FileExistsError):
        create_whole(record, b"a second writer")
    assert record.read_bytes() == b'{"owner": "this build"}'
    assert sorted(p.name for p in tmp_path.iterdir()) == [".generation.g1"]
