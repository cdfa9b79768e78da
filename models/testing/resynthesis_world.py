# SPDX-License-Identifier: Apache-2.0
"""What the resynthesis tests run on: tiny real checkpoints (one with a real trained tokenizer),
their ttnn weight caches, the training demo as a real process, and real file systems that fail
(a tmpfs that fills up, a read-only remount, an ext4 of ``models.testing.mounts`` shut down: EIO)."""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXT4_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
EXT4_GOING_FLAGS_NOLOGFLUSH = 2

requires_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a file system needs root")


def make_tokenizer(directory: Path, vocab_size: int) -> Path:
    """Train a real word-level tokenizer on the demo's stdlib text and save it into ``directory``
    the way a hub checkpoint ships one (``tokenizer.json`` + ``tokenizer_config.json``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from models.demos.resynthesis.prompts import stdlib_text

    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([stdlib_text()], trainers.WordLevelTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "<bos>", "<eos>", "<unk>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", pad_token="<pad>")
    fast.save_pretrained(directory)
    return directory


@dataclass
class World:
    base: Path
    model: Path  # tiny llama with a tokenizer
    bare: Path  # the same weights, no tokenizer
    other: Path  # another tiny llama (other weights), no tokenizer
    weights: Path  # ttnn weight cache root shared by the tests
    share_dir: Path  # the tests' own CPU-share directory

    def env(self, **extra: str) -> dict[str, str]:
        """The demo's environment: this repo, offline, the tests' CPU share (never another
        engineer's trainers on the machine)."""
        env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", TT_CPU_SHARE_DIR=str(self.share_dir))
        env.pop("OMP_NUM_THREADS", None)
        env.pop("TT_PREFILL_CACHE_MAX_SIZE", None)
        env.update(extra)
        return env

    def command(self, *args: str | Path, model: Path | None = None) -> list[str]:
        return [sys.executable, "-m", "models.demos.resynthesis", "--model", str(model or self.model),
                "--weight-cache", str(self.weights), *map(str, args)]

    def demo(self, *args: str | Path, model: Path | None = None, env: dict[str, str] | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess:
        """Run the training demo in a fresh process (small defaults: 6 prompts of 4-12 tokens)."""
        return subprocess.run(self.command(*args, model=model), cwd=REPO, env=env or self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def main(self, *args: str | Path, model: Path | None = None, **env: str) -> subprocess.CompletedProcess:
        """Run the training demo's ``main`` in this process (no import cost; an exception is a
        test error, so no traceback can pass unseen); stdout captured, ``env`` set meanwhile."""
        from models.demos.resynthesis.__main__ import main

        argv = self.command(*args, model=model)[3:]
        saved = dict(os.environ)
        os.environ.update(self.env(**env))
        for name in ("OMP_NUM_THREADS", "TT_PREFILL_CACHE_MAX_SIZE"):
            if name not in env:
                os.environ.pop(name, None)
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = main(argv)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())

    def popen(self, *args: str | Path, model: Path | None = None, env: dict[str, str] | None = None
              ) -> subprocess.Popen:
        return subprocess.Popen(self.command(*args, model=model), cwd=REPO, env=env or self.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def report(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def losses(path: Path) -> list[list[float]]:
    return [epoch["losses"] for epoch in report(path)["epochs"]]


def no_traceback(done: subprocess.CompletedProcess) -> str:
    """The process's output for an assertion message (and a check that it holds no traceback)."""
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, done.stderr[-4000:]
    return done.stdout[-3000:] + done.stderr[-3000:]


# ---------------------------------------------------------------------------------------------
# Real file systems that fail
# ---------------------------------------------------------------------------------------------


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (e.g. ``64k``) mounted at ``path`` for the block."""
    path.mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path))
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def remount_read_only(path: Path) -> None:
    _run("mount", "-o", "remount,ro", str(path))


def shut_down(path: Path) -> None:
    """What ext4 does when its device fails: from now on every write (and every uncached read)
    under ``path`` fails with EIO (``EXT4_IOC_SHUTDOWN``, as ``xfs_io -c shutdown`` does)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, EXT4_GOING_FLAGS_NOLOGFLUSH.to_bytes(4, "little"))
    finally:
        os.close(fd)
