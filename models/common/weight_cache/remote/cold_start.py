# SPDX-License-Identifier: Apache-2.0
"""A cold start that asks the shared store first: with ``$TT_CACHE_REMOTE`` set, a loader whose cache
is cold pulls its exact variant (the key of :func:`~.store_layout.variant_identity`) and starts warm.

Never in the way: an unset variable, a store without the variant, a checkpoint whose content id is
unknown, or any failure of the store or of the pull (one log line) leaves the loader to build cold
as it would have; and the pulled cache is warm only if the loader's own gate then says so. Each ask
is recorded (:func:`~.after_build.record_ask`) for a caller that reports the store's hits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loguru import logger

from models.common import envs
from models.common.weight_cache.remote.after_build import HIT, MISS, UNAVAILABLE, record_ask
from models.common.weight_cache.remote.pull import pull_variant, trusted_manifest
from models.common.weight_cache.remote.store_layout import identity_key
from models.common.weight_cache.remote.stores import ObjectMissing, RemoteStoreError
from models.common.weight_cache.remote.urls import open_store
from models.common.weight_cache.variant import VariantIdentity


def pull_on_cold_start(cache_dir: Path, *, model_name: str, content_id: str | None, n_layers: int, mesh_shape: Any,
                       components: Any, build_variant: Any) -> bool:
    """Pull this exact variant into ``cache_dir`` from ``$TT_CACHE_REMOTE``; whether it is warm now.
    The variant is this process's (its ttnn version and the tensorbin format it writes, probed)."""
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
        why = str(error) if isinstance(error, RemoteStoreError) else f"{type(error).__name__}: {error}"
        logger.warning(f"{model_name}: pulling variant {key[:16]} from {url} failed ({why}); building cold")
        record_ask(UNAVAILABLE)
        return False
    record_ask(HIT if result.warm else UNAVAILABLE, result.bytes_fetched)
    logger.info(f"{model_name}: {result.summary()}")
    return result.warm
