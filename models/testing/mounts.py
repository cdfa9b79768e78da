# SPDX-License-Identifier: Apache-2.0
"""Real file systems for the tests: an ext4 of its own on a loop device, with the mkfs options or
the block-queue settings (readahead window, request size) a test needs. Where loop devices or
mounting are not allowed (not root, no CAP_SYS_ADMIN), the test is skipped with the reason."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _run_or_skip(why: str, *command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"{why}: {done.stderr.strip()}")
    return done.stdout.strip()


@contextlib.contextmanager
def ext4(path: Path, size_mib: int = 32, *, mkfs_options: tuple[str, ...] = (),
         queue: dict[str, int] | None = None) -> Iterator[Path]:
    """A real ext4 on a loop device (its image in a temp dir) mounted at ``path`` for the block;
    ``queue``: the device's block-queue settings (``read_ahead_kb``, ``max_sectors_kb``, ...)."""
    image_dir = Path(tempfile.mkdtemp(prefix="test-ext4-"))
    image = image_dir / "disk.img"
    try:
        with open(image, "wb") as stream:
            stream.truncate(size_mib << 20)
        _run_or_skip("mkfs.ext4 is not usable here", "mkfs.ext4", "-q", "-F", *mkfs_options, str(image))
        device = _run_or_skip("cannot attach a loop device here (needs root)", "losetup", "-f", "--show", str(image))
        try:
            for name, value in (queue or {}).items():
                (Path("/sys/block") / Path(device).name / "queue" / name).write_text(str(value))
            path.mkdir(parents=True, exist_ok=True)
            _run_or_skip("cannot mount here (needs root with CAP_SYS_ADMIN)", "mount", device, str(path))
            try:
                yield path
            finally:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)
        finally:
            subprocess.run(["losetup", "-d", device], capture_output=True)
    finally:
        shutil.rmtree(image_dir, ignore_errors=True)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``100m``) mounted at ``path`` for the block: a small disk that fills up."""
    path.mkdir(parents=True, exist_ok=True)
    _run_or_skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)", "mount", "-t", "tmpfs", "-o",
                 f"size={size}", "tmpfs", str(path))
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
