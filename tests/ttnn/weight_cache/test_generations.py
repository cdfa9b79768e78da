# SPDX-License-Identifier: Apache-2.0
"""Build generations on real directories, real locks and real processes: ownership is proven by a
record before anything is removed, leases keep what readers use, a killed build is cleaned up by
the next holder of the build lock, and the lock works where users are (a lock file they may only
read, a cache they cannot write)."""

from __future__ import annotations

import os

import pytest

from models.common.weight_cache.generations import (
    Generation,
    build_lock,
    owned_generations,
    reader_lease,
    read_record,
    retire,
    retire_unnamed,
)
from models.common.weight_cache.layout import GENERATION_RECORD, READERS_LEASE, VariantPaths
from models.testing.cache_child import Child


@pytest.fixture
def paths(tmp_path) -> VariantPaths:
    return VariantPaths(tmp_path / "cache", {"family": "llama", "precision": "bfloat16"})


def made(paths: VariantPaths) -> str:
    generation = Generation(paths)
    generation.release()
    return generation.name


def test_a_generation_with_a_reader_is_kept_and_retired_once_the_reader_is_gone(paths):
    name = made(paths)  # no marker names it: it is retirable
    with reader_lease(paths, name) as leased:
        assert leased
        retired = retire_unnamed(paths)
        assert retired.retired == [] and retired.leased == [name]
        assert paths.generation_dir(name).is_dir()
    assert retire_unnamed(paths).retired == [name]
    assert not paths.generation_dir(name).exists()
    with reader_lease(paths, name) as leased:  # gone: the reader re-reads the marker
        assert not leased


def test_a_builder_holds_its_own_generation_against_retirement(paths):
    generation = Generation(paths)
    assert retire_unnamed(paths).leased == [generation.name]
    generation.remove()
    assert not generation.path.exists()


def test_a_killed_build_is_retired_by_the_next_holder_of_the_lock(paths):
    with Child("build", str(paths.cache_dir), paths.tag) as builder:
        name = builder.detail
        assert read_record(paths.generation_dir(name)).pid == builder.process.pid
        with build_lock(paths, blocking=False) as lock:
            assert not lock.held  # the live builder has it
    # SIGKILLed: the kernel released its lock and lease; its generation is debris of this variant
    assert owned_generations(paths) == [name]
    with build_lock(paths, blocking=False) as lock:
        assert lock.held
        assert retire_unnamed(paths).retired == [name]


def test_nothing_without_this_variants_record_is_ever_removed(paths, tmp_path):
    """A user's folder, another model's cache, a look-alike without a record, another variant's
    generation, a symlink to a generation elsewhere: all survive retirement."""
    cache = paths.cache_dir
    cache.mkdir(parents=True)
    user_folder = cache / "gemma-2b"
    user_folder.mkdir()
    (user_folder / "weights.bin").write_bytes(b"user data")
    other_model = cache / "gemma-3-270m--0123456789abcdef"
    (other_model / "bfloat16").mkdir(parents=True)
    look_alike = cache / "g18f2b3c4d5e6f7a8-abcdef"  # a generation's name, no record
    look_alike.mkdir()
    (look_alike / READERS_LEASE).touch()
    other_variant = VariantPaths(cache, {"family": "qwen3", "precision": "bfloat16"})
    theirs = made(other_variant)
    elsewhere = VariantPaths(tmp_path / "elsewhere", paths.build_variant)
    target = made(elsewhere)
    (cache / "g1-aaaaaa").symlink_to(elsewhere.generation_dir(target))
    forged = cache / "g2-bbbbbb"  # a record naming another directory
    forged.mkdir()
    (forged / GENERATION_RECORD).write_text(
        '{"name": "g3-cccccc", "variant": "%s", "build": "x", "created_ns": 1, "host": "h", "pid": 1}' % paths.tag)
    ours = made(paths)

    assert owned_generations(paths) == [ours]
    assert retire_unnamed(paths).retired == [ours]
    assert (user_folder / "weights.bin").read_bytes() == b"user data"
    assert other_model.is_dir() and look_alike.is_dir() and forged.is_dir()
    assert other_variant.generation_dir(theirs).is_dir()
    assert elsewhere.generation_dir(target).is_dir() and (cache / "g1-aaaaaa").is_symlink()
    assert retire(paths, "g1-aaaaaa") is None and retire(paths, "gemma-2b") is None


def test_a_reader_never_leases_a_generation_being_retired(paths):
    name = made(paths)
    with Child("retiring", str(paths.generation_dir(name))):
        with reader_lease(paths, name) as leased:
            assert not leased


def test_a_lock_file_the_user_may_only_read_still_locks(paths, as_unprivileged_python):
    """Another user's 0644 ``.build.lock`` in a shared cache: opened read-only, it still excludes
    (flock on a local file system does not care how the file was opened)."""
    paths.cache_dir.mkdir(parents=True)
    paths.cache_dir.chmod(0o777)
    paths.build_lock.touch()
    os.chown(paths.build_lock, 65534, 65534)
    paths.build_lock.chmod(0o644)
    probe = (
        "import sys; from pathlib import Path\n"
        "from models.common.weight_cache.generations import build_lock\n"
        "from models.common.weight_cache.layout import VariantPaths\n"
        "with build_lock(VariantPaths(Path(sys.argv[1])), blocking=sys.argv[2] == 'wait') as s: print(s.held, repr(s.why))\n"
    )
    assert as_unprivileged_python(probe, str(paths.cache_dir), "wait").startswith("True")
    with Child("lock", str(paths.cache_dir)):
        assert as_unprivileged_python(probe, str(paths.cache_dir), "try").startswith("False")


def test_an_unwritable_cache_dir_says_why_it_cannot_lock(tmp_path, readonly_view):
    view = readonly_view(tmp_path)  # a real read-only mount: root cannot write there either
    with build_lock(VariantPaths(view / "cache")) as lock:
        assert not lock.held and "cannot open" in lock.why


def test_the_build_lock_names_its_holder(paths):
    with build_lock(paths) as lock:
        assert lock.held
        assert f"pid {os.getpid()}" in paths.build_lock.read_text()
