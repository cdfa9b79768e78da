# SPDX-License-Identifier: Apache-2.0
"""``tt-cache ls`` shows the prepared model data and ``tt-cache clean --model-data`` removes it:
a dry run lists what a real run removes, file for file and byte for byte; a snapshot a weight
cache was built from (a real ``tt-cache build`` of it) or a plan names is kept; nothing a record
does not prove is the project's, and nothing behind a symlink, is ever touched."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from models.common.fileio import file_lock, unique_temp_path
from models.demos.real_models.known import known_model
from models.demos.real_models.prepare import lock_path, repo_cache_dir, revision, write_manifest, write_ref
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import cli_env, error_line, json_out, tt_cache

MODEL = known_model("smollm2-135m")  # a llama: a tiny llama checkpoint stands in for its weights
GGUF_MODEL = known_model("gemma3-270m")  # split over four packages: its GGUF is assembled


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("model-data") / "tiny-llama")


@pytest.fixture
def world(checkpoint, tmp_path) -> dict:
    """A model root as ``prepare`` leaves it (the snapshot sealed and published by prepare's own
    functions), a killed preparer's work dir, an assembled GGUF, and what is not ours: a hub
    download, a user's file in the snapshot, a recorded file swapped for a symlink to a file
    outside, a GGUF of the wrong size."""
    root, gguf = tmp_path / "model_data", tmp_path / "gguf"
    repo = repo_cache_dir(root, MODEL)
    snapshot = repo / "snapshots" / revision(MODEL)
    snapshot.mkdir(parents=True)
    for path in checkpoint.iterdir():
        (snapshot / path.name).write_bytes(path.read_bytes())
    write_manifest(snapshot, MODEL)
    write_ref(repo, snapshot.name)
    outside = tmp_path / "outside.json"
    outside.write_text("not the project's")
    (snapshot / "generation_config.json").unlink()
    (snapshot / "generation_config.json").symlink_to(outside)
    (snapshot / "notes.txt").write_text("the user's own")
    debris = unique_temp_path(snapshot)
    debris.mkdir()
    (debris / "model.safetensors").write_bytes(b"\0" * 4096)
    download = root / "hub" / "models--someone--else" / "snapshots" / "abc"
    download.mkdir(parents=True)
    (download / "model.safetensors").write_bytes(b"theirs")
    assembled = gguf / GGUF_MODEL.name / GGUF_MODEL.gguf_file
    assembled.parent.mkdir(parents=True)
    with open(assembled, "wb") as out:
        out.truncate(GGUF_MODEL.size)  # sparse: the recorded size, no disk
    wrong = gguf / "qwen2.5-coder-0.5b" / known_model("qwen2.5-coder-0.5b").gguf_file
    wrong.parent.mkdir(parents=True)
    wrong.write_bytes(b"not the size the table records")
    env = cli_env(tmp_path / "cache", TT_MODEL_DATA=str(root), TT_GGUF_CACHE=str(gguf))
    return {"root": root, "repo": repo, "snapshot": snapshot, "debris": debris, "assembled": assembled, "wrong": wrong,
            "outside": outside, "download": download, "env": env, "tmp": tmp_path}


def _tree(*roots: Path) -> dict[Path, int]:
    """Every regular file and symlink under the roots, with its size (a symlink's own)."""
    return {path: path.lstat().st_size for root in roots for path in root.rglob("*")
            if path.is_symlink() or path.is_file()}


def _sealed(snapshot: Path) -> dict[Path, int]:
    """The regular files the snapshot's record lists, and the record."""
    names = [*json.loads((snapshot / ".prepared.json").read_text())["files"], ".prepared.json"]
    return {snapshot / n: (snapshot / n).lstat().st_size for n in names if not (snapshot / n).is_symlink()}


def test_ls_lists_the_model_data_with_sizes(world):
    listing = tt_cache("ls", "--json", env=world["env"])
    assert listing.returncode == 0, listing.stderr[-2000:]
    data = json_out(listing)["model_data"]
    (snapshot,) = data["snapshots"]
    sealed = _sealed(world["snapshot"])
    assert snapshot["path"] == str(world["snapshot"]) and snapshot["model"] == MODEL.name and snapshot["current"]
    assert snapshot["files"] == len(sealed) and snapshot["size_bytes"] == sum(sealed.values())
    entries = {e["path"]: e for e in data["entries"]}
    assert entries[str(world["debris"])]["kind"] == "unfinished snapshot"
    assert entries[str(world["debris"])]["size_bytes"] == 4096
    assert entries[str(world["assembled"])]["size_bytes"] == GGUF_MODEL.size
    assert str(world["wrong"]) not in entries and str(world["root"] / "hub" / "models--someone--else") in data["foreign"]
    assert data["size_bytes"] == snapshot["size_bytes"] + 4096 + GGUF_MODEL.size
    human = tt_cache("ls", env=world["env"])
    assert f"model data {world['root']}:" in human.stdout and str(world["snapshot"]) in human.stdout
    assert "no weight caches under" in human.stdout


def test_clean_model_data_dry_run_then_removal(world):
    everything = (world["root"], world["assembled"].parent.parent, world["outside"])
    before = _tree(*everything)
    dry = tt_cache("clean", "--model-data", "--dry-run", "--json", env=world["env"])
    assert dry.returncode == 0, dry.stderr[-2000:]
    planned = json_out(dry)["model_data"]
    assert _tree(*everything) == before, "a dry run removes nothing"
    sealed = _sealed(world["snapshot"])
    assert {r["path"] for r in planned["removed"]} == {str(world["snapshot"]), str(world["debris"]), str(world["assembled"])}
    ref = world["repo"] / "refs" / "main"  # names the snapshot: it goes with it
    assert planned["removed_files"] == len(sealed) + 1 + 1 + 1
    assert planned["removed_bytes"] == sum(sealed.values()) + ref.stat().st_size + 4096 + GGUF_MODEL.size

    done = tt_cache("clean", "--model-data", "--json", env=world["env"])
    assert done.returncode == 0, done.stderr[-2000:]
    report = json_out(done)["model_data"]
    gone = {path: size for path, size in before.items() if path not in _tree(*everything)}
    assert report["removed"] == planned["removed"]
    assert report["removed_files"] == planned["removed_files"] == len(gone)
    assert report["removed_bytes"] == planned["removed_bytes"] == sum(gone.values())
    # what is not the project's stays: the user's file (so its dir), the symlink and its target,
    # the hub download, the GGUF of the wrong size
    assert (world["snapshot"] / "notes.txt").read_text() == "the user's own"
    assert os.readlink(world["snapshot"] / "generation_config.json") == str(world["outside"])
    assert world["outside"].read_text() == "not the project's"
    assert (world["download"] / "model.safetensors").read_bytes() == b"theirs"
    assert world["wrong"].read_bytes() == b"not the size the table records"
    assert not (world["repo"] / "refs" / "main").exists() and not world["debris"].exists()
    assert not report["skipped"] and [left["path"] for left in report["left"]] == [str(world["snapshot"])]


def test_a_snapshot_a_cache_was_built_from_or_a_plan_names_is_kept(world):
    env = world["env"]
    build = tt_cache("build", str(world["snapshot"]), "--precision", "bfloat16", env=env)
    assert build.returncode == 0 and ": seeded: cold (" in build.stdout, build.stderr[-2000:]
    (marker,) = (world["tmp"] / "cache").rglob(".weights_complete.*")
    sealed = _sealed(world["snapshot"])

    kept = tt_cache("clean", "--model-data", "--json", env=env)
    assert kept.returncode == 0, kept.stderr[-2000:]
    report = json_out(kept)["model_data"]
    (why,) = [k["why"] for k in report["kept"] if k["path"] == str(world["snapshot"])]
    assert str(marker) in why and "built from it" in why
    assert str(world["snapshot"]) not in {r["path"] for r in report["removed"]}
    assert _sealed(world["snapshot"]) == sealed and (world["repo"] / "refs" / "main").is_file()
    listed = json_out(tt_cache("ls", "--json", env=env))["model_data"]
    assert str(world["snapshot"]) in listed["needed"]

    # another cache root has no cache of it: a plan naming the model keeps it all the same
    plan = world["tmp"] / "plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": MODEL.repo_id, "meshes": ["N150"], "precisions": ["bfloat16"]}]}))
    other = world["tmp"] / "no-caches"
    planned = tt_cache("clean", "--model-data", "--cache-root", str(other), "--keep-plan", str(plan), "--json", env=env)
    assert planned.returncode == 0, planned.stderr[-2000:]
    (why,) = [k["why"] for k in json_out(planned)["model_data"]["kept"]]
    assert f"--keep-plan {plan} names {MODEL.repo_id}" == why and _sealed(world["snapshot"]) == sealed

    # and without either, it goes
    gone = tt_cache("clean", "--model-data", "--cache-root", str(other), "--json", env=env)
    assert gone.returncode == 0 and str(world["snapshot"]) in {r["path"] for r in json_out(gone)["model_data"]["removed"]}
    assert not any(path.exists() for path in sealed)


@pytest.mark.parametrize("args, message", [
    (["--model-data", "--model", "llama-7b"], "--model llama-7b: not a known model"),
    (["--model-data", "--keep-plan", "MISSING"], "nothing was removed"),
    ([], "clean needs DIR"),
    (["TMP", "--model", "smollm2-135m"], "--model and --keep-plan go with --model-data"),
    (["TMP", "--model-data", "--model-root", "FILE"], "exists and is not a directory"),
])
def test_bad_input_removes_nothing(world, args, message):
    before = _tree(world["root"], world["assembled"].parent.parent)
    where = {"MISSING": str(world["tmp"] / "missing.yaml"), "TMP": str(world["tmp"]), "FILE": str(world["outside"])}
    out = tt_cache("clean", *[where.get(a, a) for a in args], env=world["env"])
    assert out.returncode == 2 and message in error_line(out, "clean")
    assert _tree(world["root"], world["assembled"].parent.parent) == before


def test_a_model_being_prepared_is_skipped(world):
    """A preparer holds the model's prepare lock (here: this process): its snapshot and debris are
    skipped, not undercut; the other model's GGUF still goes."""
    lock = lock_path(world["root"], MODEL)
    lock.parent.mkdir(parents=True, exist_ok=True)
    sealed = _sealed(world["snapshot"])
    with file_lock(lock):
        out = tt_cache("clean", "--model-data", "--json", env=world["env"])
    assert out.returncode == 0, out.stderr[-2000:]
    report = json_out(out)["model_data"]
    assert {s["path"] for s in report["skipped"]} == {str(world["snapshot"]), str(world["debris"])}
    assert all("a preparer holds its lock" in s["why"] for s in report["skipped"])
    assert [r["path"] for r in report["removed"]] == [str(world["assembled"])]
    assert _sealed(world["snapshot"]) == sealed and world["debris"].is_dir()
