# SPDX-License-Identifier: Apache-2.0
"""Reliability of models.common.prefill_cache: real SIGKILLs, real concurrent processes, every
single-byte corruption, and property-based malformed manifests and progress files.

Writers run in forked child processes (torch is already imported, so a child costs milliseconds,
not seconds) and are killed from outside with SIGKILL after a random delay. Every random choice
comes from a seed printed on failure. The long versions are marked ``slow``:
``scripts/run_tests.sh -m slow tests/prefill_cache/test_prefill_cache_reliability.py``."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.common.prefill_cache import FrozenBackboneCacheError, FrozenBackboneFeatureSidecar
from models.testing.prefill_factories import row, same_bytes

ARTIFACT_CHILD_TIMEOUT_S = 120.0


def _fork(work: Callable[[], None], error_dir: Path) -> int:
    """Run ``work`` in a forked child; a failure leaves its traceback in ``error_dir``."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            work()
        except BaseException:  # noqa: BLE001 - report everything to the parent
            (error_dir / f"child-{os.getpid()}.txt").write_text(traceback.format_exc())
            code = 1
        finally:
            os._exit(code)
    return pid


def _wait(pids: list[int], timeout_s: float) -> dict[int, int]:
    """Exit codes of ``pids``; kills them all and fails if any is still running at the deadline."""
    deadline = time.monotonic() + timeout_s
    codes: dict[int, int] = {}
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for pid in set(pids) - set(codes):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            pytest.fail(f"writers still running after {timeout_s}s (deadlock?)")
        time.sleep(0.005)
    return codes


def _child_errors(error_dir: Path) -> str:
    return "\n".join(path.read_text() for path in sorted(error_dir.glob("child-*.txt")))


# ---------------------------------------------------------------------------------------------
# SIGKILL at random points
# ---------------------------------------------------------------------------------------------

OBJECTS_PER_TRIAL = 8


def _store(root: Path, indices: list[int], mode: str) -> None:
    rows = [row(root, index) for index in indices]
    if mode == "single":
        for sidecar, features in rows:
            sidecar.store_boundary(features)
    else:
        for start in range(0, len(rows), 4):
            FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(rows[start : start + 4]))


def _stretch_syscalls(seed: int) -> None:
    """In a child only: pause up to 2 ms before each file-system call, so a kill at a uniformly
    random time lands on every step of the protocol (renames included), not mostly in fsync."""
    rng = random.Random(seed)
    for name in ("open", "write", "close", "fsync", "fdatasync", "replace", "unlink", "mkdir"):
        real = getattr(os, name)

        def paused(*args, _real=real, **kwargs):
            time.sleep(rng.uniform(0.0, 0.002))
            return _real(*args, **kwargs)

        setattr(os, name, paused)


def _in_flight(sidecar: FrozenBackboneFeatureSidecar) -> bool:
    return sidecar.paths.root.is_dir() and not sidecar.paths.manifest.exists()


def _kill_trials(root: Path, mode: str, trials: int, seed: int) -> dict[str, int]:
    """Kill a storing child at a random moment, ``trials`` times; check every object after each."""
    rng = random.Random(seed)
    seen = {"exact": 0, "miss": 0, "in_flight": 0}
    error_dir = root / "errors"
    error_dir.mkdir(exist_ok=True)
    for trial in range(trials):
        indices = list(range(trial * OBJECTS_PER_TRIAL, (trial + 1) * OBJECTS_PER_TRIAL))
        stretched = trial % 4 != 0
        child_seed = rng.randrange(1 << 30)

        def work() -> None:
            if stretched:
                _stretch_syscalls(child_seed)
            _store(root, indices, mode)

        pid = _fork(work, error_dir)
        time.sleep(rng.uniform(0.0, 0.15 if stretched else 0.04))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert not _child_errors(error_dir), _child_errors(error_dir)
        rows = [row(root, index) for index in indices]
        for sidecar, features in rows:
            seen["in_flight"] += _in_flight(sidecar)
            found = sidecar.lookup_boundary()  # must never raise
            if found is None:
                seen["miss"] += 1
            else:
                assert same_bytes(found, features), f"trial {trial}: wrong bytes for {sidecar}"
                seen["exact"] += 1
        _store(root, indices, mode)  # a new store after the crash succeeds ...
        for sidecar, features in rows:  # ... and is exact
            assert same_bytes(sidecar.lookup_boundary(), features)
    return seen


@pytest.mark.parametrize("mode", ["single", "batch"])
def test_sigkill_during_store_leaves_misses_or_exact_objects(tmp_path, mode):
    seed = random.randrange(1 << 30)
    seen = _kill_trials(tmp_path, mode, trials=20, seed=seed)
    # The kills must really land mid-store, or this test proves nothing.
    assert seen["in_flight"] > 0 and seen["miss"] > 0, (seed, seen)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["single", "batch"])
def test_sigkill_during_store_many_trials(tmp_path, mode):
    seed = random.randrange(1 << 30)
    seen = _kill_trials(tmp_path, mode, trials=200, seed=seed)
    assert seen["in_flight"] > 0 and seen["exact"] > 0 and seen["miss"] > 0, (seed, seen)


# ---------------------------------------------------------------------------------------------
# Concurrent writers (and a reader)
# ---------------------------------------------------------------------------------------------


def _writer(root: Path, universe: int, seed: int, gate: int) -> None:
    os.read(gate, 1)  # start together
    rng = random.Random(seed)
    order = list(range(universe))
    rng.shuffle(order)
    while order:
        size = rng.randint(1, 10)
        wave, order = order[:size], order[size:]
        if size == 1:
            sidecar, features = row(root, wave[0])
            assert same_bytes(sidecar.store_boundary(features), features)
        else:
            FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(row(root, i) for i in wave))


def _reader(root: Path, universe: int, seed: int, gate: int, stop: Path) -> None:
    os.read(gate, 1)
    rng = random.Random(seed)
    while not stop.exists():
        sidecar, features = row(root, rng.randrange(universe))
        found = sidecar.lookup_boundary()
        assert found is None or same_bytes(found, features)


def _concurrent_waves(root: Path, writers: int, universe: int, rounds: int, seed: int) -> None:
    error_dir = root / "errors"
    error_dir.mkdir()
    for round_index in range(rounds):
        cache = root / f"round-{round_index}"
        stop = root / f"stop-{round_index}"
        gate_read, gate_write = os.pipe()
        pids = [
            _fork(lambda s=seed + 7 * round_index + w: _writer(cache, universe, s, gate_read), error_dir)
            for w in range(writers)
        ]
        reader = _fork(lambda: _reader(cache, universe, seed, gate_read, stop), error_dir)
        os.write(gate_write, b"x" * (writers + 1))
        codes = _wait(pids, ARTIFACT_CHILD_TIMEOUT_S)
        stop.touch()
        codes.update(_wait([reader], ARTIFACT_CHILD_TIMEOUT_S))
        os.close(gate_read)
        os.close(gate_write)
        assert set(codes.values()) == {0}, _child_errors(error_dir)
        for index in range(universe):
            sidecar, features = row(cache, index)
            assert same_bytes(sidecar.lookup_boundary(), features)
            leftovers = [p.name for p in sidecar.paths.root.iterdir() if p.name not in _FINAL_NAMES]
            assert not leftovers, leftovers


_FINAL_NAMES = {".writer.lock", "manifest.json", "final_hidden.bfloat16.bin",
                "summary_hidden.bfloat16.bin", "input_positions.i64le"}


def test_four_processes_storing_overlapping_waves_never_deadlock(tmp_path):
    _concurrent_waves(tmp_path, writers=4, universe=40, rounds=2, seed=random.randrange(1 << 30))


@pytest.mark.slow
def test_many_processes_storing_overlapping_waves_many_rounds(tmp_path):
    _concurrent_waves(tmp_path, writers=6, universe=80, rounds=20, seed=random.randrange(1 << 30))


# ---------------------------------------------------------------------------------------------
# Every single-byte corruption
# ---------------------------------------------------------------------------------------------


def _outcome(sidecar: FrozenBackboneFeatureSidecar, features) -> str:
    try:
        found = sidecar.lookup_boundary()
    except FrozenBackboneCacheError:
        return "error"
    if found is None:
        return "miss"
    assert same_bytes(found, features), "corrupted bytes returned as data"
    return "exact"


def _corruptions(data: bytes):
    """(label, corrupted bytes): every byte flipped, every truncation, two extensions."""
    for position in range(len(data)):
        flipped = bytearray(data)
        flipped[position] ^= 0xFF
        yield f"flip@{position}", bytes(flipped)
    for length in range(len(data)):
        yield f"truncate@{length}", data[:length]
    yield "extend+1", data + b"\0"
    yield "extend+4096", data + bytes(range(256)) * 16


def _overwrite(path: Path, data: bytes, mtime_ns: int) -> None:
    """Rewrite ``path`` in place (same inode) and put its mtime back, as silent bit rot would."""
    with open(path, "r+b") as stream:
        stream.write(data)
        stream.truncate(len(data))
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_every_flip_truncation_and_extension_is_caught(tmp_path):
    sidecar, features = row(tmp_path, 1, hidden=4, positions=2)
    sidecar.store_boundary(features)
    files = sorted(sidecar.paths.root.iterdir())
    assert {p.name for p in files} == _FINAL_NAMES
    manifest_size = sidecar.paths.manifest.stat().st_size
    harmless = {  # corruptions that leave the object's meaning intact
        ("manifest.json", f"truncate@{manifest_size - 1}"),  # drops only the trailing newline
        (".writer.lock", "extend+1"),
        (".writer.lock", "extend+4096"),
    }
    outcomes: dict[tuple[str, str], str] = {}
    for path in files:
        original, mtime_ns = path.read_bytes(), path.stat().st_mtime_ns
        for label, corrupted in _corruptions(original):
            _overwrite(path, corrupted, mtime_ns)
            outcomes[path.name, label] = _outcome(sidecar, features)
        _overwrite(path, original, mtime_ns)
        assert _outcome(sidecar, features) == "exact"
    exact = {case for case, outcome in outcomes.items() if outcome == "exact"}
    assert exact == harmless
    assert "miss" not in outcomes.values()
    assert len(outcomes) > 2 * manifest_size


# ---------------------------------------------------------------------------------------------
# Malformed manifest.json / progress.json (property-based)
# ---------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63 - 5, max_value=2**80)
    | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)


def _key_paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _key_paths(item, (*prefix, key))


@st.composite
def mutated_documents(draw, good: dict) -> bytes:
    """A valid record with one value replaced or one key removed, or junk bytes."""
    kind = draw(st.sampled_from(["replace", "delete", "junk", "json", "huge", "deep", "non-utf8"]))
    if kind == "junk":
        return draw(st.binary(max_size=300))
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    if kind == "huge":
        return b'{"rows": 1' + b"9" * draw(st.integers(4000, 6000)) + b"}"
    if kind == "deep":
        depth = draw(st.integers(1000, 100_000))
        return b"[" * depth + b"]" * depth
    if kind == "non-utf8":
        text = json.dumps(good).encode()
        position = draw(st.integers(0, len(text) - 1))
        return text[:position] + b"\xff\xfe" + text[position:]
    document = json.loads(json.dumps(good))
    paths = [path for path in _key_paths(document) if path]
    path = draw(st.sampled_from(paths))
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    if kind == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(json_values)
    return json.dumps(document).encode()


PROPERTY_SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=False)


def test_malformed_manifest_is_the_documented_error(tmp_path):
    sidecar, features = row(tmp_path, 1)
    sidecar.store_boundary(features)
    good = json.loads(sidecar.paths.manifest.read_bytes())

    @settings(max_examples=250, **PROPERTY_SETTINGS)
    @given(document=mutated_documents(good))
    def check(document: bytes) -> None:
        sidecar.paths.manifest.write_bytes(document)
        assert _outcome(sidecar, features) in ("error", "exact")

    check()


def test_malformed_progress_is_the_documented_error_and_never_blocks_a_store(tmp_path):
    sidecar, features = row(tmp_path, 1)
    staged = sidecar._staged(features)
    good = sidecar._progress_payload(staged)

    @settings(max_examples=60, **PROPERTY_SETTINGS)
    @given(document=mutated_documents(good), with_partials=st.booleans())
    def check(document: bytes, with_partials: bool) -> None:
        shutil.rmtree(sidecar.paths.root, ignore_errors=True)
        sidecar.paths.root.mkdir(parents=True)
        if with_partials:  # a killed writer's staged files, possibly matching the frontier
            for partial, payload in zip(sidecar.paths.partials, staged.payloads, strict=True):
                partial.write_bytes(payload)
        sidecar.paths.progress.write_bytes(document)
        try:
            frontier = sidecar.progress_boundary()
        except FrozenBackboneCacheError:
            frontier = None
        if frontier is not None:
            assert frontier["completedRows"] == 1 and set(frontier["artifacts"]) == set(good["artifacts"])
        assert sidecar.lookup_boundary() is None  # progress alone is never an object
        assert same_bytes(sidecar.store_boundary(features), features)
        assert same_bytes(sidecar.lookup_boundary(), features)

    check()
