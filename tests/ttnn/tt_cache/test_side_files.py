# SPDX-License-Identifier: Apache-2.0
"""The small files beside a cache's weights are data: a FIFO, a number past any float (1e999) or
100,000 nested lists in a marker, a generation record, a stamp index or a use record is refused
(cold, or no record, with a warning), and no command hangs or prints a traceback."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from models.common.weight_cache.layout import CacheRoot
from models.testing.tt_cache import built_tiny_llama, cli_env, json_out, tt_cache

TIMEOUT = 30  # a FIFO opened for reading blocks forever: seconds, never minutes, tell the two apart

DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(checkpoint, cache root) of a tiny llama built once by ``tt-cache build``."""
    return built_tiny_llama(tmp_path_factory.mktemp("side-files"))


def _only(paths: list[Path]) -> Path:
    assert len(paths) == 1, paths
    return paths[0]


def _cache_dir(root: Path) -> Path:
    return _only(list(root.rglob(".weights_complete.*"))).parent


def _tag(root: Path) -> str:
    return _only(list(root.rglob(".weights_complete.*"))).name.rsplit(".", 1)[1]


# Where each side file is, in a copied cache root.
SIDE_FILES: dict[str, Callable[[Path, Path], Path]] = {
    "marker": lambda root, _: _only(list(root.rglob(".weights_complete.*"))),
    "generation record": lambda root, _: _only(list(_cache_dir(root).glob("g*/.generation"))),
    "stamp index": lambda root, _: _cache_dir(root) / f".stamps.{_tag(root)}.json",
    "checkpoint stamps": lambda root, checkpoint: CacheRoot(root).checkpoint_stamps("tiny-llama", checkpoint),
    # another location's (or an older format's) index of the name: read when the own one misses
    "shared checkpoint stamps": lambda root, _: root / ".stamps" / "checkpoints" / "tiny-llama.json",
    "model ids": lambda root, _: _cache_dir(root) / f".model_ids.{_tag(root)}.json",
    "last used": lambda root, _: _cache_dir(root) / f".last_used.{_tag(root)}",
    "reader lease": lambda root, _: _only(list(_cache_dir(root).glob("g*/.readers"))),
}
JSON_FILES = ["marker", "generation record", "stamp index", "checkpoint stamps", "shared checkpoint stamps", "model ids"]
STAND_IN = b'{"format": 1, "entries": {"model.safetensors": [[1, 2, 3, 4, 5, "ab"]]}, "created_ns": 1, "pid": 1}'


def _out_of_range(path: Path) -> None:
    """Every integer of the file (or of a stand-in for one not written yet) made 1e999."""
    raw = path.read_bytes() if path.exists() else STAND_IN
    path.write_bytes(re.sub(rb"(?<=[\[:,])(\s*)-?\d+(?=\s*[,\]}])", rb"\g<1>1e999", raw))


def _deep(path: Path) -> None:
    path.write_bytes(DEEP)


def _fifo(path: Path) -> None:
    if path.exists():
        path.unlink()
    os.mkfifo(path)


TAMPERINGS: dict[str, Callable[[Path], None]] = {"1e999": _out_of_range, "deep": _deep, "fifo": _fifo}
CASES = [(name, kind) for name in SIDE_FILES for kind in TAMPERINGS if kind == "fifo" or name in JSON_FILES]


def _tampered_root(built: tuple[Path, Path], tmp_path: Path, name: str, kind: str) -> tuple[Path, Path]:
    """A copy of the built root (new inodes: the gate re-hashes and reads the stamp index) with
    one side file tampered with: (root, the tampered file)."""
    root = tmp_path / "root"
    shutil.copytree(built[1], root, symlinks=True)
    target = SIDE_FILES[name](root, built[0])
    target.parent.mkdir(parents=True, exist_ok=True)
    TAMPERINGS[kind](target)
    return root, target


def _run(*args: str, root: Path) -> tuple[int, str, str]:
    out = tt_cache(*args, env=cli_env(root), timeout=TIMEOUT)
    assert "Traceback" not in out.stdout + out.stderr, (args, out.stderr[-3000:])
    return out.returncode, out.stdout, out.stderr


@pytest.mark.parametrize("name, kind", CASES, ids=[f"{name}-{kind}" for name, kind in CASES])
def test_a_tampered_side_file_never_hangs_or_raises_in_the_tools(built, tmp_path, name, kind):
    root, target = _tampered_root(built, tmp_path, name, kind)
    cache_dir = _cache_dir(root)
    code, listing, ls_err = _run("ls", str(root), "--json", root=root)
    assert code == 0
    (variant,) = json.loads(listing)["variants"]
    assert variant["state"] == ("cold" if name == "marker" else "warm"), variant
    code, check_out, check_err = _run("check", str(cache_dir), root=root)
    assert code == (1 if name == "marker" else 0), check_out + check_err[-2000:]
    code, _, gc_err = _run("gc", str(root), "--max-size", "1G", root=root)
    assert code == 0
    code, _, clean_err = _run("clean", str(root), root=root)
    assert code == 0
    if name == "marker":
        assert target.name in check_out
    elif name in ("generation record", "stamp index"):  # read by ls (leftover builds) and check (re-hash)
        assert str(target) in ls_err + check_err + gc_err + clean_err, (ls_err + check_err)[-3000:]
    assert all(path.exists() for path in cache_dir.glob("g*/*.tensorbin")) or name == "marker"


BUILD_CASES = [("generation record", "1e999"), ("generation record", "fifo"), ("checkpoint stamps", "deep"),
               ("checkpoint stamps", "fifo"), ("shared checkpoint stamps", "fifo"), ("stamp index", "deep"),
               ("reader lease", "fifo")]


@pytest.mark.parametrize("name, kind", BUILD_CASES, ids=[f"{name}-{kind}" for name, kind in BUILD_CASES])
def test_a_build_next_to_a_tampered_side_file_loads_warm(built, tmp_path, name, kind):
    """A build of the dir reads the records (retirement), the checkpoint's stamps (its content id),
    the stamp index (a copied cache is re-hashed) and takes the reader lease."""
    root, target = _tampered_root(built, tmp_path, name, kind)
    out = tt_cache("build", str(built[0]), "--precision", "bfloat16", "--json", env=cli_env(root), timeout=60)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr[-3000:]
    outcome = json_out(out)["outcome"]
    assert outcome == "warm", (outcome, json_out(out)["reason"])
