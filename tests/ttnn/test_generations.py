# SPDX-License-Identifier: Apache-2.0
"""Build generations on real directories and real locks: a held reader lease keeps a generation,
a retired one refuses new leases, an unwritable cache dir builds unlocked."""

from __future__ import annotations

import os

from models.common.generations import (
    READERS_LEASE,
    build_lock,
    new_generation,
    reader_lease,
    retire_generations,
)


def test_a_generation_with_a_reader_is_kept_and_retired_once_the_reader_is_gone(tmp_path):
    name = new_generation(tmp_path)  # no marker names it: it is retirable
    with reader_lease(tmp_path, name) as leased:
        assert leased
        assert retire_generations(tmp_path) == []
        assert (tmp_path / name).is_dir()
    assert retire_generations(tmp_path) == [name]
    assert not (tmp_path / name).exists()
    with reader_lease(tmp_path, name) as leased:  # gone: the reader re-reads the marker
        assert not leased


def test_a_killed_build_without_a_lease_is_retired_and_top_level_files_need_no_lease(tmp_path):
    name = new_generation(tmp_path)
    (tmp_path / name / READERS_LEASE).unlink()
    assert retire_generations(tmp_path) == [name]
    with reader_lease(tmp_path, None) as leased:
        assert leased


def test_an_unwritable_cache_dir_builds_unlocked(tmp_path, readonly_view):
    view = readonly_view(tmp_path)  # a real read-only mount: root cannot write there either
    with build_lock(view / "cache") as locked:
        assert not locked


def test_the_build_lock_names_its_holder(tmp_path):
    with build_lock(tmp_path) as locked:
        assert locked
        assert f"pid {os.getpid()}" in (tmp_path / ".build.lock").read_text()
