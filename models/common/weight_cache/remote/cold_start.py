# SPDX-License-Identifier: Apache-2.0
"""A cold start that asks the shared store first: with ``$TT_CACHE_REMOTE`` set, a loader whose cache
is cold pulls its exact variant (the key of :func:`~.store_layout.variant_identity`) and starts warm.

A cache-only deploy (no checkpoint weights, so no content id) asks by its model id instead: the
variants indexed under its model key (:func:`~.store_layout.model_identity`), each proved by its
manifest, and pulls the newest into the dir its content id has under the local cache root, where
the cache-only load then finds it by its marker as it finds a local one. Variants of several
content ids under one model id are an error that lists them, as several local caches are.

Never in the way: an unset variable, a store without the variant, or any failure of the store or
of the pull (one log line) leaves the loader to build cold as it would have; and the pulled cache is
warm only if the loader's own gate then says so. Each ask is recorded
(:func:`~.after_build.record_ask`) for a caller that reports the store's hits.

A cache-only deploy has no cold build to fall back to, so the rule there is: **the store's answer is
the deploy's error**. :func:`pull_cache_only` returns why the store did not make it warm in one line
that says what to do (push the variant from where the weights are) or what failed, and
the loader raises it (:class:`StoreCannotServe`) in place of the error it gives without a store.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from loguru import logger

from models.common import envs
from models.common.checkpoint import CheckpointError
from models.common.weight_cache.layout import VariantPaths
from models.common.weight_cache.remote.after_build import HIT, MISS, UNAVAILABLE, record_ask
from models.common.weight_cache.remote.pull import pull_variant, trusted_manifest, trusted_manifests_of_model
from models.common.weight_cache.remote.store_layout import identity_key, model_key
from models.common.weight_cache.remote.stores import ObjectMissing, RemoteStoreError
from models.common.weight_cache.remote.urls import open_store
from models.common.weight_cache.variant import VariantIdentity


class StoreCannotServe(CheckpointError):
    """A cache-only deploy with no cache here that the shared store did not make warm: the message
    is the store's answer and what to do, complete as it is."""


def pull_on_cold_start(paths: VariantPaths, *, model_name: str, content_id: str | None, n_layers: int,
                       mesh_shape: Any, components: Any) -> bool:
    """Pull this exact variant into ``paths.cache_dir`` from ``$TT_CACHE_REMOTE``; whether it is warm
    now. The variant is this process's (its ttnn version and the tensorbin format it writes, probed)."""
    cache_dir, build_variant = paths.cache_dir, paths.build_variant
    url = envs.TT_CACHE_REMOTE
    if not url or content_id is None:
        return False
    key = identity_key(content_id=content_id, model_name=model_name, n_layers=n_layers, components=components,
                       variant=VariantIdentity.here(build_variant, mesh_shape, probe=True))
    try:
        store = open_store(url)
        manifest_key, manifest = trusted_manifest(store, key)
        result = pull_variant(store, manifest, cache_dir.parent, manifest_key=manifest_key, into=cache_dir)
    except ObjectMissing:
        record_ask(MISS)
        logger.info(f"{model_name}: the shared store {url} has no variant {key[:16]}; building cold")
        return False
    except Exception as error:  # noqa: BLE001 - a cold start is never worse for the store being there
        logger.warning(f"{model_name}: pulling variant {key[:16]} from {url} failed ({_why(error)}); building cold")
        record_ask(UNAVAILABLE)
        return False
    record_ask(HIT if result.warm else UNAVAILABLE, result.bytes_fetched)
    logger.info(f"{model_name}: {result.summary()}")
    return result.warm


def pull_cache_only(place: Callable[[str], Path], *, model_id: str, n_layers: int, mesh_shape: Any, components: Any,
                    build_variant: Any) -> str | None:
    """Pull the newest variant of ``model_id`` that this process can load from ``$TT_CACHE_REMOTE``
    into ``place(content id)``. None when it is warm now, else why not: one line naming what to do.
    Several content ids: :class:`CheckpointError`."""
    url = envs.TT_CACHE_REMOTE
    if not url:
        return "no shared store is set (TT_CACHE_REMOTE)"
    identity = VariantIdentity.here(build_variant, mesh_shape, probe=True)
    key = model_key(model_id=model_id, n_layers=n_layers, components=components, variant=identity)
    try:
        store = open_store(url)
        found = trusted_manifests_of_model(store, key)
    except Exception as error:  # noqa: BLE001 - the deploy is no worse for the store being there
        logger.warning(f"{model_id}: asking {url} for its variants failed ({_why(error)})")
        record_ask(UNAVAILABLE)
        return f"the shared store TT_CACHE_REMOTE={url} could not be asked for it ({_one_line(_why(error))})"
    if not found:
        record_ask(MISS)
        logger.info(f"{model_id}: the shared store {url} has no variant of this model id for this host ({key[:16]})")
        return (f"the shared store TT_CACHE_REMOTE={url} has no variant of {model_id} for this host (ttnn "
                f"{identity.ttnn_version}, model key {key[:16]}); build it where the weights are and push it there "
                f"(tt-cache push VARIANT_DIR --to {url}, or TT_CACHE_REMOTE_PUSH=1 on that build)")
    contents = {manifest.marker.content_id for _, manifest in found}
    if len(contents) > 1:
        listed = "\n  ".join(f"{m.variant_key}  {m.location}" for _, m in sorted(found, key=lambda f: f[1].location))
        raise CheckpointError(
            f"{model_id}: no checkpoint weights on this machine and the shared store {url} holds {len(contents)} "
            f"variants of it built from different weights; pull one with tt-cache pull --from {url} KEY:\n  {listed}")
    manifest_key, manifest = max(found, key=lambda item: item[1].pushed_ns)
    cache_dir = place(manifest.marker.content_id)
    try:
        result = pull_variant(store, manifest, cache_dir.parent, manifest_key=manifest_key, into=cache_dir)
    except Exception as error:  # noqa: BLE001
        logger.warning(f"{model_id}: pulling variant {manifest.variant_key[:16]} from {url} failed ({_why(error)})")
        record_ask(UNAVAILABLE)
        return (f"pulling variant {manifest.variant_key[:16]} from the shared store TT_CACHE_REMOTE={url} failed "
                f"({_one_line(_why(error))}); nothing of it was kept: start again, or push the variant again")
    record_ask(HIT if result.warm else UNAVAILABLE, result.bytes_fetched)
    logger.info(f"{model_id}: {result.summary()}")
    return None if result.warm else f"the variant pulled from {url} is not warm here ({result.reason})"


def _why(error: Exception) -> str:
    return str(error) if isinstance(error, RemoteStoreError) else f"{type(error).__name__}: {error}"


def _one_line(text: str) -> str:
    return " ".join(text.split())
