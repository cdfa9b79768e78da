# SPDX-License-Identifier: Apache-2.0
"""A prefill cache whose file system fails (full, read-only, EIO) never stops training: the
features stay in memory, the loss is bit-identical to a run on a healthy disk, and the run says
what was not stored. Real file systems: a small tmpfs that fills up, a read-only remount, an ext4
on a loop device shut down as a failing device shuts it down. Through the public entry points
(``python -m models.demos.resynthesis``, ``tt-cache prefill ls``, ``produce_waves``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.common.prefill_cache.layout import object_dirs
from models.testing.mounts import ext4
from models.testing.resynthesis_world import (
    losses,
    no_traceback,
    remount_read_only,
    report,
    requires_root,
    shut_down,
    tmpfs,
)
from models.tt_cache.cli import main as tt_cache

pytestmark = [requires_root, pytest.mark.usefixtures("cli_in_process")]


def args(prompts: int = 6, epochs: int = 2) -> tuple[str, ...]:
    # Synthetic prompts: the demo's text prompts read stdlib docstrings, which pytest changes in its
    # own process (it replaces threading.excepthook), and these runs mix pytest's process and fresh ones.
    # One torch thread: the losses are compared bit for bit across runs, and with automatic threads
    # a run's count follows the machine's load (one and two threads differ in the last bits on AVX2).
    return ("--prompts", str(prompts), "--prompt-kind", "synthetic", "--min-tokens", "4", "--max-tokens", "12",
            "--epochs", str(epochs), "--batch-size", "3", "--threads", "1")


ARGS = args()
# One tiny object is 4 non-empty files (manifest + 3 artifacts): 4 tmpfs pages. 16 pages hold the
# first wave of 3 prompts, and the second wave runs out of space in the middle.
FILLS_IN_WAVE_2 = "64k"


@pytest.fixture(scope="module")
def healthy(world, tmp_path_factory) -> Path:
    """The JSON report of the same training on a healthy disk."""
    base = tmp_path_factory.mktemp("healthy")
    done = world.main(*ARGS, "--prefill-cache", base / "prefill", "--json", base / "report.json")
    assert done.returncode == 0, done.stdout
    return base / "report.json"


def _ls(root: Path, capsys) -> dict:
    capsys.readouterr()
    assert tt_cache(["prefill", "ls", str(root), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_full_disk_under_the_prefill_cache_degrades_to_memory(world, healthy, tmp_path, capsys):
    with tmpfs(tmp_path / "full", FILLS_IN_WAVE_2) as root:
        done = world.demo(*ARGS, "--prefill-cache", root, "--json", tmp_path / "full.json")
        output = no_traceback(done)
        assert done.returncode == 0, output
        full = report(tmp_path / "full.json")
        storage = full["storage"]
        assert storage["store_error"].startswith("ENOSPC: No space left on device"), storage
        assert len(storage["unstored"]) == 3 and storage["stored"] == 3, storage
        assert f"WARNING: the features of 3 prompts were NOT stored in {root} (ENOSPC" in done.stdout, output
        assert [e["prefills"] for e in full["epochs"]] == [6, 0]  # epoch 2 is served from memory
        assert [e["unstored"] for e in full["epochs"]] == [3, 0]
        assert losses(tmp_path / "full.json") == losses(healthy)  # bit for bit
        # The failed wave left nothing behind (no partials, no temps): only the 3 complete objects.
        listing = _ls(root, capsys)
        assert listing["objects"] == 3 and listing["debris_bytes"] == 0, listing
        assert listing["bytes"] == listing["object_bytes"]
        # A later run on the still full disk: the stored half from disk, the rest computed again.
        again = world.main(*ARGS, "--prefill-cache", root, "--json", tmp_path / "again.json")
        assert again.returncode == 0, again.stdout
        epoch = report(tmp_path / "again.json")["epochs"][0]
        assert (epoch["disk_hits"], epoch["prefills"], epoch["unstored"]) == (3, 3, 3)
        assert losses(tmp_path / "again.json") == losses(healthy)


def test_a_read_only_prefill_cache_serves_what_it_holds(world, healthy, tmp_path, capsys):
    with tmpfs(tmp_path / "ro", "4m") as root:
        stored = world.main(*args(epochs=1), "--prefill-cache", root)
        assert stored.returncode == 0, stored.stdout
        each = _ls(root, capsys)["bytes_per_sample"]
        assert tt_cache(["prefill", "gc", str(root), "--max-size", str(int(3 * each))]) == 0  # 3 of the 6 stay
        remount_read_only(root)
        done = world.main(*ARGS, "--prefill-cache", root, "--json", tmp_path / "ro.json")
        assert done.returncode == 0, done.stdout
        ro = report(tmp_path / "ro.json")
        assert ro["storage"]["store_error"].startswith("EROFS"), ro["storage"]
        epoch = ro["epochs"][0]
        assert (epoch["disk_hits"], epoch["prefills"], epoch["unstored"]) == (3, 3, 3)
        assert ro["epochs"][1]["prefills"] == 0
        assert losses(tmp_path / "ro.json") == losses(healthy)
        assert "features of 3 prompts were NOT stored" in done.stdout


def test_io_errors_under_the_prefill_cache_degrade_to_memory(world, healthy, tmp_path):
    with ext4(tmp_path / "disk") as disk:
        stored = world.main(*args(prompts=3, epochs=1), "--prefill-cache", disk / "prefill")
        assert stored.returncode == 0, stored.stdout
        shut_down(disk)  # every write and uncached read under it now fails with EIO
        done = world.main(*ARGS, "--prefill-cache", disk / "prefill", "--json", tmp_path / "eio.json")
        assert done.returncode == 0, done.stdout
        eio = report(tmp_path / "eio.json")
        assert eio["storage"]["store_error"].startswith("EIO: Input/output error"), eio["storage"]
        assert [e["prefills"] for e in eio["epochs"]] == [6, 0]
        assert losses(tmp_path / "eio.json") == losses(healthy)
        assert "NOT stored" in done.stdout


def test_a_checkpoint_that_cannot_be_written_is_reported_and_training_finishes(world, healthy, tmp_path):
    with tmpfs(tmp_path / "small", "16k") as small:
        done = world.main(*ARGS, "--prefill-cache", tmp_path / "prefill", "--checkpoint", small / "child.pt",
                          "--json", tmp_path / "report.json")
        assert done.returncode == 1, done.stdout
        assert "the child checkpoint of epoch 1 was NOT written" in done.stdout
        assert "the child checkpoint of epoch 2 was NOT written" in done.stdout
        written = report(tmp_path / "report.json")
        assert [u["epoch"] for u in written["unsaved_checkpoints"]] == [1, 2]
        assert written["unsaved_checkpoints"][0]["error"].startswith("ENOSPC")
        assert losses(tmp_path / "report.json") == losses(healthy)
        assert sorted(p.name for p in small.iterdir()) == []  # no temp file left on the full disk


def test_a_wave_producer_stops_at_the_first_unstored_wave(world, tmp_path):
    from models.demos.resynthesis import prompts as prompt_sets
    from models.resynthesis.parent import FrozenParent
    from models.resynthesis.waves import FeatureProducer, ProducerError, produce_waves

    parent = FrozenParent.load(world.bare, precision="bfloat16", cache_root=world.weights)
    prompts = prompt_sets.synthetic(6, 4, 12, parent.vocab_size, seed=3)
    with tmpfs(tmp_path / "full", FILLS_IN_WAVE_2) as root:
        producer = FeatureProducer(parent, root)
        with pytest.raises(ProducerError, match=r"wave 3\.\.6 .* was not stored \(ENOSPC.*the cursor stays at 3"):
            produce_waves(producer, prompts, tmp_path / "run", wave_size=3)
        assert json.loads((tmp_path / "run" / "cursor.json").read_text())["done"] == 3
        assert len([d for d in object_dirs(root) if (d / "manifest.json").exists()]) == 3
