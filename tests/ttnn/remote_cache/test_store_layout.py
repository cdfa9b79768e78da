# SPDX-License-Identifier: Apache-2.0
"""A shared store's manifest is untrusted input: every malformed one is refused with a reason, a
well-formed one reads back as written, and object keys are the digests the marker records."""

from __future__ import annotations

import dataclasses
import json

import pytest

from models.common.weight_cache.marker import FileRecord, draft_marker
from models.common.weight_cache.remote.store_layout import (
    MAX_MANIFEST_BYTES,
    ManifestError,
    keys_in,
    latest_key,
    location_key,
    manifest_json,
    manifest_of,
    manifests_prefix,
    model_index_key,
    model_index_prefix,
    model_key,
    model_key_of,
    new_manifest_name,
    object_key,
    parse_latest,
    parse_manifest,
    variant_key,
)

DIGEST_A, DIGEST_B = "a" * 64, "0b" + "c" * 62
LOCATION = "tiny-llama--5555555555555555/bfloat16/mesh_1x2"


def _marker(generation: str | None = "g18eea319fb9b939f-c59b93"):
    draft = draft_marker(
        model_name="tiny-llama", model_id="org/tiny-llama", content_id="5" * 64, n_layers=2, mesh_shape=(1, 2),
        components=None, build_variant={"family": "llama", "precision": "bfloat16", "layout": 3}, is_moe=False,
        model_info={"fuse_qkv": True}, model_config={"hidden_size": 64}, weights={"norm.weight": ((64,), "torch.bfloat16")},
        host_weights=[])
    prefix = f"{generation}/" if generation else ""
    files = (FileRecord(f"{prefix}layers.0/wq.tensorbin", 1024, DIGEST_A),
             FileRecord(f"{prefix}norm.tensorbin", 128, DIGEST_B), FileRecord(f"{prefix}layers.1/wq.tensorbin", 1024, DIGEST_A))
    return dataclasses.replace(draft, generation=generation, files=files, verified_ns=123)


def _body() -> dict:
    return json.loads(manifest_json(manifest_of(_marker(), LOCATION, pushed_ns=1_700_000_000_000_000_000)))


def _with_marker(change):
    def edit(body: dict) -> dict:
        marker = dict(body["marker"])
        change(marker)
        return {**body, "marker": marker}
    return edit


def _with_file(index: int, **fields):
    def change(marker: dict) -> None:
        marker["files"] = [dict(f) for f in marker["files"]]
        marker["files"][index].update(fields)
    return _with_marker(change)


def _deep(depth: int):
    value: object = 1
    for _ in range(depth):
        value = {"x": value}
    return value


MALFORMED = {
    "not json": b"{not json",
    "not utf-8": b'{"location": "\xff"}',
    "a list": b"[]",
    "too large": b" " * (MAX_MANIFEST_BYTES + 1),
    "NaN": lambda b: json.dumps({**b, "pushed_ns": float("nan")}).encode(),
    "unknown field": lambda b: {**b, "extra": 1},
    "missing marker": lambda b: {k: v for k, v in b.items() if k != "marker"},
    "marker a string": lambda b: {**b, "marker": "{}"},
    "manifest_version 2": lambda b: {**b, "manifest_version": 2},
    "manifest_version true": lambda b: {**b, "manifest_version": True},
    "variant_key short": lambda b: {**b, "variant_key": "ab"},
    "variant_key upper case": lambda b: {**b, "variant_key": b["variant_key"].upper()},
    "variant_key of another variant": lambda b: {**b, "variant_key": "f" * 64},
    "pushed_ns negative": lambda b: {**b, "pushed_ns": -1},
    "pushed_ns a string": lambda b: {**b, "pushed_ns": "now"},
    "location absolute": lambda b: {**b, "location": "/etc/cron.d"},
    "location with ..": lambda b: {**b, "location": "../../etc"},
    "location hidden": lambda b: {**b, "location": ".stamps/x"},
    "location empty": lambda b: {**b, "location": ""},
    "location backslash": lambda b: {**b, "location": "a\\b"},
    "location in a generation": lambda b: {**b, "location": "m--1/bfloat16/g18eea319fb9b939f-c59b93"},
    "location of other weights": lambda b: {**b, "location": "tiny-llama--50f4507b056553c0/bfloat16/mesh_1x2"},
    "file path absolute": _with_file(0, path="/etc/passwd"),
    "file path ..": _with_file(0, path="../../../.bashrc"),
    "file path .. inside": _with_file(0, path="layers.0/../../x.tensorbin"),
    "file path backslash": _with_file(0, path="layers.0\\wq.tensorbin"),
    "file path NUL": _with_file(0, path="wq\x00.tensorbin"),
    "file path empty": _with_file(0, path=""),
    "file path a generation record": _with_file(0, path=".generation"),
    "file path a reader lease": _with_file(0, path="layers.0/.readers"),
    "file path a temp name": _with_file(0, path=".wq.tensorbin.tmp.12.ab.0123abcd"),
    "file path too deep": _with_file(0, path="/".join(["d"] * 17) + "/wq.tensorbin"),
    "file path twice": _with_file(0, path="norm.tensorbin"),
    "file where a directory is": _with_file(1, path="layers.0"),
    "digest upper case": _with_file(0, digest="A" * 64),
    "digest short": _with_file(0, digest="a" * 63),
    "digest not hex": _with_file(0, digest="g" * 64),
    "digest a number": _with_file(0, digest=12),
    "size negative": _with_file(0, bytes=-1),
    "size a bool": _with_file(0, bytes=True),
    "size a float": _with_file(0, bytes=1024.0),
    "size absurd": _with_file(0, bytes=1 << 60),
    "no files": _with_marker(lambda m: m.update(files=[])),
    "marker names a generation": _with_marker(lambda m: m.update(generation="g18eea319fb9b939f-c59b93")),
    "marker format_version 5": _with_marker(lambda m: m.update(format_version=5)),
    "marker digest sha256": _with_marker(lambda m: m.update(digest_algorithm="sha256")),
    "marker n_layers negative": _with_marker(lambda m: m.update(n_layers=-2)),
    "marker build_variant too deep": _with_marker(lambda m: m.update(build_variant=_deep(40))),
    "marker variant changed under its key": _with_marker(lambda m: m.update(build_variant={"family": "other"})),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_malformed_manifest_is_refused_with_a_reason(kind):
    case = MALFORMED[kind]
    raw = case if isinstance(case, bytes) else case(_body())
    raw = raw if isinstance(raw, bytes) else json.dumps(raw).encode()
    with pytest.raises(ManifestError) as refused:
        parse_manifest(raw)
    assert str(refused.value)


def test_the_table_covers_at_least_twenty_kinds():
    assert len(MALFORMED) >= 20


def test_a_manifest_reads_back_as_written_with_paths_relative_to_its_build():
    manifest = manifest_of(_marker(), LOCATION)
    again = parse_manifest(manifest_json(manifest), manifest.variant_key)
    assert again == manifest
    assert [f.path for f in again.files] == ["layers.0/wq.tensorbin", "norm.tensorbin", "layers.1/wq.tensorbin"]
    assert all(f.stamp is None for f in again.files) and again.marker.generation is None
    assert again.digests() == {DIGEST_A: 1024, DIGEST_B: 128}  # equal files are one object


def test_a_manifest_stored_under_another_key_is_refused():
    manifest = manifest_of(_marker(), LOCATION)
    with pytest.raises(ManifestError, match="another variant"):
        parse_manifest(manifest_json(manifest), "e" * 64)


def test_the_variant_key_is_the_identity_the_gate_matches():
    base = _marker()
    assert variant_key(base) == variant_key(_marker(generation=None))  # where it was built is not identity
    assert variant_key(base) == variant_key(dataclasses.replace(base, verified_ns=999, build_seconds=3.0))
    for other in ({"n_layers": 3}, {"mesh_shape": "(1, 8)"}, {"content_id": "6" * 64}, {"components": ("attn",)},
                  {"build_variant": {**base.build_variant, "ttnn": "0.82"}}):
        assert variant_key(dataclasses.replace(base, **other)) != variant_key(base), other


def test_keys_are_content_addressed_and_malformed_names_never_become_keys():
    assert object_key(DIGEST_B) == f"objects/blake3/0b/{DIGEST_B}"
    key = "d" * 64
    assert manifests_prefix(key) == f"variants/{key}/manifests/" and latest_key(key) == f"variants/{key}/latest"
    name = new_manifest_name(5)
    assert parse_latest(name.encode() + b"\n") == name and name.startswith("0" * 19 + "5-")
    for bad in ("../" + "a" * 61, "A" * 64, "a" * 65):
        with pytest.raises(ManifestError):
            object_key(bad)
        with pytest.raises(ManifestError):
            latest_key(bad)
    for bad in (b"../../objects/x", b"", b"x" * 300, b"00000000000000000001-zzzzzzzz.json"):
        with pytest.raises(ManifestError):
            parse_latest(bad)
    assert location_key(LOCATION, key) == f"locations/{LOCATION}/{key}"
    assert keys_in([f"locations/{LOCATION}/{key}", f"locations/{LOCATION}/notes.txt", f"locations/x/{key.upper()}"]) == [key]
    for bad in ("../x", "/abs", ".hidden/x", "a//b"):
        with pytest.raises(ManifestError):
            location_key(bad, key)


def test_the_model_key_is_the_model_id_and_the_rest_of_the_variant_identity():
    """A cache-only deploy's key: another model id, layer count, mesh or ttnn is another key; the
    content id is no part of it; a cache of no checkpoint content has none."""
    marker = _marker(None)
    key = model_key_of(marker)
    fields = {"model_id": "org/tiny-llama", "n_layers": 2, "components": None, "variant": marker.identity}
    assert key == model_key(**fields)
    assert model_key_of(dataclasses.replace(marker, content_id="6" * 64)) == key
    for change in ({"model_id": "org/other"}, {"n_layers": 3},
                   {"variant": dataclasses.replace(marker.identity, mesh_shape="(1, 1)")},
                   {"variant": dataclasses.replace(marker.identity, tensorbin_format="other")}):
        assert model_key(**{**fields, **change}) != key, change
    assert model_key_of(dataclasses.replace(marker, content_id=None)) is None
    assert model_index_key(key, "b" * 64) == f"models/{key}/{'b' * 64}"
    assert keys_in([model_index_key(key, "b" * 64), model_index_prefix(key) + "junk"]) == ["b" * 64]
    for bad in ("../x", "B" * 64, ""):
        with pytest.raises(ManifestError):
            model_index_key(bad, "b" * 64)
        with pytest.raises(ManifestError):
            model_index_key(key, bad)
