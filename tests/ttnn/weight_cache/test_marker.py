# SPDX-License-Identifier: Apache-2.0
"""The marker is data, validated as data.

``parse_marker`` raises only :class:`MarkerFormatError` on any bytes, and the gate answers cold
(never raises) on any marker that is not a valid record of a complete build.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from models.common import weight_cache as wc
from models.common.weight_cache.marker import MAX_MARKER_BYTES, MarkerFormatError, parse_marker
from models.common.fileio import atomic_write_bytes
from models.testing import weight_cache_seeder as seeder


def gate(root: Path) -> wc.CacheStatus:
    return wc.weight_cache_status(wc.VariantPaths(root), **seeder.gate_kwargs())


def publish_marker(root: Path, raw: bytes) -> None:
    atomic_write_bytes(wc.marker_path(root), raw, durable=False)


@pytest.fixture(scope="module")
def valid_marker(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """A real seeded cache (shared by the module's tests, which only replace its marker) and its marker body."""
    root = tmp_path_factory.mktemp("marker") / "cache"
    root.mkdir()
    state_dict = seeder.make_state_dict()
    seeder.build_cache(root, state_dict)
    assert seeder.mark(root, state_dict)
    return root, json.loads(wc.marker_path(root).read_bytes())


@pytest.fixture
def cache_with_marker(valid_marker):
    """Yields (root, a deep copy of the valid body); the valid marker is put back afterwards."""
    root, body = valid_marker
    yield root, copy.deepcopy(body)
    publish_marker(root, json.dumps(body).encode())


def test_the_valid_marker_parses_and_the_gate_is_warm(cache_with_marker) -> None:
    root, body = cache_with_marker
    marker = parse_marker(json.dumps(body).encode())
    assert marker.model_name == seeder.MODEL_NAME and marker.n_layers == seeder.N_LAYERS
    assert marker.model_config == seeder.MODEL_CONFIG
    assert gate(root).warm


def _set(path: tuple, value: Any):
    def mutate(body: dict) -> None:
        target = body
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return mutate


def _delete(name: str):
    return lambda body: body.pop(name)


BAD_BODIES = {
    "absolute path": _set(("files", 0, "path"), "/etc/passwd"),
    "dotdot path": _set(("files", 0, "path"), "../outside.tensorbin"),
    "dotdot inside": _set(("files", 0, "path"), "layers.0/../../outside.tensorbin"),
    "dot segment": _set(("files", 0, "path"), "./norm.tensorbin"),
    "empty segment": _set(("files", 0, "path"), "layers.0//wq.tensorbin"),
    "empty path": _set(("files", 0, "path"), ""),
    "backslash path": _set(("files", 0, "path"), "..\\outside.tensorbin"),
    "NUL in path": _set(("files", 0, "path"), "norm\x00.tensorbin"),
    "lone surrogate in path": _set(("files", 0, "path"), "norm\ud800.tensorbin"),
    "path not a string": _set(("files", 0, "path"), ["norm.tensorbin"]),
    "size negative": _set(("files", 0, "bytes"), -1),
    "size absurd": _set(("files", 0, "bytes"), 1 << 62),
    "size a float": _set(("files", 0, "bytes"), 4480.0),
    "size a bool": _set(("files", 0, "bytes"), True),
    "size a string": _set(("files", 0, "bytes"), "4480"),
    "digest uppercase": _set(("files", 0, "digest"), "A" * 64),
    "digest short": _set(("files", 0, "digest"), "ab"),
    "file record a list": _set(("files", 0), ["norm.tensorbin", 1, "0" * 64]),
    "owned a string": _set(("files", 0, "owned"), "false"),
    "owned an int": _set(("files", 0, "owned"), 0),
    "owned null": _set(("files", 0, "owned"), None),
    "files empty": _set(("files",), []),
    "files an object": _set(("files",), {}),
    "no files": _delete("files"),
    "format_version 3": _set(("format_version",), 3),
    "format_version float": _set(("format_version",), 4.0),
    "format_version string": _set(("format_version",), "4"),
    "format_version 6": _set(("format_version",), 6),
    "no ttnn_version": _delete("ttnn_version"),
    "no tensorbin_format": _delete("tensorbin_format"),
    "ttnn_version int": _set(("ttnn_version",), 81),
    "ttnn_version empty": _set(("ttnn_version",), ""),
    "tensorbin_format absurd": _set(("tensorbin_format",), "f" * 4096),
    "tensorbin_format a newline": _set(("tensorbin_format",), "flatbuffer\n-d384"),
    "n_layers string": _set(("n_layers",), "2"),
    "n_layers bool": _set(("n_layers",), True),
    "n_layers negative": _set(("n_layers",), -2),
    "n_layers absurd": _set(("n_layers",), 10**30),
    "model_name int": _set(("model_name",), 7),
    "mesh_shape list": _set(("mesh_shape",), [1, 2]),
    "components string": _set(("components",), "all"),
    "components of ints": _set(("components",), [1]),
    "is_moe string": _set(("is_moe",), "false"),
    "digest_algorithm sha1": _set(("digest_algorithm",), "sha1"),
    "weights empty": _set(("weights",), {}),
    "weights a list": _set(("weights",), []),
    "weight spec short": _set(("weights", "norm.weight"), [[32, 64]]),
    "weight shape negative": _set(("weights", "norm.weight"), [[-32, 64], "torch.bfloat16"]),
    "weight shape float": _set(("weights", "norm.weight"), [[32.0, 64], "torch.bfloat16"]),
    "weight shape overflows": _set(("weights", "norm.weight"), [[1 << 40] * 4, "torch.bfloat16"]),
    "weight dtype unknown": _set(("weights", "norm.weight"), [[32, 64], "torch.bfloat17"]),
    "weight dtype not torch": _set(("weights", "norm.weight"), [[32, 64], "bfloat16"]),
    "host_weights without sidecar": _set(("host_sidecar",), None),
    "sidecar path absolute": _set(("host_sidecar", "path"), "/tmp/evil.safetensors"),
    "host_weights a string": _set(("host_weights",), "tok_embeddings.weight"),
    "model_info a list": _set(("model_info",), []),
    "model_config a string": _set(("model_config",), "{}"),
}


@pytest.mark.parametrize("mutation", list(BAD_BODIES), ids=list(BAD_BODIES))
def test_a_bad_field_is_a_format_error_and_the_gate_says_cold(cache_with_marker, mutation: str) -> None:
    root, body = cache_with_marker
    BAD_BODIES[mutation](body)
    raw = json.dumps(body).encode()
    with pytest.raises(MarkerFormatError):
        parse_marker(raw)
    publish_marker(root, raw)
    result = gate(root)
    assert not result.warm and "invalid" in result.reason


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xff\xfe{}",
        b'{"format_version": 4, "model_name": "\xc3\x28"}',
        b"\xef\xbb\xbf{}",
        b"null",
        b"[]",
        b'{"format_version": NaN}',
        b'{"format_version": Infinity}',
        b"[" * 100_000 + b"]" * 100_000,
        b'{"n_layers": ' + b"9" * 5000 + b"}",
        b'{"format_version": 4',
    ],
    ids=[
        "empty", "utf16 bom", "bad utf8", "utf8 bom", "null", "list", "nan", "infinity",
        "deep nesting", "huge int", "truncated",
    ],
)
def test_garbage_bytes_are_a_format_error_and_the_gate_says_cold(cache_with_marker, raw: bytes) -> None:
    root, _ = cache_with_marker
    with pytest.raises(MarkerFormatError):
        parse_marker(raw)
    publish_marker(root, raw)
    assert not gate(root).warm


def test_a_truncated_real_marker_is_cold_at_every_length(cache_with_marker) -> None:
    root, body = cache_with_marker
    raw = json.dumps(body).encode()
    for cut in range(0, len(raw), max(1, len(raw) // 97)):
        with pytest.raises(MarkerFormatError):
            parse_marker(raw[:cut])


def test_an_unreadable_marker_is_cold_not_an_error(cache_with_marker) -> None:
    root, _ = cache_with_marker
    marker = wc.marker_path(root)
    marker.unlink()
    marker.mkdir()  # open() of a directory fails with an OSError that is not FileNotFoundError
    try:
        result = gate(root)
        assert not result.warm and "cannot read marker" in result.reason
    finally:
        marker.rmdir()


def test_an_oversized_marker_is_rejected_before_parsing() -> None:
    with pytest.raises(MarkerFormatError, match="more than"):
        parse_marker(b" " * (MAX_MARKER_BYTES + 1))


# --------------------------------------------------------------------------------------------
# property-based: any bytes, any mutated valid marker
# --------------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)

PROPERTY_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _paths(body: Any, prefix: tuple = ()) -> list[tuple]:
    """Every addressable location in a JSON body (dict keys and list indices)."""
    found = [prefix] if prefix else []
    if isinstance(body, dict):
        for key, value in body.items():
            found += _paths(value, prefix + (key,))
    elif isinstance(body, list):
        for index, value in enumerate(body[:3]):
            found += _paths(value, prefix + (index,))
    return found


@PROPERTY_SETTINGS
@given(raw=st.binary(max_size=2048))
def test_parse_marker_raises_only_format_errors_on_any_bytes(raw: bytes) -> None:
    try:
        parse_marker(raw)
    except MarkerFormatError:
        pass


@PROPERTY_SETTINGS
@given(data=st.data())
def test_parse_marker_and_gate_on_a_structurally_mutated_valid_marker(cache_with_marker, data) -> None:
    root, original = cache_with_marker
    body = copy.deepcopy(original)
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = _paths(body)
        if not paths:
            break
        path = data.draw(st.sampled_from(paths), label="where")
        parent = body
        for step in path[:-1]:
            parent = parent[step]
        if data.draw(st.booleans(), label="delete") and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = data.draw(json_values, label="value")
    raw = json.dumps(body).encode()
    try:
        parse_marker(raw)
    except MarkerFormatError:
        pass
    publish_marker(root, raw)
    result = gate(root)  # must not raise, whatever the marker says
    assert isinstance(result, wc.CacheStatus)
    if result.warm:  # a mutation the gate accepts must still describe the real cache
        assert seeder.cache_mismatches(root) == []


@PROPERTY_SETTINGS
@given(data=st.data())
def test_parse_marker_and_gate_on_byte_mutated_valid_marker(cache_with_marker, data) -> None:
    root, original = cache_with_marker
    raw = bytearray(json.dumps(original).encode())
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        position = data.draw(st.integers(0, len(raw) - 1), label="position")
        action = data.draw(st.sampled_from(["flip", "delete", "insert", "truncate"]), label="action")
        if action == "flip":
            raw[position] ^= data.draw(st.integers(1, 255), label="mask")
        elif action == "delete":
            del raw[position]
        elif action == "insert":
            raw[position:position] = data.draw(st.binary(min_size=1, max_size=4), label="bytes")
        else:
            del raw[position:]
        if not raw:
            break
    try:
        parse_marker(bytes(raw))
    except MarkerFormatError:
        pass
    publish_marker(root, bytes(raw))
    assert isinstance(gate(root), wc.CacheStatus)


@PROPERTY_SETTINGS
@given(path=st.text(max_size=40))
def test_a_recorded_path_is_accepted_only_if_relative_and_inside(cache_with_marker, path: str) -> None:
    root, body = cache_with_marker
    body["files"][0]["path"] = path
    try:
        marker = parse_marker(json.dumps(body).encode())
    except MarkerFormatError:
        return
    accepted = marker.files[0].path
    resolved = os.path.normpath(os.path.join("/cache", accepted))
    assert resolved.startswith("/cache/") and ".." not in accepted.split("/")
    accepted.encode("utf-8")  # the gate will stat it: it must be encodable
    publish_marker(root, json.dumps(body).encode())
    assert isinstance(gate(root), wc.CacheStatus)
