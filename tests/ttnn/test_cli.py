# SPDX-License-Identifier: Apache-2.0
"""``tt-cache`` end to end: real builds, real corruption, exit codes a script can rely on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.common.fileio import writing_into
from tests.ttnn.tiny_models import make_checkpoint


def tt_cache(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "models.common.cli", *args], env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> tuple[dict[str, str], Path, Path]:
    root = tmp_path_factory.mktemp("cli")
    checkpoint = make_checkpoint("qwen3", root / "tiny-qwen3")
    env = dict(os.environ, TT_CACHE_PATH=str(root / "cache"))
    env.pop("TT_TRANSFORMERS_FORCE_MODEL_LOAD", None)
    first = tt_cache("build", str(checkpoint), "--mesh", "N300", "--precision", "bfloat16", env=env)
    assert first.returncode == 0 and ": cold (" in first.stdout, first.stderr[-2000:]
    (cache_dir,) = (root / "cache").glob("tiny-qwen3--*/bfloat16/mesh_1x2")
    return env, cache_dir, checkpoint


def test_build_twice_is_warm_and_ls_check_verify_agree(seeded):
    env, cache_dir, checkpoint = seeded
    second = tt_cache("build", str(checkpoint), "--mesh", "N300", "--precision", "bfloat16", env=env)
    assert ": warm, " in second.stdout
    assert "tiny-qwen3 layers=2 mesh=(1, 2)" in tt_cache("ls", env=env).stdout
    assert tt_cache("check", str(cache_dir), env=env).returncode == 0
    verify = tt_cache("verify", str(cache_dir), env=env)
    assert verify.returncode == 0 and "intact" in verify.stdout


def test_verify_names_a_flipped_byte_and_check_names_a_truncation(seeded, tmp_path):
    env, cache_dir, _ = seeded
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(cache_dir), str(copy)], check=True)
    victim = next(copy.rglob("output_*.tensorbin"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    verify = tt_cache("verify", str(copy), env=env)
    assert verify.returncode == 1 and victim.name in verify.stdout
    os.truncate(victim, 10)
    check = tt_cache("check", str(copy), env=env)
    assert check.returncode == 1 and "is 10 bytes, marker says" in check.stdout


def test_clean_removes_only_temp_files_no_live_writer_holds(seeded, tmp_path):
    env, cache_dir, _ = seeded
    debris = cache_dir / ".w.tensorbin.tmp.999999999.1.aaaaaaaa.tensorbin"
    user_file = cache_dir / ".env.tmp.2024"
    debris.write_bytes(b"x")
    user_file.write_bytes(b"mine")
    with writing_into(cache_dir):  # a live writer in this dir (its pid is irrelevant)
        out = tt_cache("clean", str(cache_dir), env=env)
        assert out.returncode == 0 and debris.exists()
    out = tt_cache("clean", str(cache_dir), env=env)
    assert out.returncode == 0 and not debris.exists() and user_file.read_bytes() == b"mine"
    assert tt_cache("check", str(cache_dir), env=env).returncode == 0


def test_check_of_an_empty_dir_is_cold(seeded, tmp_path):
    env, _, _ = seeded
    out = tt_cache("check", str(tmp_path), env=env)
    assert out.returncode == 1 and "no completion marker" in out.stdout


def test_build_without_checkpoint_or_family_is_a_usage_error(seeded, tmp_path):
    env, _, _ = seeded
    out = tt_cache("build", str(tmp_path / "absent"), env=env)
    assert out.returncode == 2 and "--family" in out.stderr
