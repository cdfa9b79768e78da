# SPDX-License-Identifier: Apache-2.0
"""Bad input never gets a traceback from ``tt-cache``: one line naming the file and the problem,
exit 1 for a failed check, 2 for bad usage or input, and ``clean`` removes only debris of this
project's dead writers."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from models.testing.fixtures import DROP_FILE_PERMISSION_BYPASS
from models.testing.tt_cache import REPO_ROOT, cli_env, error_line, json_out, tt_cache
from models.testing.tiny_models import make_checkpoint


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(checkpoint, cache root, cache dir) of a tiny llama built once by ``tt-cache build``."""
    root = tmp_path_factory.mktemp("cli-errors")
    checkpoint = make_checkpoint("llama", root / "tiny-llama")
    built = tt_cache("build", str(checkpoint), "--precision", "bfloat16", env=cli_env(root / "cache"))
    assert built.returncode == 0, built.stderr[-2000:]
    (marker,) = (root / "cache").rglob(".weights_complete.*")
    return checkpoint, root / "cache", marker.parent


def _copy_cache(cache_dir: Path, dest: Path) -> tuple[Path, Path]:
    shutil.copytree(cache_dir, dest, symlinks=True)
    (marker,) = dest.glob(".weights_complete.*")
    return dest, marker


TAMPERINGS = {
    "mesh_shape N300": lambda body: {**body, "mesh_shape": "N300"},
    "build_variant list": lambda body: {**body, "build_variant": ["x"]},
    "weights missing": lambda body: {k: v for k, v in body.items() if k != "weights"},
    "files not a list": lambda body: {**body, "files": "all of them"},
    "not json": None,
}


@pytest.mark.parametrize("tampering", list(TAMPERINGS))
def test_an_odd_marker_is_cold_in_one_line_and_never_hides_the_other_caches(good, tmp_path, tampering):
    _, _, cache_dir = good
    root = tmp_path / "root"
    _copy_cache(cache_dir, root / "a-good" / "mesh_1x1")
    bad_dir, marker = _copy_cache(cache_dir, root / "b-bad" / "mesh_1x1")
    change = TAMPERINGS[tampering]
    marker.write_text("{not json" if change is None else json.dumps(change(json.loads(marker.read_text()))))
    env = cli_env(root)

    listing = tt_cache("ls", "--json", env=env)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr
    states = {Path(v["cache_dir"]).parent.name: v for v in json_out(listing)["variants"]}
    assert states["a-good"]["state"] == "warm"
    assert states["b-bad"]["state"] == "cold" and states["b-bad"]["reason"]
    for command in ("check", "verify"):
        out = tt_cache(command, str(bad_dir), env=env)
        assert out.returncode == 1 and "Traceback" not in out.stdout + out.stderr, (command, out.stderr[-2000:])
        assert marker.name in out.stdout, (command, out.stdout)
    gc = tt_cache("gc", str(root), "--max-size", "0", "--dry-run", "--json", env=env)
    assert gc.returncode == 0 and "Traceback" not in gc.stderr
    assert [s["path"] for s in json_out(gc)["skipped"]] == [str(marker)]  # not provably ours: left alone


def test_verify_names_an_unreadable_file(good, tmp_path):
    """Root reads anything: the command runs without CAP_DAC_OVERRIDE, so mode bits apply."""
    _, _, cache_dir = good
    copy, _ = _copy_cache(cache_dir, tmp_path / "mesh_1x1")
    victim = next(copy.rglob("*.tensorbin"))
    victim.chmod(0)
    out = tt_cache("verify", str(copy), env=cli_env(), prefix=DROP_FILE_PERMISSION_BYPASS)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"{victim.relative_to(copy)} is unreadable (Permission denied)" in out.stdout


def test_an_unreadable_marker_is_a_cold_row(good, tmp_path):
    _, _, cache_dir = good
    copy, marker = _copy_cache(cache_dir, tmp_path / "root" / "mesh_1x1")
    marker.chmod(0)
    env = cli_env()
    listing = tt_cache("ls", str(tmp_path / "root"), env=env, prefix=DROP_FILE_PERMISSION_BYPASS)
    assert listing.returncode == 0 and "cannot read" in listing.stdout and "Permission denied" in listing.stdout
    check = tt_cache("check", str(copy), env=env, prefix=DROP_FILE_PERMISSION_BYPASS)
    assert check.returncode == 1 and f"cannot read marker {marker}: Permission denied" in check.stdout


@pytest.mark.parametrize("command", [["ls"], ["check"], ["verify"], ["clean"], ["gc", "--max-size", "1G"]])
def test_a_missing_dir_is_bad_input(tmp_path, command):
    missing = tmp_path / "nowhere"
    out = tt_cache(command[0], str(missing), *command[1:], env=cli_env())
    assert out.returncode == 2
    assert error_line(out, command[0]) == f"tt-cache {command[0]}: {missing}: no such directory"


def test_clean_of_a_dir_without_caches_is_bad_input(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    out = tt_cache("clean", str(tmp_path), env=cli_env())
    assert out.returncode == 2 and "no weight cache in it" in error_line(out, "clean")
    assert (tmp_path / "notes.txt").exists()


def test_build_into_an_unwritable_root_does_not_exit_0(good, tmp_path, readonly_view):
    empty = tmp_path / "empty-root"
    empty.mkdir()
    root = readonly_view(empty)
    out = tt_cache("build", str(good[0]), "--precision", "bfloat16", "--cache-root", str(root), env=cli_env())
    assert out.returncode == 1, out.stdout + out.stderr[-2000:]
    assert "nothing was cached" in out.stdout and "Traceback" not in out.stderr


# -- clean --------------------------------------------------------------------------

WRITER = """
import sys
from pathlib import Path
from models.common.fileio import atomic_output
target = Path(sys.argv[1])
target.parent.mkdir(parents=True, exist_ok=True)
with atomic_output(target) as temp:
    temp.write_bytes(b"half a tensor")
    print(temp, flush=True)
    sys.stdin.readline()
"""


def _writer_in_own_pid_namespace(target: Path) -> tuple[subprocess.Popen, Path]:
    """A real writer of this project, mid-write, in another PID namespace (as in a container)."""
    writer = subprocess.Popen(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", WRITER,
                               str(target)], cwd=REPO_ROOT, env=cli_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = writer.stdout.readline().strip()
    if not line:
        writer.kill()
        pytest.skip(f"cannot start a writer in its own PID namespace: {writer.stderr.read()[-500:]}")
    return writer, Path(line)


def test_clean_removes_dead_writers_temps_only(good, tmp_path):
    _, _, cache_dir = good
    root = tmp_path / "root"
    copy, marker = _copy_cache(cache_dir, root / "tiny" / "mesh_1x1")
    user_files = [copy / ".zshrc.tmp.orig", copy / ".env.tmp.2024", root / ".w.tensorbin.tmp.999999.1.aabbccdd",
                  copy / ".notes.tmp.1.2.3"]
    for path in user_files:
        path.write_text("the user's own")
    live_writer, live_temp = _writer_in_own_pid_namespace(copy / "layers.0" / "live.tensorbin")
    dead_writer, dead_temp = _writer_in_own_pid_namespace(copy / "dead.tensorbin")
    dead_writer.send_signal(signal.SIGKILL)
    dead_writer.wait()
    try:
        assert live_temp.exists() and dead_temp.exists()
        out = tt_cache("clean", str(root), "--json", env=cli_env())
        assert out.returncode == 0, out.stderr[-2000:]
        report = json_out(out)
        assert report["removed"] == [str(dead_temp)] and report["kept_live"] == [str(live_temp)]
        assert live_temp.exists() and not dead_temp.exists()
        assert all(path.read_text() == "the user's own" for path in user_files)
        assert tt_cache("check", str(copy), env=cli_env()).returncode == 0
    finally:
        live_writer.kill()
        live_writer.wait()


# -- a partial download, a bad index, a racing writer, a name with glob characters, a closed pipe


def _sharded_copy(checkpoint: Path, target: Path) -> Path:
    """The checkpoint split over two shards in a subfolder, with its index."""
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True)
    shutil.copyfile(checkpoint / "config.json", target / "config.json")
    state = load_file(checkpoint / "model.safetensors")
    names = sorted(state)
    shards = {"weights/part-1.safetensors": names[::2], "weights/part-2.safetensors": names[1::2]}
    (target / "weights").mkdir()
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(target / shard))
    (target / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}))
    return target


def test_a_missing_shard_is_bad_input_naming_the_shard(good, tmp_path):
    from models.common.checkpoint import CheckpointError
    from models.llama import LlamaLoader

    checkpoint = _sharded_copy(good[0], tmp_path / "partial")
    (checkpoint / "weights" / "part-2.safetensors").unlink()  # an interrupted download
    with pytest.raises(CheckpointError, match="weights/part-2.safetensors"):
        LlamaLoader(checkpoint, precision="bfloat16", cache_root=tmp_path / "cache").load()
    built = tt_cache("build", str(checkpoint), "--precision", "bfloat16", env=cli_env(tmp_path / "cache"))
    assert built.returncode == 2 and "weights/part-2.safetensors" in error_line(built, "build")
    assert "Traceback" not in built.stderr


@pytest.mark.parametrize("weight_map", ['"all"', '{"model.norm.weight": 3}', '{}'], ids=["string", "number", "empty"])
def test_a_malformed_weight_map_is_bad_input(good, tmp_path, weight_map):
    checkpoint = _sharded_copy(good[0], tmp_path / "bad-index")
    (checkpoint / "model.safetensors.index.json").write_text('{"weight_map": %s}' % weight_map)
    built = tt_cache("build", str(checkpoint), "--precision", "bfloat16", env=cli_env(tmp_path / "cache"))
    assert built.returncode == 2 and "weight_map" in error_line(built, "build"), built.stderr[-2000:]


def test_clean_next_to_a_writer_that_publishes_its_temps_never_crashes(good, tmp_path):
    """A writer renames its temp files into place while clean lists and inspects them."""
    _, _, cache_dir = good
    root, _ = _copy_cache(cache_dir, tmp_path / "root" / "mesh_1x1")
    writer = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, itertools\n"
        "from pathlib import Path\n"
        "from models.common.fileio import unique_temp_path\n"
        "root = Path(sys.argv[1])\n"
        "for i in itertools.count():\n"
        "    temp = unique_temp_path(root / f'file{i % 50}.bin')\n"
        "    temp.write_bytes(b'x')\n"
        "    os.replace(temp, root / f'file{i % 50}.bin')\n"), str(root)], env=cli_env(), cwd=REPO_ROOT)
    try:
        for _ in range(15):
            clean = tt_cache("clean", str(root), "--json", env=cli_env())
            assert clean.returncode in (0, 1) and "Traceback" not in clean.stderr, clean.stderr[-2000:]
    finally:
        writer.kill()
        writer.wait()


def test_a_model_folder_with_glob_characters_finds_its_own_cache(good, tmp_path):
    checkpoint = shutil.copytree(good[0], tmp_path / "llama[v2]")
    env = cli_env(tmp_path / "cache")
    assert tt_cache("build", str(checkpoint), "--precision", "bfloat16", env=env).returncode == 0
    again = tt_cache("build", str(checkpoint), "--precision", "bfloat16", "--json", env=env)
    assert again.returncode == 0 and json_out(again)["outcome"] == "warm"
    for weights in checkpoint.glob("*.safetensors"):
        weights.unlink()  # cache-only: found by its recorded model id, not a pattern
    only = tt_cache("build", str(checkpoint), "--precision", "bfloat16", "--json", env=env)
    assert only.returncode == 0 and json_out(only)["outcome"] == "warm", only.stderr[-2000:]


def test_a_closed_pipe_ends_the_cli_quietly(good, tmp_path):
    """``tt-cache ls --json | head -1`` with more output than a pipe holds: no traceback."""
    _, _, cache_dir = good
    root = tmp_path / "many"
    for index in range(150):
        _copy_cache(cache_dir, root / f"model-{index:03d}" / "mesh_1x1")
    command = f"{sys.executable} -m models.tt_cache.cli ls {root} --json | head -1"
    piped = subprocess.run(["bash", "-c", command], env=cli_env(), cwd=REPO_ROOT, capture_output=True, text=True,
                           timeout=300)
    assert piped.stdout.strip() == "{" and piped.stderr == "", piped.stderr[-2000:]
