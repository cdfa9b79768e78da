# SPDX-License-Identifier: Apache-2.0
"""``tt-cache`` end to end: real builds, real corruption, exit codes a script can rely on."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.common.fileio import writing_into
from models.testing.tt_cache import REPO_ROOT, cli_env, json_out, tt_cache
from models.testing.tiny_models import make_checkpoint


@pytest.fixture(scope="module")
def seeded(tmp_path_factory) -> tuple[dict[str, str], Path, Path]:
    root = tmp_path_factory.mktemp("cli")
    checkpoint = make_checkpoint("qwen3", root / "tiny-qwen3")
    env = cli_env(root / "cache")
    first = tt_cache("build", str(checkpoint), "--mesh", "N300", "--precision", "bfloat16", env=env)
    assert first.returncode == 0 and ": seeded: cold (" in first.stdout, first.stderr[-2000:]
    (cache_dir,) = {p.parent for p in (root / "cache").rglob(".weights_complete.*")}
    return env, cache_dir, checkpoint


def test_build_twice_is_warm_and_ls_check_verify_agree(seeded):
    env, cache_dir, checkpoint = seeded
    second = tt_cache("build", str(checkpoint), "--mesh", "N300", "--precision", "bfloat16", "--json", env=env)
    assert second.returncode == 0 and json_out(second)["outcome"] == "warm"
    listing = tt_cache("ls", env=env)
    assert listing.returncode == 0
    row = next(line for line in listing.stdout.splitlines() if "tiny-qwen3" in line).split()
    assert row[1:8] == ["qwen3", "bfloat16", "1x2", "text", importlib.metadata.version("ttnn"), row[6], "warm"]
    assert row[8].endswith("s") and float(row[8].rstrip("s")) > 0  # how long the cold build took
    assert tt_cache("check", str(cache_dir), env=env).returncode == 0
    verify = tt_cache("verify", str(cache_dir), env=env)
    assert verify.returncode == 0 and "intact" in verify.stdout


def test_ls_json_is_torch_and_ttnn_free(seeded):
    """ls, check, verify and gc --dry-run import neither torch nor ttnn: they answer in a fraction of a second."""
    env, cache_dir, _ = seeded
    probe = (
        "import json, sys, runpy\n"
        "sys.argv = ['tt-cache'] + sys.argv[1:]\n"
        "from models.tt_cache.cli import main\n"
        "code = main()\n"
        "print(json.dumps({'heavy': sorted(m for m in ('torch', 'ttnn') if m in sys.modules)}))\n"
        "sys.exit(code)\n"
    )
    for args in (["gc", "--max-size", "1G", "--dry-run", "--json"], ["check", str(cache_dir), "--json"],
                 ["verify", str(cache_dir), "--json"], ["ls", "--json"]):
        out = subprocess.run([sys.executable, "-c", probe, *args], env=env, cwd=REPO_ROOT, capture_output=True,
                             text=True)
        assert out.returncode == 0, out.stderr[-2000:]
        document = json.JSONDecoder().raw_decode(out.stdout)[0]  # the probe prints its own line after it
        heavy = [line for line in out.stdout.splitlines() if line.startswith('{"heavy"')]
        assert heavy == ['{"heavy": []}'], (args, heavy)
        assert "DEBUG" not in out.stderr and "Config{" not in out.stdout + out.stderr
    listing = document if args[0] == "ls" else json_out(tt_cache("ls", "--json", env=env))
    (variant,) = listing["variants"]
    assert variant["model"].endswith("tiny-qwen3") and variant["family"] == "qwen3"
    assert variant["precision"] == "bfloat16" and variant["mesh"] == "1x2" and variant["state"] == "warm"
    assert variant["components"] == ["text"] and variant["size_bytes"] > 0
    assert 0 < variant["build_seconds"] < 600


def test_verify_names_a_flipped_byte_and_check_names_a_truncation(seeded, tmp_path):
    env, cache_dir, _ = seeded
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(cache_dir), str(copy)], check=True)
    victim = next(copy.rglob("output_*.tensorbin"))
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 1
    victim.write_bytes(bytes(data))
    verify = tt_cache("verify", str(copy), "--json", env=env)
    assert verify.returncode == 1
    (variant,) = json_out(verify)["variants"]
    assert not variant["intact"] and any(victim.name in p for p in variant["problems"])
    os.truncate(victim, 10)
    check = tt_cache("check", str(copy), env=env)
    assert check.returncode == 1 and "is 10 bytes, marker says" in check.stdout and victim.name in check.stdout


@pytest.mark.parametrize("threads", [None, "1", "3"])
def test_verify_of_a_root_names_only_the_damaged_variant(seeded, tmp_path, threads):
    """Every file of every variant goes through one pool: each problem still lands on its own
    variant, whatever the number of hashing threads."""
    env, cache_dir, _ = seeded
    root = tmp_path / "root"
    root.mkdir()
    for name in ("a", "b", "c"):
        subprocess.run(["cp", "-a", str(cache_dir), str(root / name)], check=True)
    victim = sorted((root / "b").rglob("*.tensorbin"))[-1]
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    verify = tt_cache("verify", str(root), "--json", *(["--threads", threads] if threads else []), env=env)
    assert verify.returncode == 1, verify.stderr[-2000:]
    document = json_out(verify)
    by_dir = {Path(v["marker"]).parent.relative_to(root).parts[0]: v for v in document["variants"]}
    assert sorted(by_dir) == ["a", "b", "c"]
    assert by_dir["a"]["intact"] and by_dir["c"]["intact"]
    assert not by_dir["b"]["intact"] and len(by_dir["b"]["problems"]) == 1 and victim.name in by_dir["b"]["problems"][0]
    assert document["bytes"] == sum(v["bytes"] for v in document["variants"]) > 0 and document["mib_per_s"] > 0


@pytest.mark.parametrize("threads", ["0", "-2", "many"])
def test_verify_threads_must_be_a_positive_whole_number(seeded, threads):
    env, cache_dir, _ = seeded
    out = tt_cache("verify", str(cache_dir), "--threads", threads, env=env)
    assert out.returncode == 2 and "--threads" in out.stderr and "Traceback" not in out.stderr


def test_clean_removes_only_temp_files_no_live_writer_holds(seeded):
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


def test_check_of_a_dir_without_caches_is_cold(seeded, tmp_path):
    env, _, _ = seeded
    out = tt_cache("check", str(tmp_path), env=env)
    assert out.returncode == 1 and "no completion marker" in out.stdout


def test_build_without_checkpoint_or_family_is_a_usage_error(seeded, tmp_path):
    env, _, _ = seeded
    out = tt_cache("build", str(tmp_path / "absent"), env=env)
    assert out.returncode == 2 and "name its family" in out.stderr and "Traceback" not in out.stderr


def test_every_command_documents_json_and_the_exit_codes(seeded):
    env, _, _ = seeded
    top = tt_cache("--help", env=env)
    assert top.returncode == 0 and "Exit status:" in top.stdout
    for code in ("0  success", "1  a check failed", "2  bad usage or bad input"):
        assert code in top.stdout
    for command in ("ls", "check", "verify", "build", "seed", "gc", "clean"):
        assert "--json" in tt_cache(command, "--help", env=env).stdout, command
    unknown = tt_cache("frobnicate", env=env)
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr


def test_prefill_commands_are_reachable_through_tt_cache(tmp_path):
    env = cli_env()
    listing = tt_cache("prefill", "ls", str(tmp_path), "--json", env=env)
    assert listing.returncode == 0 and json_out(listing)["objects"] == 0
    missing = tt_cache("prefill", "verify", str(tmp_path / "nowhere"), env=env)
    assert missing.returncode == 2 and "no such directory" in missing.stderr and "Traceback" not in missing.stderr
    helped = tt_cache("prefill", "--help", env=env)
    assert helped.returncode == 0 and "prefill ls ROOT" in helped.stdout


@pytest.mark.parametrize("seconds, text", [(None, "-"), (0.4211, "0.42s"), (38.4, "38s"), (725.0, "12m05s")])
def test_build_durations_read_as_one_word(seconds, text):
    from models.tt_cache.humanize import format_duration

    assert format_duration(seconds) == text


def test_a_cold_build_with_json_prints_one_document_and_native_logs_on_stderr(tmp_path):
    """ttnn's C++ logger writes to file descriptor 1 when it opens the cluster (a bfloat8_b
    conversion does) and at exit; with ``--json`` stdout is the document alone, so
    ``tt-cache build --json | jq`` works."""
    checkpoint = make_checkpoint("llama", tmp_path / "tiny-llama")
    out = tt_cache("build", str(checkpoint), "--precision", "bfloat8_b", "--json", "--verbose",
                   env=cli_env(tmp_path / "cache"))
    assert out.returncode == 0, out.stderr[-3000:]
    document = json.loads(out.stdout)  # the whole stdout: nothing before or after the document
    assert document["outcome"] == "seeded" and document["ok"], document
    assert "Cluster" in out.stderr  # --verbose: the native logs went to stderr, not away
