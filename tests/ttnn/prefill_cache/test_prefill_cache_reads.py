# SPDX-License-Identifier: Apache-2.0
"""A lookup serves the bytes of the files it checked, read through the opens it checked: a file
renamed over an artifact after the proof is never served, and a hit is memory of the caller's
own (a file truncated or rewritten in place later never reaches it, nor kills the process)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from models.common.prefill_cache import FrozenBackboneCacheError
from models.common.prefill_cache import sidecar as sidecar_module
from models.testing.prefill_factories import row, same_bytes

WIDE = dict(hidden=2048, positions=4)  # a 16 KiB summary: four pages, so a truncation leaves whole pages past the end

# A lookup in a fresh process (``CHILD cache_root``): says it found the row, waits for a line on
# stdin (the parent changes the summary file in place meanwhile), then compares every byte.
CHILD = """
import sys
from pathlib import Path
from models.testing.prefill_factories import row, same_bytes
sidecar, features = row(Path(sys.argv[1]), 1, hidden=2048, positions=4)
found = sidecar.lookup_boundary()
found = sidecar.lookup_boundary()  # proven now: the summary is read, the rest comes from the proof
print("found", found is not None, flush=True)
sys.stdin.readline()
print("same" if same_bytes(found, features) else "different", flush=True)
"""


def stored(tmp_path):
    sidecar, features = row(tmp_path, 1, **WIDE)
    sidecar.store_boundary(features)
    time.sleep(0.05)  # past the file-system clock tick of the writes: the first lookup keeps its proof
    return sidecar, features


def flip_in_place(path) -> None:
    """Rewrite every byte of ``path`` in place (the same inode, the same size)."""
    with open(path, "r+b") as stream:
        data = stream.read()
        stream.seek(0)
        stream.write(bytes(byte ^ 0x5A for byte in data))


def test_a_summary_renamed_over_between_the_proof_and_the_read_is_never_served(tmp_path, monkeypatch):
    sidecar, features = stored(tmp_path)
    assert same_bytes(sidecar.lookup_boundary(), features)  # validated: the proof is kept
    summary = sidecar.paths.summary_hidden
    intruder = tmp_path / "intruder.bin"
    shutil.copyfile(summary, intruder)
    flip_in_place(intruder)  # the same size, other values
    holds = sidecar_module._PROOFS.holds
    renamed = []

    def proof_then_rename(key, stamps):
        proof = holds(key, stamps)
        if proof is not None and not renamed:  # the proof matched the stamps: the rename lands before the read
            os.replace(intruder, summary)
            renamed.append(key)
        return proof

    monkeypatch.setattr(sidecar_module._PROOFS, "holds", proof_then_rename)
    with pytest.raises(FrozenBackboneCacheError, match="summaryHidden content does not match its SHA-256"):
        sidecar.lookup_boundary()
    assert renamed


def test_a_proven_hit_reads_the_summary_once_through_its_checked_open(tmp_path, monkeypatch):
    """A proven lookup opens the summary once and never maps it (the window the rule closes)."""
    sidecar, features = stored(tmp_path)
    sidecar.lookup_boundary()
    opened = []
    real_open = os.open

    def counting_open(path, *args, **kwargs):
        opened.append(os.fspath(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    assert same_bytes(sidecar.lookup_boundary(), features)
    assert opened == [str(sidecar.paths.summary_hidden)]


@pytest.mark.parametrize("how", ["truncate", "rewrite"])
def test_a_summary_changed_in_place_after_a_hit_never_reaches_it(tmp_path, how):
    """The hit's bytes stay the stored ones and the process lives (no SIGBUS at first use)."""
    sidecar, _ = stored(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().split() == ["found", "True"]
    summary = sidecar.paths.summary_hidden
    if how == "truncate":
        os.truncate(summary, 0)
    else:
        flip_in_place(summary)
    out, err = child.communicate("go\n", timeout=120)
    assert child.returncode == 0, f"the child ended with {child.returncode} (SIGBUS is -7): {err[-2000:]}"
    assert out.split() == ["same"]
