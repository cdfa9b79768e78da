# SPDX-License-Identifier: Apache-2.0
"""The prefill cache under a size cap (``--prefill-cache-max-size`` or
``TT_PREFILL_CACHE_MAX_SIZE``) during training, bytes per sample in the demo's summary, and the
storage option that halves the feature bytes (bfloat16) with a loss bit-identical to the
uncached run at the same dtype."""

from __future__ import annotations

from models.common.prefill_cache.maintenance import summarize
from models.testing.resynthesis_world import World, losses, report

# One torch thread: losses are compared bit for bit across runs (automatic threads follow the load).
ARGS = ("--prompts", "8", "--min-tokens", "4", "--max-tokens", "12", "--epochs", "2", "--batch-size", "2",
        "--threads", "1")
CAP = 12 * 1024  # about 4 tiny objects (2,875 bytes each)


def test_a_size_cap_evicts_least_recently_used_objects_during_training(world: World, tmp_path):
    free = world.main(*ARGS, "--prefill-cache", tmp_path / "free", "--json", tmp_path / "free.json")
    assert free.returncode == 0
    capped = world.main(*ARGS, "--prefill-cache", tmp_path / "capped", "--prefill-cache-max-size", "12K",
                        "--json", tmp_path / "capped.json")
    assert capped.returncode == 0, capped.stdout
    storage = report(tmp_path / "capped.json")["storage"]
    assert storage["max_bytes"] == CAP and storage["stored"] == 8 and storage["evicted"] > 0, storage
    assert summarize(tmp_path / "capped").bytes <= CAP
    assert storage["summary"]["max_bytes"] == CAP and not storage["summary"]["over_cap"]
    assert "cap 12.0 KiB" in capped.stdout and "evicted by this run" in capped.stdout
    assert [e["prefills"] for e in report(tmp_path / "capped.json")["epochs"]] == [8, 0]  # epoch 2 from memory
    assert losses(tmp_path / "capped.json") == losses(tmp_path / "free.json")

    by_env = world.main(*ARGS, "--prefill-cache", tmp_path / "env", "--json", tmp_path / "env.json",
                        TT_PREFILL_CACHE_MAX_SIZE="12K")
    assert by_env.returncode == 0, by_env.stdout
    assert report(tmp_path / "env.json")["storage"]["evicted"] > 0 and summarize(tmp_path / "env").bytes <= CAP
    assert world.main(*ARGS, "--prefill-cache-max-size", "lots").returncode == 2


def test_bytes_per_sample_and_bfloat16_storage(world: World, tmp_path):
    runs = {}
    for name, extra in (("f32", ()), ("bf16", ("--feature-dtype", "bfloat16")),
                        ("bf16-off", ("--feature-dtype", "bfloat16", "--no-cache"))):
        done = world.main(*ARGS, *extra, "--prefill-cache", tmp_path / "prefill", "--json", tmp_path / f"{name}.json")
        assert done.returncode == 0, done.stdout
        runs[name] = report(tmp_path / f"{name}.json")
    f32, bf16 = runs["f32"]["storage"], runs["bf16"]["storage"]
    assert f32["run_objects"] == bf16["run_objects"] == 8
    assert f"{f32['bytes_per_sample']:,.0f} bytes per sample" in world.main(
        *ARGS, "--prefill-cache", tmp_path / "prefill").stdout  # the summary line (a run served from disk)
    assert bf16["feature_bytes_per_sample"] * 2 == f32["feature_bytes_per_sample"]  # exactly half
    assert bf16["bytes_per_sample"] < f32["bytes_per_sample"]
    # The stored bfloat16 features train exactly as uncached bfloat16 ones: in memory, and from disk.
    from_disk = world.main(*ARGS, "--feature-dtype", "bfloat16", "--prefill-cache", tmp_path / "prefill",
                           "--json", tmp_path / "bf16-disk.json")
    assert from_disk.returncode == 0
    assert report(tmp_path / "bf16-disk.json")["epochs"][0]["disk_hits"] == 8
    assert losses(tmp_path / "bf16.json") == losses(tmp_path / "bf16-off.json") == losses(tmp_path / "bf16-disk.json")
    assert losses(tmp_path / "bf16.json") != losses(tmp_path / "f32.json")  # a real change of dtype
