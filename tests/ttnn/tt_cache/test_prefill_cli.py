# SPDX-License-Identifier: Apache-2.0
"""``tt-cache prefill ls|verify|gc`` through ``tt-cache``'s own ``main``: real caches on disk,
every exit status, ``--json``, and no torch or ttnn in the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.prefill_cache import FrozenBackboneFeatureSidecar
from models.testing import REPO_ROOT
from models.testing.prefill_factories import row
from models.tt_cache.cli import main

pytestmark = pytest.mark.usefixtures("cli_in_process")


@pytest.fixture
def cache(tmp_path) -> Path:
    root = tmp_path / "prefill"
    FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(row(root, index) for index in range(3)))
    return root


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_ls_lists_objects_bytes_schemas_and_debris(cache, capsys):
    sidecar, _ = row(cache, 9)
    sidecar.paths.root.mkdir(parents=True)
    (sidecar.paths.root / "summary_hidden.bfloat16.bin.partial").write_bytes(b"x" * 10)
    code, out, _ = _run(capsys, "prefill", "ls", str(cache), "--json")
    report = json.loads(out)
    assert code == 0 and report["objects"] == 3 and report["states"] == {"complete": 3, "debris": 1}
    assert report["debris_bytes"] == 10 and report["legacy"] == 0
    assert report["schemas"] == {"nnf.resynthesis.frozen_backbone_prefill_sidecar.v2": 3}
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert report["bytes"] == sum(p.stat().st_size for p in files)
    code, out, _ = _run(capsys, "prefill", "ls", str(cache))
    assert code == 0 and "3 objects" in out and "debris" in out


def test_verify_passes_then_names_a_corrupt_object_with_exit_1(cache, capsys):
    assert _run(capsys, "prefill", "verify", str(cache))[0] == 0
    victim, _ = row(cache, 1)
    data = bytearray(victim.paths.artifacts[0].read_bytes())
    data[0] ^= 1
    victim.paths.artifacts[0].write_bytes(bytes(data))
    code, out, _ = _run(capsys, "prefill", "verify", str(cache), "--json")
    report = json.loads(out)
    assert code == 1 and report["checked"] == 3
    assert [f["path"] for f in report["failures"]] == [str(victim.paths.root)]
    code, out, _ = _run(capsys, "prefill", "verify", str(cache))
    assert code == 1 and f"BAD {victim.paths.root}" in out and "SHA-256" in out


def test_gc_removes_debris_and_old_objects(cache, capsys):
    dead, _ = row(cache, 7)
    dead.paths.root.mkdir(parents=True)
    (dead.paths.root / "final_hidden.bfloat16.bin.partial").write_bytes(b"y" * 5)
    old, _ = row(cache, 0)
    stale = time.time() - 40 * 86_400
    os.utime(old.paths.manifest, (stale, stale))
    os.utime(old.paths.root, (stale, stale))  # its last use (a lookup touches the object directory)
    code, out, _ = _run(capsys, "prefill", "gc", str(cache), "--json")
    assert code == 0 and json.loads(out)["removed_files"] == 1 and json.loads(out)["removed_objects"] == 0
    code, out, _ = _run(capsys, "prefill", "gc", str(cache), "--older-than", "50d", "--json")
    assert code == 0 and json.loads(out)["removed_objects"] == 0  # tt-cache gc's duration syntax: 40 < 50 days
    code, out, _ = _run(capsys, "prefill", "gc", str(cache), "--older-than", "30d", "--json")
    assert code == 0 and json.loads(out)["removed_objects"] == 1
    assert old.lookup_boundary() is None and row(cache, 1)[0].lookup_boundary() is not None


@pytest.mark.parametrize("command", ["ls", "verify", "gc"])
def test_bad_roots_are_exit_2_with_one_line(tmp_path, capsys, command):
    missing = tmp_path / "missing"
    code, out, err = _run(capsys, "prefill", command, str(missing))
    assert code == 2 and "no such directory" in err and "Traceback" not in err
    a_file = tmp_path / "file"
    a_file.write_text("x")
    code, _, err = _run(capsys, "prefill", command, str(a_file))
    assert code == 2 and "not a directory" in err
    objects_file = tmp_path / "root-with-file"
    objects_file.mkdir()
    (objects_file / "objects").write_text("x")
    code, _, err = _run(capsys, "prefill", command, str(objects_file))
    assert code == 2 and err.startswith("tt-cache prefill: ") and "Traceback" not in err


@pytest.mark.parametrize("argv", [[], ["prefill"], ["prefill", "nope", "x"], ["prefill", "ls"],
                                  ["prefill", "gc", "x", "--older-than-days", "soon"],
                                  ["prefill", "gc", "x", "--older-than-days", "-1"],
                                  ["prefill", "gc", "x", "--older-than", "30"],
                                  ["prefill", "gc", "x", "--older-than", "30d", "--older-than-days", "30"]])
def test_bad_usage_is_exit_2(tmp_path, capsys, argv):
    argv = [str(tmp_path) if a == "x" else a for a in argv]
    code, _, err = _run(capsys, *argv)
    assert code == 2 and "Traceback" not in err


def test_an_empty_root_has_no_objects(tmp_path, capsys):
    code, out, _ = _run(capsys, "prefill", "ls", str(tmp_path), "--json")
    assert code == 0 and json.loads(out)["objects"] == 0


def test_the_earlier_days_spelling_is_refused_naming_the_one_syntax(cache, capsys):
    code, out, err = _run(capsys, "prefill", "gc", str(cache), "--older-than-days", "30", "--json")
    assert code == 2 and json.loads(out)["error"] == err.strip().removeprefix("tt-cache prefill: ")
    assert "--older-than 30d" in err and len(err.strip().splitlines()) == 1


def test_commands_import_neither_torch_nor_ttnn(cache):
    code = (
        "import sys\n"
        "from models.tt_cache.cli import main\n"
        f"codes = [main(['prefill', c, {str(cache)!r}, '--json']) for c in ('ls', 'verify', 'gc')]\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ttnn', 'numpy'})\n"
        "print(codes, heavy)\n"
        "sys.exit(0 if codes == [0, 0, 0] and not heavy else 1)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_ls_and_gc_of_the_cache_root_cover_its_prefill_cache(tmp_path):
    """``tt-cache ls`` shows the prefill cache beside the weight caches (bytes per sample
    included); ``tt-cache gc --prefill-max-size`` evicts its objects, LRU first."""
    from models.testing.tt_cache import cli_env, json_out, tt_cache

    root = tmp_path / "cache"
    FrozenBackboneFeatureSidecar.store_batch_boundary(tuple(row(root / "prefill", index) for index in range(3)))
    listing = tt_cache("ls", str(root), "--json", env=cli_env())
    assert listing.returncode == 0, listing.stderr[-2000:]
    prefill = json_out(listing)["prefill"]
    assert prefill["objects"] == 3 and prefill["bytes_per_sample"] > 0 and json_out(listing)["variants"] == []
    human = tt_cache("ls", str(root), env=cli_env())
    assert "prefill cache" in human.stdout and "per sample" in human.stdout
    gc = tt_cache("gc", str(root), "--prefill-max-size", "0", "--json", env=cli_env())
    assert gc.returncode == 0, gc.stderr[-2000:]
    assert json_out(gc)["prefill"]["evicted_objects"] == 3
    assert json_out(tt_cache("ls", str(root), "--json", env=cli_env()))["prefill"]["objects"] == 0
