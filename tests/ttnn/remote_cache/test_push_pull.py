# SPDX-License-Identifier: Apache-2.0
"""``tt-cache push`` and ``pull`` through a real S3 server (SeaweedFS) and an HTTP mirror: a variant
pushed from one cache root and pulled into an empty one starts warm with the tensors its cold
build made; an unchanged variant is never sent twice; a corrupt, short or missing object is
refused and nothing of it kept; a store that cannot be used is one line and exit 2."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from models.common.weight_cache import verify_weight_cache
from models.common.weight_cache.build import BuildTransaction
from models.common.weight_cache.layout import VariantPaths
from models.common.weight_cache.marker import WeightCacheError
from models.common.weight_cache.remote.pull import local_status, pull_variant, trusted_manifest
from models.common.weight_cache.remote.push import push_cache_dir
from models.common.weight_cache.remote.store_layout import (
    manifest_json,
    manifests_prefix,
    new_manifest_name,
    object_key,
    parse_manifest,
)
from models.common.weight_cache.remote.stores import HttpStore, StoreIntegrityError
from models.common.weight_cache.remote.urls import open_store
from models.testing.object_store import SECRET_KEY, free_ports, serve_directory
from models.testing.resynthesis_world import requires_root, tmpfs
from models.testing.tiny_models import tensors_of
from models.testing.tt_cache import cli_env, error_line, json_out, tt_cache


def _cli_env(seaweed, cache_root: Path | None = None, **overrides: str) -> dict[str, str]:
    return seaweed.client_env(cli_env(cache_root), **overrides)


def _same_tensors(loaded, original: dict) -> None:
    tensors = tensors_of(loaded)
    assert tensors.keys() == original.keys()
    for name, shards in tensors.items():
        assert all(torch.equal(a, b) for a, b in zip(shards, original[name], strict=True)), name


def _no_pulled_debris(cache_dir: Path) -> None:
    """Nothing warm-looking: no marker, no generation."""
    assert not list(cache_dir.glob(".weights_complete.*")), "a marker was published"
    assert not [p for p in cache_dir.glob("g*") if p.is_dir()], "a generation was left"


def test_push_then_pull_into_an_empty_root_starts_warm_with_the_same_tensors(built_variant, seaweed, s3_url, tmp_path):
    from models.registry import loader_class

    env = _cli_env(seaweed)
    pushed = tt_cache("push", str(built_variant.cache_dir), "--to", s3_url, "--json", "--progress-every", "0", env=env)
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    (variant,) = json_out(pushed)["variants"]
    assert variant["objects_sent"] == variant["objects"] > 0
    assert " objects, " in pushed.stderr and "MiB/s" in pushed.stderr  # the seeding progress lines, non-tty form

    root = tmp_path / "fresh-root"
    pulled = tt_cache("pull", "--from", s3_url, variant["variant_key"], "--json", env=_cli_env(seaweed, root))
    assert pulled.returncode == 0, pulled.stderr[-2000:]
    (document,) = json_out(pulled)["variants"]
    assert document["warm"] and document["objects_fetched"] == variant["objects"]
    cache_dir = Path(document["cache_dir"])
    assert cache_dir == root / built_variant.cache_dir.relative_to(built_variant.cache_root)
    assert verify_weight_cache(VariantPaths(cache_dir, built_variant.marker.build_variant)) == []

    loaded = loader_class("llama")(built_variant.checkpoint, precision="bfloat16", cache_root=root,
                                   mesh_shape=(1, 2)).load()
    assert loaded.warm
    _same_tensors(loaded, built_variant.tensors)

    again = tt_cache("push", str(built_variant.cache_dir), "--to", s3_url, "--json", env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    (second,) = json_out(again)["variants"]
    assert second["objects_sent"] == 0 and second["bytes_sent"] == 0  # an unchanged variant sends nothing
    assert second["manifest"] != variant["manifest"]  # its own manifest: the newest complete one wins


def test_a_second_pull_fetches_nothing_and_a_local_build_is_never_replaced(built_variant, s3_url, tmp_path):
    store = open_store(s3_url)
    (pushed,) = push_cache_dir(built_variant.cache_dir, store)
    key, manifest = trusted_manifest(store, pushed.variant_key)
    first = pull_variant(store, manifest, tmp_path / "root", manifest_key=key)
    second = pull_variant(store, manifest, tmp_path / "root", manifest_key=key)
    assert first.warm and not first.already_warm and second.already_warm and second.bytes_fetched == 0
    source = pull_variant(store, manifest, built_variant.cache_root)
    assert source.already_warm  # the host that built it keeps its own build


@pytest.mark.parametrize("damage", ["flipped byte", "truncated"])
def test_a_damaged_object_in_the_store_is_refused_and_not_kept(damage, built_variant, seaweed, s3_url, tmp_path):
    store = open_store(s3_url)
    (pushed,) = push_cache_dir(built_variant.cache_dir, store)
    key, manifest = trusted_manifest(store, pushed.variant_key)
    victim = max(manifest.files, key=lambda record: record.bytes)
    data = bytearray(b"".join(store.read(object_key(victim.digest))))
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0x01
    else:
        del data[-100:]
    store.write_small(object_key(victim.digest), bytes(data), exclusive=False)  # the store's copy, damaged

    root = tmp_path / "root"
    cache_dir = root / manifest.location
    with pytest.raises(StoreIntegrityError) as refused:
        pull_variant(store, trusted_manifest(store, pushed.variant_key)[1], root)
    expected = "does not hash to its name" if damage == "flipped byte" else "no complete manifest"
    assert expected in str(refused.value)  # truncated: its size is not the manifest's, so the manifest is not trusted
    _no_pulled_debris(cache_dir)
    assert not local_status(VariantPaths(cache_dir, manifest.marker.build_variant), manifest.marker).warm
    staged = cache_dir / ".pulled-objects"
    assert not [p for p in staged.glob("*") if p.name.startswith(victim.digest)] if staged.exists() else True
    result = tt_cache("pull", "--from", s3_url, pushed.variant_key, env=_cli_env(seaweed, root))
    assert result.returncode == 1 and expected in error_line(result, "pull")
    _no_pulled_debris(cache_dir)


def test_clean_removes_what_a_failed_pull_staged_and_nothing_else(built_variant, s3_url, tmp_path):
    from models.tt_cache.clean import clean_cache_tree

    store = open_store(s3_url)
    (pushed,) = push_cache_dir(built_variant.cache_dir, store)
    key, manifest = trusted_manifest(store, pushed.variant_key)
    victim = min(manifest.files, key=lambda record: record.bytes)  # among the last fetched: largest first, one at a time
    data = bytearray(b"".join(store.read(object_key(victim.digest))))
    data[0] ^= 0xFF
    store.write_small(object_key(victim.digest), bytes(data), exclusive=False)
    with pytest.raises(StoreIntegrityError):
        pull_variant(store, manifest, tmp_path / "root", threads=1)
    staging = tmp_path / "root" / manifest.location / ".pulled-objects"
    staged = sorted(p.name for p in staging.iterdir())
    assert staged and victim.digest not in staged and set(staged) <= set(manifest.digests())
    (staging / "notes.txt").write_text("a user's file")
    dry = clean_cache_tree(tmp_path / "root", dry_run=True)
    assert sorted(r.path.name for r in dry.removals if r.kind == "pulled object") == staged
    assert sorted(p.name for p in staging.iterdir()) == sorted([*staged, "notes.txt"])
    report = clean_cache_tree(tmp_path / "root")
    assert sorted(r.path.name for r in report.removals if r.kind == "pulled object") == staged
    assert [p.name for p in staging.iterdir()] == ["notes.txt"]


@requires_root
def test_a_pull_onto_a_full_disk_is_one_line_and_publishes_nothing(built_variant, s3_url, tmp_path, capsys,
                                                                   cli_in_process):
    from models.tt_cache.cli import main

    (pushed,) = push_cache_dir(built_variant.cache_dir, open_store(s3_url))
    with tmpfs(tmp_path / "small", "256k") as root:  # the variant is about 1 MB
        code = main(["pull", "--from", s3_url, pushed.variant_key, "--cache-root", str(root)])
        err = capsys.readouterr().err
        assert code == 2 and "the pull cannot write there (No space left on device)" in err and "Traceback" not in err
        (cache_dir,) = [path.parent for path in root.rglob(".build.lock")]
        _no_pulled_debris(cache_dir)


def test_a_manifest_naming_a_missing_object_is_not_trusted_and_the_newest_complete_one_wins(built_variant, s3_url):
    store = open_store(s3_url)
    (pushed,) = push_cache_dir(built_variant.cache_dir, store)
    key, manifest = trusted_manifest(store, pushed.variant_key)
    records = list(manifest.marker.files)
    records[0] = dataclasses.replace(records[0], digest="e" * 64)  # an object nobody stored
    newer = dataclasses.replace(manifest, pushed_ns=manifest.pushed_ns + 10**9,
                                marker=dataclasses.replace(manifest.marker, files=tuple(records)))
    raw = manifest_json(newer)
    assert parse_manifest(raw, pushed.variant_key)  # well formed: only the store's content is wrong
    newer_key = manifests_prefix(pushed.variant_key) + new_manifest_name(newer.pushed_ns)
    store.write_small(newer_key, raw, exclusive=True)
    chosen, _ = trusted_manifest(store, pushed.variant_key)
    assert chosen == key  # the newest manifest names a missing object: the older complete one wins
    store.client.delete_object(Bucket=store.bucket, Key=store._key(key))
    with pytest.raises(StoreIntegrityError, match="lacks"):
        trusted_manifest(store, pushed.variant_key)


def test_the_http_mirror_round_trip(built_variant, tmp_path):
    mirror = tmp_path / "mirror"
    (pushed,) = push_cache_dir(built_variant.cache_dir, open_store(str(mirror), create=True))
    assert (mirror / "variants" / pushed.variant_key / "latest").read_text() == pushed.manifest.rpartition("/")[2]
    with serve_directory(mirror) as http:
        store = open_store(f"{http.url}/")
        assert isinstance(store, HttpStore)
        key, manifest = trusted_manifest(store, pushed.variant_key)
        result = pull_variant(store, manifest, tmp_path / "root", manifest_key=key)
    assert result.warm and result.objects_fetched == pushed.objects
    assert verify_weight_cache(VariantPaths(result.cache_dir, manifest.marker.build_variant)) == []


def test_two_pushers_of_one_variant_at_once_both_publish_complete_manifests(built_variant, s3_url, tmp_path):
    results: list = []
    errors: list = []

    def push() -> None:
        try:
            results.extend(push_cache_dir(built_variant.cache_dir, open_store(s3_url), threads=2))
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    pushers = [threading.Thread(target=push) for _ in range(2)]
    for pusher in pushers:
        pusher.start()
    for pusher in pushers:
        pusher.join()
    assert not errors and len(results) == 2
    store = open_store(s3_url)
    manifests = store.list_sizes(manifests_prefix(results[0].variant_key))
    assert len(manifests) == 2
    assert len(store.list_sizes("objects/")) == results[0].objects  # each object stored once
    key, manifest = trusted_manifest(store, results[0].variant_key)
    assert key == max(manifests)
    assert pull_variant(store, manifest, tmp_path / "root").warm


def test_a_store_that_cannot_be_used_is_one_line_and_exit_2(built_variant, seaweed, s3_url, tmp_path, monkeypatch,
                                                            capsys, cli_in_process):
    from models.tt_cache.cli import main

    (dead_port,) = free_ports(1)
    key = "a" * 64
    variant = str(built_variant.cache_dir)
    cases = {
        "unknown bucket": (["push", variant, "--to", "s3://no-such-bucket/x"], {}, "no such bucket"),
        "wrong credentials": (["pull", "--from", s3_url, key], {"AWS_SECRET_ACCESS_KEY": SECRET_KEY + "x"},
                              "refused the credentials"),
        "unreachable endpoint": (["push", variant, "--to", s3_url, "--endpoint-url", f"http://127.0.0.1:{dead_port}"],
                                 {}, "cannot reach"),
        "unreachable mirror": (["pull", "--from", f"http://127.0.0.1:{dead_port}/m", key], {}, "cannot reach"),
        "push to a mirror": (["push", variant, "--to", f"http://127.0.0.1:{dead_port}/m"], {}, "read-only"),
        "not a variant key": (["pull", "--from", s3_url, "latest"], {}, "neither a variant key nor a dir"),
        "no such variant dir": (["push", str(tmp_path / "nowhere"), "--to", s3_url], {}, "no such directory"),
        "pull: unknown bucket": (["pull", "--from", "s3://no-such-bucket/x", key], {}, "no such bucket"),
        "pull: unreachable endpoint": (["pull", "--from", s3_url, key, "--endpoint-url",
                                        f"http://127.0.0.1:{dead_port}"], {}, "cannot reach"),
        "pull: no credentials": (["pull", "--from", s3_url, key],
                                 {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}, "no AWS credentials"),
        "pull by dir: wrong credentials": (["pull", "--from", s3_url, str(tmp_path / "root" / "m--0123456789abcdef")],
                                           {"AWS_SECRET_ACCESS_KEY": SECRET_KEY + "x"}, "refused the credentials"),
        "push: wrong credentials": (["push", variant, "--to", s3_url], {"AWS_SECRET_ACCESS_KEY": SECRET_KEY + "x"},
                                    "refused the credentials"),
    }
    for name, (argv, extra, message) in cases.items():  # main() in this process: the same code, faster
        with monkeypatch.context() as patch:
            for variable, value in extra.items():
                patch.setenv(variable, value) if value is not None else patch.delenv(variable)
            started = time.monotonic()
            code = main([*argv, "--cache-root", str(tmp_path / "root")] if argv[0] == "pull" else argv)
        out, err = capsys.readouterr()
        lines = [line for line in err.splitlines() if line.startswith(f"tt-cache {argv[0]}: ")]
        assert code == 2 and len(lines) == 1 and message in lines[0], (name, err)
        assert "Traceback" not in err and SECRET_KEY not in out + err, name
        assert time.monotonic() - started < 10, name  # refused at the first request: no transfer to retry
    assert not (tmp_path / "root").exists() or not list((tmp_path / "root").rglob(".weights_complete.*"))
    wrong = _cli_env(seaweed, AWS_SECRET_ACCESS_KEY=SECRET_KEY + "x")  # and once as a user runs it
    result = tt_cache("pull", "--from", s3_url, key, "--json", env=wrong)
    assert result.returncode == 2 and "refused the credentials" in error_line(result, "pull")
    assert json.loads(result.stdout)["exit_code"] == 2 and SECRET_KEY not in result.stdout + result.stderr


def test_a_build_given_other_bytes_than_expected_publishes_nothing(built_variant, tmp_path):
    marker = built_variant.marker
    paths = VariantPaths(tmp_path / "variant", marker.build_variant)
    paths.cache_dir.mkdir()
    with pytest.raises(WeightCacheError, match="not the file"), BuildTransaction(paths) as build:
        root = build.open_generation()
        (root / "w.tensorbin").write_bytes(b"other bytes")
        build.commit(dataclasses.replace(marker, files=()), ["w.tensorbin"], expected={"w.tensorbin": "0" * 64})
    _no_pulled_debris(paths.cache_dir)


def _bytes_read() -> int:
    """What this process read through read(2) and its kind so far (``rchar``: page cache included)."""
    return int(dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())["rchar"])


def test_a_pull_reads_each_object_once_the_seal_stamps_what_it_hashed_as_written(built_variant, tmp_path):
    mirror = tmp_path / "mirror"
    (pushed,) = push_cache_dir(built_variant.cache_dir, open_store(str(mirror), create=True))
    store = open_store(str(mirror))
    _, manifest = trusted_manifest(store, pushed.variant_key)
    pull_variant(store, manifest, tmp_path / "first")  # imports and first-use reads out of the count
    before = _bytes_read()
    result = pull_variant(store, manifest, tmp_path / "second")
    read = _bytes_read() - before
    assert result.warm and result.bytes_fetched == manifest.total_bytes
    assert manifest.total_bytes <= read < 1.5 * manifest.total_bytes, (read, manifest.total_bytes)
    assert verify_weight_cache(VariantPaths(result.cache_dir, manifest.marker.build_variant)) == []  # the stamps vouch for it


def test_pull_by_manifest_from_the_store_or_a_file(built_variant, s3_url, tmp_path, capsys, cli_in_process):
    from models.tt_cache.cli import main

    store = open_store(s3_url)
    (pushed,) = push_cache_dir(built_variant.cache_dir, store)
    local = tmp_path / "manifest.json"
    local.write_bytes(store.read_small(pushed.manifest, 1 << 20))
    for number, name in enumerate([pushed.manifest, str(local)]):
        code = main(["pull", "--from", s3_url, "--manifest", name, "--cache-root", str(tmp_path / f"root{number}"),
                     "--json"])
        (document,) = json.loads(capsys.readouterr().out)["variants"]
        assert code == 0 and document["warm"] and document["objects_fetched"] == pushed.objects, name
    local.write_text('{"manifest_version": 1}')
    code = main(["pull", "--from", s3_url, "--manifest", str(local), "--cache-root", str(tmp_path / "root2")])
    assert code == 2 and "not a manifest: " in capsys.readouterr().err
    assert main(["pull", "--from", s3_url, pushed.variant_key, "--manifest", str(local)]) == 2


def test_a_variant_that_is_not_warm_is_never_pushed(built_variant, s3_url, tmp_path, capsys, cli_in_process):
    import shutil

    from models.tt_cache.cli import main

    copy = tmp_path / "copy" / built_variant.cache_dir.relative_to(built_variant.cache_root)
    shutil.copytree(built_variant.cache_dir, copy, symlinks=True)
    victim = copy / max(built_variant.marker.files, key=lambda record: record.bytes).path
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only its digest tells
    victim.write_bytes(bytes(data))
    assert main(["push", str(copy), "--to", s3_url]) == 1
    assert "cold (tensorbin" in capsys.readouterr().err
    assert main(["push", str(tmp_path), "--to", s3_url]) == 1  # no marker at all
    assert "no completion marker" in capsys.readouterr().err
    assert open_store(s3_url).list_sizes("") == {}  # nothing was sent


def test_pull_by_the_model_or_variant_dir_it_was_pushed_from(built_variant, s3_url, tmp_path, capsys, cli_in_process):
    from models.tt_cache.cli import main

    store = open_store(s3_url)
    (pushed,) = push_cache_dir(built_variant.cache_dir, store)
    location = built_variant.cache_dir.relative_to(built_variant.cache_root)
    for number, target in enumerate([location, location.parts[0]]):  # the variant dir, then its model dir
        root = tmp_path / f"root{number}"
        code = main(["pull", "--from", s3_url, str(root / target), "--cache-root", str(root), "--json"])
        document = json.loads(capsys.readouterr().out)
        assert code == 0 and document["warm"], target
        assert [v["variant_key"] for v in document["variants"]] == [pushed.variant_key]
        assert Path(document["variants"][0]["cache_dir"]) == root / location
    for target, message in [(tmp_path / "root0" / "other--0123456789abcdef", "no variant was pushed from"),
                            (tmp_path / "elsewhere", "neither a variant key nor a dir under the cache root")]:
        code = main(["pull", "--from", s3_url, str(target), "--cache-root", str(tmp_path / "root0")])
        assert code in (1, 2) and message in capsys.readouterr().err, target
