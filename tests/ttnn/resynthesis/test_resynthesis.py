# SPDX-License-Identifier: Apache-2.0
"""Issue 11: resynthesis runs on the prefill cache, with tiny real backbones built by the
project's loaders into real ttnn weight caches.

Producer features against transformers; authorities from real weight-cache markers; a wave
producer killed with SIGKILL at random points (each restart ends with exactly the expected
objects and bytes); two producers over overlapping prompt sets at once; the training loop with
the cache on and off (bit-identical losses, zero prefills after epoch 1) and restarted from a
child checkpoint."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from models.common.prefill_cache.layout import object_dirs
from models.demos.resynthesis import prompts as prompt_sets
from models.demos.resynthesis.train import TrainConfig, Trainer
from models.resynthesis.features import PositionPolicy, authority_for, prompt_tensors
from models.resynthesis.parent import FrozenParent
from models.resynthesis.source import ParentFeatureSource
from models.resynthesis.waves import FeatureProducer, ProducerError, produce_waves
from models.testing import REPO_ROOT
from models.testing.tiny_models import make_checkpoint, pcc

KILL_TRIALS = 20


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Every prefill of this module on one torch thread, as in the forked producers: the tests
    compare stored features byte for byte with features computed here, and on some CPUs (AVX2
    only, as on this machine) one and two threads differ in the last bits of float32 sums."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict[str, object]:
    """Tiny llama and gemma3 checkpoints and their weight caches (built once per module)."""
    base = tmp_path_factory.mktemp("resynthesis")
    checkpoints = {family: make_checkpoint(family, base / f"ckpt-{family}") for family in ("llama", "gemma3")}
    cache = base / "weights"
    parents = {family: FrozenParent.load(path, precision="bfloat16", cache_root=cache)
               for family, path in checkpoints.items()}
    for parent in parents.values():  # convert the cached weights to host tensors once (forks inherit them)
        parent.final_states(torch.arange(4))
        parent.head_weight  # noqa: B018
    return {"base": base, "checkpoints": checkpoints, "cache": cache, "parents": parents}


@pytest.fixture
def llama(world) -> FrozenParent:
    parent = world["parents"]["llama"]
    parent.prefills = 0
    return parent


def _prompts(count: int = 10, seed: int = 0, low: int = 4, high: int = 24) -> list[torch.Tensor]:
    return prompt_sets.synthetic(count, low, high, vocab_size=512, seed=seed)


# ---------------------------------------------------------------------------------------------
# Producer features and authority
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_producer_features_equal_transformers_hidden_states(world, family, tmp_path):
    from transformers import AutoModelForCausalLM

    parent = world["parents"][family]
    model = AutoModelForCausalLM.from_pretrained(world["checkpoints"][family], dtype=torch.float32).eval()
    policy = PositionPolicy(tile_tokens=8, summaries_per_tile=2)
    for tokens in _prompts(3, seed=5, low=6, high=30):
        with torch.no_grad():
            expected = model(tokens[None], output_hidden_states=True).hidden_states[-1][0]
        for dtype in ("float32", "bfloat16"):
            producer = FeatureProducer(parent, tmp_path / dtype, policy=policy, feature_dtype=dtype)
            stored = producer.sidecar(tokens).store_boundary(producer.compute(tokens))
            final, summary = stored.final_hidden_t[0, 0].float(), stored.summary_hidden_t[0].float()
            reference_summary = torch.stack([c.mean(0) for c in expected.split(4)])
            if dtype == "float32":
                torch.testing.assert_close(final, expected[-1], atol=2e-4, rtol=1e-4)
                torch.testing.assert_close(summary, reference_summary, atol=2e-4, rtol=1e-4)
            else:
                assert pcc(final, expected[-1]) >= 0.999 and pcc(summary, reference_summary) >= 0.999
            assert int(stored.input_positions_t[0]) == tokens.numel()


def test_authority_is_built_from_the_real_weight_cache_marker(world, tmp_path):
    from models.common.weight_cache import VariantPaths, read_marker
    from models.common.weight_cache.marker import weights_identity

    parent = world["parents"]["llama"]
    marker = read_marker(VariantPaths(parent.loaded.cache_dir, parent.loader.build_variant))
    assert parent.identity.weights_sha256 == weights_identity(marker)
    tokens, policy = _prompts(1)[0], PositionPolicy()
    base = authority_for(tokens, parent, policy, "float32")
    record = base.record_boundary()
    assert record["parentModelArtifactSha256"] == weights_identity(marker)
    assert record["parentCheckpointId"] == "resynthesis-native-parent:" + weights_identity(marker)

    # The same checkpoint folder, rewritten with other weights: the cache rebuilds, the identity moves.
    moving = make_checkpoint("llama", tmp_path / "model", seed=0)
    first = FrozenParent.load(moving, precision="bfloat16", cache_root=tmp_path / "weights")
    assert first.identity.weights_sha256 == parent.identity.weights_sha256  # same bytes, same identity
    make_checkpoint("llama", tmp_path / "model", seed=1)
    second = FrozenParent.load(moving, precision="bfloat16", cache_root=tmp_path / "weights")
    assert not second.loaded.warm
    other_precision = FrozenParent.load(moving, precision="bfloat8_b", cache_root=tmp_path / "weights")
    shas = {
        authority_for(tokens, first, policy, "float32").sha256_boundary(),
        authority_for(tokens, second, policy, "float32").sha256_boundary(),
        authority_for(tokens, other_precision, policy, "float32").sha256_boundary(),
        authority_for(tokens, second, PositionPolicy(tile_tokens=32), "float32").sha256_boundary(),
        authority_for(tokens, second, policy, "bfloat16").sha256_boundary(),
        authority_for(torch.cat([tokens, tokens[:1]]), second, policy, "float32").sha256_boundary(),
    }
    assert len(shas) == 6
    # Same weights under another checkpoint id: another parent manifest, so another object.
    assert first.identity.manifest_sha256 != parent.identity.manifest_sha256
    assert base.sha256_boundary() != authority_for(tokens, first, policy, "float32").sha256_boundary()
    assert base.sha256_boundary() == authority_for(tokens.clone(), parent, PositionPolicy(), "float32").sha256_boundary()


def test_new_parent_weights_never_serve_a_stale_object(world, tmp_path):
    parent, tokens = world["parents"]["llama"], _prompts(1)[0]
    producer = FeatureProducer(parent, tmp_path / "prefill")
    producer.sidecar(tokens).store_boundary(producer.compute(tokens))
    changed = replace(parent, identity=replace(parent.identity, weights_sha256="0" * 64))
    assert FeatureProducer(changed, tmp_path / "prefill").sidecar(tokens).lookup_boundary() is None


# ---------------------------------------------------------------------------------------------
# Waves with a durable cursor, killed at random points
# ---------------------------------------------------------------------------------------------


def _fork(work, error_file: Path) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            torch.set_num_threads(1)  # as the whole module (one_torch_thread)
            work()
        except BaseException:  # noqa: BLE001 - report everything to the parent
            error_file.write_text(traceback.format_exc())
            code = 1
        finally:
            os._exit(code)
    return pid


def _stretch_syscalls(seed: int) -> None:
    """In a child only: pause up to 2 ms before each file-system call, so a kill at a random time
    lands on every step of a wave (artifacts, manifests, renames, the cursor)."""
    rng = random.Random(seed)
    for name in ("open", "write", "fsync", "fdatasync", "replace", "unlink", "mkdir"):
        real = getattr(os, name)

        def paused(*args, _real=real, **kwargs):
            time.sleep(rng.uniform(0.0, 0.002))
            return _real(*args, **kwargs)

        setattr(os, name, paused)


def _snapshot(root: Path) -> dict[str, dict[str, bytes]]:
    """Every object directory under ``root`` -> its files' bytes (lock files excluded)."""
    return {
        directory.name: {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != ".writer.lock"}
        for directory in object_dirs(root)
    }


@pytest.fixture(scope="module")
def wave_reference(world, tmp_path_factory) -> tuple[list[torch.Tensor], dict[str, dict[str, bytes]]]:
    """The prompts of the kill trials (one duplicated) and what an uninterrupted run stores."""
    prompts = _prompts(9, seed=11, low=3, high=12)
    prompts.insert(4, prompts[1].clone())
    root = tmp_path_factory.mktemp("wave-reference")
    report = produce_waves(FeatureProducer(world["parents"]["llama"], root / "prefill"), prompts, root / "run",
                           wave_size=3)
    assert report.computed == 9 and report.done == 10
    return prompts, _snapshot(root / "prefill")


def _kill_and_resume(parent, wave_reference, tmp_path: Path, trials: int) -> None:
    """SIGKILL a wave-producing child at a random moment, restart it, compare every byte."""
    prompts, expected = wave_reference
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    seen = {"mid_run": 0, "resumed_from_cursor": 0}
    for trial in range(trials):
        root, run_dir = tmp_path / f"t{trial}" / "prefill", tmp_path / f"t{trial}" / "run"
        producer = FeatureProducer(parent, root)
        error = tmp_path / f"t{trial}.err"
        child_seed = rng.randrange(1 << 30)

        def work() -> None:
            _stretch_syscalls(child_seed)
            produce_waves(producer, prompts, run_dir, wave_size=3)

        pid = _fork(work, error)
        time.sleep(rng.uniform(0.0, 0.6))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert not error.exists(), error.read_text() if error.exists() else ""
        cursor = run_dir / "cursor.json"
        done = json.loads(cursor.read_bytes())["done"] if cursor.exists() else 0
        # The cursor never runs ahead of durable objects.
        for tokens in prompts[:done]:
            assert producer.sidecar(tokens).lookup_boundary() is not None, (seed, trial, done)
        stored = sum(producer.stored(producer.sidecar(t)) is not None for t in {tuple(p.tolist()): p for p in prompts}.values())
        seen["mid_run"] += 0 < stored < 9
        seen["resumed_from_cursor"] += done > 0
        before = parent.prefills
        report = produce_waves(producer, prompts, run_dir, wave_size=3)
        assert report.done == len(prompts)
        assert parent.prefills - before == report.computed == 9 - stored, (seed, trial)  # nothing stored is recomputed
        assert _snapshot(root) == expected, (seed, trial)  # exactly the objects and bytes: none lost, none extra
        shutil.rmtree(tmp_path / f"t{trial}")
    assert seen["mid_run"] > 0, (seed, seen)  # the kills really landed mid-run


def test_sigkilled_wave_producer_resumes_with_exactly_the_expected_objects(world, wave_reference, tmp_path):
    _kill_and_resume(world["parents"]["llama"], wave_reference, tmp_path, KILL_TRIALS)


@pytest.mark.slow
def test_sigkilled_wave_producer_many_trials(world, wave_reference, tmp_path):
    _kill_and_resume(world["parents"]["llama"], wave_reference, tmp_path, 150)


def test_two_producers_over_overlapping_prompt_sets_at_once(world, tmp_path):
    parent = world["parents"]["llama"]
    prompts = _prompts(14, seed=21, low=3, high=10)
    sets = (prompts[:9], prompts[5:])
    root = tmp_path / "prefill"
    gate_read, gate_write = os.pipe()
    pids = []
    for index, subset in enumerate(sets):
        def work(subset=subset, index=index) -> None:
            os.read(gate_read, 1)
            produce_waves(FeatureProducer(parent, root), subset, tmp_path / f"run-{index}", wave_size=2)

        pids.append(_fork(work, tmp_path / f"err-{index}"))
    os.write(gate_write, b"xx")
    deadline = time.monotonic() + 300
    codes = {}
    while len(codes) < 2 and time.monotonic() < deadline:
        for pid in pids:
            if pid not in codes and os.waitpid(pid, os.WNOHANG)[0]:
                codes[pid] = True
        time.sleep(0.01)
    for pid in set(pids) - set(codes):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    errors = "".join(p.read_text() for p in tmp_path.glob("err-*"))
    assert len(codes) == 2 and not errors, errors
    producer = FeatureProducer(parent, root)
    assert len(list(object_dirs(root))) == 14
    for tokens in prompts:
        found = producer.sidecar(tokens).lookup_boundary()
        expected = producer.compute(tokens)
        assert found is not None and torch.equal(found.summary_hidden_t, expected.summary_hidden_t)
    for index in range(2):  # both runs finished with their own cursor at the end
        assert json.loads((tmp_path / f"run-{index}" / "cursor.json").read_bytes())["done"] == len(sets[index])


def test_cursor_of_another_run_and_a_second_producer_are_refused(world, tmp_path):
    parent = world["parents"]["llama"]
    producer = FeatureProducer(parent, tmp_path / "prefill")
    produce_waves(producer, _prompts(3), tmp_path / "run", wave_size=2)
    with pytest.raises(ProducerError, match="another run"):
        produce_waves(producer, _prompts(3, seed=1), tmp_path / "run")
    (tmp_path / "run" / "cursor.json").write_text("{nope")
    with pytest.raises(ProducerError, match="unreadable"):
        produce_waves(producer, _prompts(3), tmp_path / "run")
    from models.common.fileio import file_lock

    (tmp_path / "busy").mkdir()
    with file_lock(tmp_path / "busy" / "run.lock"):
        pid = _fork(lambda: produce_waves(producer, _prompts(3), tmp_path / "busy"), tmp_path / "busy.err")
        os.waitpid(pid, 0)
    assert "another producer is running" in (tmp_path / "busy.err").read_text()
    with pytest.raises(ValueError):
        produce_waves(producer, _prompts(3), tmp_path / "run2", wave_size=0)


def test_a_corrupt_object_is_recomputed_by_the_next_wave(world, tmp_path):
    parent = world["parents"]["llama"]
    producer, prompts = FeatureProducer(parent, tmp_path / "prefill"), _prompts(4)
    produce_waves(producer, prompts, tmp_path / "run-a", wave_size=2)
    victim = producer.sidecar(prompts[2])
    victim.paths.artifacts[1].write_bytes(b"\0" * victim.paths.artifacts[1].stat().st_size)
    report = produce_waves(producer, prompts, tmp_path / "run-b", wave_size=2)
    assert report.computed == 1 and report.reused == 3
    assert torch.equal(victim.lookup_boundary().summary_hidden_t, producer.compute(prompts[2]).summary_hidden_t)


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------

CONFIG = TrainConfig(epochs=3, batch_size=4, learning_rate=3e-3, width=32, seed=7)


def _train(parent, prompts, prefill_root, *, cache: bool, config=CONFIG, checkpoint=None):
    source = ParentFeatureSource(FeatureProducer(parent, prefill_root), cache=cache, lru_capacity=64)
    return Trainer(source, prompts, config, checkpoint).run(print_lines=False)


def test_training_loss_is_bit_identical_with_the_cache_on_and_off(llama, tmp_path):
    prompts = _prompts(10, seed=3)
    on = _train(llama, prompts, tmp_path / "prefill", cache=True)
    on_prefills = [r.prefills for r in on]
    off = _train(llama, prompts, tmp_path / "unused", cache=False)
    assert [r.losses for r in on] == [r.losses for r in off]  # bit for bit, every step
    assert on_prefills == [10, 0, 0]  # epoch 2 computes zero parent prefills
    assert [r.prefills for r in off] == [10, 10, 10]
    assert [(r.lru_hits, r.lru_misses, r.disk_hits, r.disk_misses) for r in on] == [(0, 10, 0, 10), (10, 0, 0, 0),
                                                                                      (10, 0, 0, 0)]
    assert on[-1].loss < on[0].loss  # it learns
    assert not (tmp_path / "unused").exists()  # cache off writes nothing
    # A later process (fresh memory tier) is served from disk: no prefill at all.
    llama.prefills = 0
    again = _train(llama, prompts, tmp_path / "prefill", cache=True, config=replace(CONFIG, epochs=1))
    assert (again[0].prefills, again[0].disk_hits, llama.prefills) == (0, 10, 0)
    assert again[0].losses == on[0].losses


def test_restart_from_a_child_checkpoint_gives_the_same_curve(llama, tmp_path):
    prompts = _prompts(10, seed=4)
    whole = _train(llama, prompts, tmp_path / "prefill", cache=True)
    checkpoint = tmp_path / "child.pt"
    first = _train(llama, prompts, tmp_path / "prefill", cache=True, config=replace(CONFIG, epochs=1),
                   checkpoint=checkpoint)
    resumed = _train(llama, prompts, tmp_path / "prefill", cache=True, checkpoint=checkpoint)
    assert [r.epoch for r in resumed] == [1, 2, 3]
    assert [r.losses for r in resumed] == [r.losses for r in whole]
    assert first[0].losses == whole[0].losses
    with pytest.raises(ValueError, match="another training configuration: width"):
        _train(llama, prompts, tmp_path / "prefill", cache=True, config=replace(CONFIG, width=16),
               checkpoint=checkpoint)


def test_read_only_hits_protect_the_memory_tier_during_training(llama, tmp_path):
    source = ParentFeatureSource(FeatureProducer(llama, tmp_path / "prefill"), lru_capacity=8)
    prompts = _prompts(2)
    first = source.batch(prompts)[0].logits.clone()
    hit = source.batch(prompts)[0]
    with pytest.raises(RuntimeError, match="prefill cache"):
        hit.logits.div_(0.7)
    assert torch.equal(source.batch(prompts)[0].logits, first)


def test_demo_entry_point_trains_and_reports(world, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), HF_HUB_OFFLINE="1")
    command = [sys.executable, "-m", "models.demos.resynthesis", "--model", str(world["checkpoints"]["llama"]),
               "--weight-cache", str(world["cache"]), "--prefill-cache", str(tmp_path / "prefill"), "--prompts", "6",
               "--min-tokens", "4", "--max-tokens", "12", "--epochs", "2", "--batch-size", "3",
               "--json", str(tmp_path / "report.json")]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 2 and "parent prefills 6" in lines[0] and "parent prefills 0" in lines[1]
    report = json.loads((tmp_path / "report.json").read_text())
    assert [e["prefills"] for e in report["epochs"]] == [6, 0]
    bad = subprocess.run([*command[:3], "--model", str(tmp_path / "nowhere")], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "nowhere" in bad.stderr
    sizes = subprocess.run([*command, "--min-tokens", "9", "--max-tokens", "3"], cwd=REPO_ROOT, env=env,
                           capture_output=True, text=True, timeout=600)
    assert sizes.returncode == 2 and "Traceback" not in sizes.stderr


def test_prompt_sets_are_reproducible():
    a, b = _prompts(5, seed=9), _prompts(5, seed=9)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, _prompts(5, seed=10)))
    with pytest.raises(ValueError):
        prompt_sets.synthetic(3, 5, 4, 512)
    ids, mask = prompt_tensors(a[0])
    assert ids.shape == (1, a[0].numel()) and mask.dtype == torch.long

