# SPDX-License-Identifier: Apache-2.0
"""Two ``tt-cache pull`` processes of one variant into one cache root at once, round after round
(the second started at a random point of the first's transfer): the build lock makes one wait for
the other, both end warm on one sealed build with the store's bytes, and no moment shows a marker
its files do not match; nothing is left staged."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.weight_cache import VariantPaths, verify_weight_cache
from models.common.weight_cache.marker import iter_markers
from models.common.weight_cache.remote.pull import local_status
from models.common.weight_cache.remote.push import push_cache_dir
from models.common.weight_cache.remote.urls import open_store
from models.testing.tt_cache import REPO_ROOT, cli_env

ROUNDS, LONG_ROUNDS = 3, 12


def _start_pull(seaweed, url: str, key: str, root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "models.tt_cache.cli", "pull", "--from", url, key, "--threads", "1",
                             "--json"], env=seaweed.client_env(cli_env(root)), cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _marker_is_warm_whenever_present(cache_dir: Path) -> int:
    """One look at the cache dir: a marker there is a warm build (never a half one); markers seen."""
    seen = 0
    for _, marker, _ in iter_markers(cache_dir) if cache_dir.exists() else ():
        assert marker is not None
        status = local_status(VariantPaths(cache_dir, marker.build_variant), marker)
        assert status.warm, status.reason
        seen += 1
    return seen


def _rounds(rounds: int, built_variant, seaweed, s3_url: str, base: Path) -> int:
    """How many rounds had the second pull start while the first ran."""
    (pushed,) = push_cache_dir(built_variant.cache_dir, open_store(s3_url))
    location = built_variant.cache_dir.relative_to(built_variant.cache_root)
    rng = random.Random(rounds)
    overlapped = 0
    for number in range(rounds):
        root = base / f"root{number}"
        cache_dir = root / location
        first = _start_pull(seaweed, s3_url, pushed.variant_key, root)
        time.sleep(rng.uniform(0, 1.5))  # a process's start-up is about a second of it
        second = _start_pull(seaweed, s3_url, pushed.variant_key, root)
        overlapped += first.poll() is None
        while first.poll() is None or second.poll() is None:
            _marker_is_warm_whenever_present(cache_dir)
            time.sleep(0.01)
        documents = []
        for pull in (first, second):
            out, err = pull.communicate()
            assert pull.returncode == 0, err[-3000:]
            (document,) = json.loads(out)["variants"]
            assert document["warm"] and document["cache_dir"] == str(cache_dir)
            documents.append(document)
        assert [d["already_warm"] for d in documents].count(False) == 1, documents  # one pulled, one found it
        assert _marker_is_warm_whenever_present(cache_dir) == 1
        ((_, marker, _),) = iter_markers(cache_dir)
        assert verify_weight_cache(VariantPaths(cache_dir, marker.build_variant)) == []  # every file is the store's bytes
        assert {r.digest for r in marker.all_files()} == {r.digest for r in built_variant.marker.all_files()}
        assert not (cache_dir / ".pulled-objects").exists()
        generations = [p.name for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
        assert generations == [marker.generation], generations  # no second, half-made build beside it
    return overlapped


def test_two_pullers_of_one_variant_end_warm_on_one_build(built_variant, seaweed, s3_url, tmp_path):
    assert _rounds(ROUNDS, built_variant, seaweed, s3_url, tmp_path) > 0


@pytest.mark.slow
def test_two_pullers_many_rounds(built_variant, seaweed, s3_url, tmp_path):
    assert _rounds(LONG_ROUNDS, built_variant, seaweed, s3_url, tmp_path) > LONG_ROUNDS // 2
