# SPDX-License-Identifier: Apache-2.0
"""A cache's identity says everything that makes its bytes valid elsewhere: the ttnn version and
the tensorbin format it writes (probed from ttnn's own header), recorded by every real build and
compared by the gate, the loader and ``tt-cache check``; a cache of another identity, or one
recorded before the identity held them, is cold with the reason in words and rebuilt, never
loaded. The device architecture is not part of it: ttnn writes the same bytes for Wormhole and
Blackhole."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import ttnn

from models.common import weight_cache as wc
from models.common.weight_cache.variant import (
    TensorbinProbeError,
    probe_tensorbin_format,
    tensorbin_format_of,
    ttnn_runtime,
)
from models.llama import LlamaLoader
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import REPO_ROOT, cli_env, tt_cache
from tests.ttnn.weight_cache.seed_api import marker_body, rewrite_marker, status

TTNN_VERSION = importlib.metadata.version("ttnn")
OTHER_FORMAT = "flatbuffer-d376-0badf00d"


def this_format() -> str:
    return ttnn_runtime().tensorbin_format


# -- the probe ---------------------------------------------------------------------------------


def test_the_probe_reads_the_header_ttnn_dump_tensor_writes(tmp_path):
    path = tmp_path / "one.tensorbin"
    ttnn.dump_tensor(str(path), ttnn.from_torch(torch.tensor([[1.5]], dtype=torch.bfloat16)))
    raw = path.read_bytes()
    (length,) = struct.unpack_from("<Q", raw)
    assert len(raw) == 8 + length + 2  # one bfloat16 after the header
    data_start = 8 + length
    assert data_start % 64 == 0  # this ttnn pads its header so the data starts on 64 bytes
    expected = f"flatbuffer-d{data_start}-{hashlib.sha256(raw[:data_start]).hexdigest()[:8]}"
    assert probe_tensorbin_format() == tensorbin_format_of(raw) == expected == this_format()
    assert ttnn_runtime().version == TTNN_VERSION


def test_a_header_encoded_otherwise_is_another_format(tmp_path):
    path = tmp_path / "one.tensorbin"
    ttnn.dump_tensor(str(path), ttnn.from_torch(torch.tensor([[1.5]], dtype=torch.bfloat16)))
    raw = path.read_bytes()
    (length,) = struct.unpack_from("<Q", raw)
    unpadded = struct.pack("<Q", length - 8) + raw[8:8 + length - 8] + raw[8 + length:]  # padding cut
    assert tensorbin_format_of(unpadded) != tensorbin_format_of(raw)
    assert tensorbin_format_of(raw[:8] + bytes([raw[8] ^ 1]) + raw[9:]) != tensorbin_format_of(raw)
    with pytest.raises(TensorbinProbeError):
        tensorbin_format_of(struct.pack("<Q", 1 << 40) + raw[8:])


# -- real builds record it ---------------------------------------------------------------------


def test_the_seed_api_records_the_ttnn_version_and_tensorbin_format(seeded_cache):
    body = marker_body(seeded_cache.root)
    assert (body["format_version"], body["ttnn_version"], body["tensorbin_format"]) == (7, TTNN_VERSION, this_format())
    assert status(seeded_cache).warm


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return make_checkpoint("llama", tmp_path_factory.mktemp("identity") / "tiny-llama")


def test_a_loader_build_records_them_and_another_ttnn_rebuilds_once(tiny_llama, tmp_path):
    loader = lambda: LlamaLoader(str(tiny_llama), cache_root=tmp_path / "cache", precision="bfloat16")  # noqa: E731
    first = loader().load()
    assert not first.warm
    body = marker_body(first.cache_dir, loader().build_variant)
    assert (body["ttnn_version"], body["tensorbin_format"]) == (TTNN_VERSION, this_format())
    body["ttnn_version"] = "0.80.0"
    rewrite_marker(first.cache_dir, body, loader().build_variant)
    again = loader().load()
    assert not again.warm
    assert again.reason == (f"built with ttnn 0.80.0 (tensorbin format {this_format()}); this is ttnn "
                            f"{TTNN_VERSION} (tensorbin format {this_format()})")
    assert marker_body(first.cache_dir, loader().build_variant)["ttnn_version"] == TTNN_VERSION  # rebuilt
    assert loader().load().warm


# -- another identity is cold, with the reason -------------------------------------------------


@pytest.mark.parametrize("field, value, words", [
    ("ttnn_version", "0.80.0", "built with ttnn 0.80.0 (tensorbin format {format}); this is ttnn {version} "
                               "(tensorbin format {format})"),
    ("tensorbin_format", OTHER_FORMAT, "built with ttnn {version} (tensorbin format " + OTHER_FORMAT + "); "
                                       "this is ttnn {version} (tensorbin format {format})"),
    ("ttnn_version", None, "marker records no ttnn version (its files' format is unknown)"),
])
def test_a_marker_of_another_identity_is_cold_and_says_how(seeded_cache, field, value, words):
    body = marker_body(seeded_cache.root)
    body[field] = value
    rewrite_marker(seeded_cache.root, body)
    verdict = status(seeded_cache)
    assert not verdict.warm
    assert verdict.reason == words.format(version=TTNN_VERSION, format=this_format())
    assert not wc.weight_cache_is_complete(seeded_cache.root, **seeded_cache.gate_kwargs())


def test_a_marker_from_before_the_identity_held_ttnn_is_cold_and_rebuilds_once(seeded_cache, tiny_llama, tmp_path):
    body = marker_body(seeded_cache.root)
    del body["ttnn_version"], body["tensorbin_format"]
    rewrite_marker(seeded_cache.root, dict(body, format_version=6))
    assert "records no ttnn version or tensorbin format" in status(seeded_cache).reason
    assert "the cache rebuilds once" in status(seeded_cache).reason
    rewrite_marker(seeded_cache.root, body)  # format 7 without them: invalid, says which field
    assert "ttnn_version is missing" in status(seeded_cache).reason

    loader = lambda: LlamaLoader(str(tiny_llama), cache_root=tmp_path / "cache", precision="bfloat16")  # noqa: E731
    cache_dir = loader().load().cache_dir
    old = marker_body(cache_dir, loader().build_variant)
    del old["ttnn_version"], old["tensorbin_format"]
    rewrite_marker(cache_dir, dict(old, format_version=6), loader().build_variant)
    cold = loader().load()
    assert not cold.warm and "records no ttnn version or tensorbin format" in cold.reason
    assert loader().load().warm  # once


# -- tt-cache check, a torch-free process ------------------------------------------------------


def test_tt_cache_check_names_the_other_ttnn_and_format(tiny_llama, tmp_path):
    env = cli_env(tmp_path / "cache", TT_USER_STATE=str(tmp_path / "state"))
    built = tt_cache("build", str(tiny_llama), "--precision", "bfloat16", env=env)
    assert built.returncode == 0, built.stderr[-2000:]
    [marker] = (tmp_path / "cache").rglob(".weights_complete.*")
    assert tt_cache("check", str(marker.parent), env=env).returncode == 0
    body = json.loads(marker.read_bytes())
    recorded = body["tensorbin_format"]
    for field, value, words in [
        ("ttnn_version", "0.80.0", f"built with ttnn 0.80.0 (tensorbin format {recorded}); this is ttnn "
                                   f"{TTNN_VERSION} (tensorbin format {recorded})"),
        ("tensorbin_format", OTHER_FORMAT, f"built with ttnn {TTNN_VERSION} (tensorbin format {OTHER_FORMAT}); "
                                           f"this is ttnn {TTNN_VERSION} (tensorbin format {recorded})"),
    ]:
        marker.write_text(json.dumps(dict(body, **{field: value})))
        check = tt_cache("check", str(marker.parent), env=env)
        assert check.returncode == 1, check.stderr[-2000:]  # a check failed (docs/cli.md)
        assert f"{marker}: cold: {words}" in check.stdout
        listing = json.loads(tt_cache("ls", "--json", env=env).stdout)["variants"]
        assert [(row["state"], row["reason"], row[field]) for row in listing] == [("cold", words, value)]
    # a ttnn not probed on this machine yet (no record in this user's state): the version still counts
    fresh = dict(env, TT_USER_STATE=str(tmp_path / "fresh-state"))
    marker.write_text(json.dumps(dict(body, ttnn_version="0.80.0")))
    check = tt_cache("check", str(marker.parent), env=fresh)
    assert check.returncode == 1
    assert (f"this is ttnn {TTNN_VERSION} (tensorbin format not probed on this machine yet)") in check.stdout


# -- the device architecture -------------------------------------------------------------------

_DUMP_UNDER_A_BOARD = """
import hashlib, json, sys
import models, torch, ttnn
from models.common.weight_cache.variant import probe_tensorbin_format
out = {"arch": ttnn.get_arch_name(), "format": probe_tensorbin_format()}
weight = (torch.arange(64 * 96, dtype=torch.float32).reshape(64, 96) % 509 - 254) / 64
for kind in sys.argv[2:]:
    dtype, layout = kind.split(":")
    path = f"{sys.argv[1]}/{dtype}-{layout}.tensorbin"
    ttnn.dump_tensor(path, ttnn.from_torch(weight, dtype=getattr(ttnn, dtype), layout=getattr(ttnn, layout)))
    out[kind] = hashlib.sha256(open(path, "rb").read()).hexdigest()
print("RESULT " + json.dumps(out))
"""
EVERY_KIND = ("bfloat16:TILE_LAYOUT", "bfloat16:ROW_MAJOR_LAYOUT", "bfloat8_b:TILE_LAYOUT", "bfloat4_b:TILE_LAYOUT",
              "float32:TILE_LAYOUT", "float32:ROW_MAJOR_LAYOUT")


def dumped_under(board: str, kinds: tuple[str, ...], out: Path) -> dict:
    """What a fresh process on the mock cluster of ``board`` dumps: its arch, probed format, file digests."""
    env = {key: value for key, value in cli_env().items() if key != "TT_METAL_MOCK_CLUSTER_DESC_PATH"}
    out.mkdir()
    run = subprocess.run([sys.executable, "-c", _DUMP_UNDER_A_BOARD, str(out), *kinds], cwd=REPO_ROOT,
                         env=dict(env, TT_MOCK_BOARD=board), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    [result] = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]  # ttnn logs to stdout
    return json.loads(result.removeprefix("RESULT "))


def same_bytes_on_both_boards(kinds: tuple[str, ...], tmp_path: Path) -> None:
    """Why the architecture is not in the identity (docs/weight-cache.md): if ttnn ever writes
    another byte for another board, this fails and the identity must hold the architecture."""
    wormhole, blackhole = (dumped_under(board, kinds, tmp_path / board) for board in ("n150", "p150"))
    assert (wormhole.pop("arch"), blackhole.pop("arch")) == ("wormhole_b0", "blackhole")
    assert len(wormhole) == len(kinds) + 1 and wormhole == blackhole
    assert wormhole["format"] == this_format()


def test_wormhole_and_blackhole_write_the_same_block_float_tensorbin(tmp_path):
    same_bytes_on_both_boards(("bfloat8_b:TILE_LAYOUT",), tmp_path)  # packing asks the cluster for its arch


@pytest.mark.slow
def test_wormhole_and_blackhole_write_the_same_tensorbins_in_every_format(tmp_path):
    same_bytes_on_both_boards(EVERY_KIND, tmp_path)


# -- a probe that cannot run -------------------------------------------------------------------


def test_a_probe_that_cannot_write_fails_the_mark_and_the_gate_compares_what_it_can(
        built_cache, readonly_view, captured_warnings, monkeypatch):
    """ttnn cannot dump the probe (its temp dir is on a read-only mount): a writer records nothing
    rather than a guessed format; a reader warns and compares the ttnn version and the recorded format."""
    import tempfile

    from models.common.weight_cache import variant

    scratch = built_cache.root.parent / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(readonly_view(scratch)))
    variant._probed.cache_clear()
    try:
        assert not built_cache.mark()
        assert "Could not mark weight cache" in captured_warnings()
        monkeypatch.setattr(tempfile, "tempdir", None)
        variant._probed.cache_clear()
        assert built_cache.mark()
        monkeypatch.setattr(tempfile, "tempdir", str(readonly_view(scratch)))
        variant._probed.cache_clear()
        assert status(built_cache).warm
        assert "could not probe ttnn's tensorbin format" in captured_warnings()
    finally:
        monkeypatch.setattr(tempfile, "tempdir", None)
        variant._probed.cache_clear()
