# SPDX-License-Identifier: Apache-2.0
"""Producer claims through the prefill cache API: one producer per object across processes, a
claim dies with its holder, a waiter gets the object the holder stored, and ``ls`` shows a
claimed object as in flight."""

from __future__ import annotations

import os
import signal
import time

import pytest

from models.common.prefill_cache import FrozenBackboneFeatureSidecar
from models.common.prefill_cache.claims import ProducerClaim
from models.common.prefill_cache.maintenance import gc, list_objects
from models.testing.prefill_factories import row, same_bytes


def _holder(object_root, *, store=None, hold_s: float = 60.0) -> tuple[int, int, int]:
    """A real other process that claims ``object_root`` (then, once told to go, stores ``store`` and
    exits; or holds the claim for ``hold_s``); returns (pid, read end of its 'claimed' pipe, write end
    of its 'go' pipe)."""
    ready_read, ready_write = os.pipe()
    go_read, go_write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(go_write)
            claim = ProducerClaim(object_root)
            if claim.take():
                os.write(ready_write, b"x")
                if store is None:
                    time.sleep(hold_s)
                else:
                    os.read(go_read, 1)  # "computing" until the test has looked
                    store[0].store_boundary(store[1])
                code = 0
        finally:
            os._exit(code)
    os.close(ready_write)
    os.close(go_read)
    return pid, ready_read, go_write


def test_a_claim_excludes_other_processes_and_dies_with_its_holder(tmp_path):
    sidecar, _ = row(tmp_path, 1)
    pid, ready, go = _holder(sidecar.paths.root)
    os.close(go)
    assert os.read(ready, 1) == b"x"
    mine = ProducerClaim(sidecar.paths.root)
    assert not mine.take() and not mine.held
    started = time.monotonic()
    assert not mine.wait(0.2) and time.monotonic() - started >= 0.2
    infos = list_objects(tmp_path)
    assert [info.state for info in infos] == ["in-flight"]  # claimed, nothing written yet
    assert gc(tmp_path).skipped_live == 1
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert mine.take() and mine.held
    with ProducerClaim(sidecar.paths.root) as again:
        assert not again.take()  # one holder at a time, also within a process
    mine.release()
    assert not mine.held
    assert [info.state for info in list_objects(tmp_path)] == ["debris"]  # a dead claim: 0 bytes of debris


def test_a_waiter_gets_what_the_holder_stored(tmp_path):
    sidecar, features = row(tmp_path, 2)
    pid, ready, go = _holder(sidecar.paths.root, store=(sidecar, features))
    assert os.read(ready, 1) == b"x"
    waiter = ProducerClaim(sidecar.paths.root)
    assert sidecar.lookup_boundary() is None
    os.write(go, b"x")
    os.close(go)
    assert waiter.wait(60.0)  # returns once the holder stored and exited
    assert same_bytes(sidecar.lookup_boundary(), features)
    waiter.release()
    assert os.waitpid(pid, 0)[1] == 0


def test_a_claim_on_a_root_that_cannot_hold_it_raises_os_error(tmp_path):
    (tmp_path / "file").write_text("x")
    sidecar = FrozenBackboneFeatureSidecar(cache_root=tmp_path / "file", authority=row(tmp_path, 3)[0].authority)
    with pytest.raises(OSError):
        ProducerClaim(sidecar.paths.root).take()
