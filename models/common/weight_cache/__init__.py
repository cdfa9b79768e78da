# SPDX-License-Identifier: Apache-2.0
"""The warm ttnn weight cache: build a model from its ``.tensorbin`` files alone, never from a
cache that is incomplete, stale, corrupted or not this checkpoint's.

Modules, from the bottom up (the first seven import neither torch nor ttnn, so the tools that only
look at caches start in milliseconds):

``variant``       a variant's identity (build variant, mesh, ttnn version, tensorbin format), one object
``layout``        every name and path of a cache; :class:`VariantPaths`, one variant's paths
``stamps``        :class:`FileStamp`, the racy-clock rule, the bounded :class:`StampIndex`
``marker``        the completion marker's format, parsed and validated as data
``identity``      a checkpoint's content id (hub blobs verified, every shard the index names)
``gate``          the stat-fast, hash-sure completeness gate; deep verify
``generations``   the build lock, generations and their ownership records, leases, retirement
``usage``         when a variant was last used (gc's LRU)
``build``         the one build transaction
``verified_open`` a cache file opened once, proved to be the one verified, served as a sealed copy
``compat``        the seed design's API (marking a build complete, the gate's bool, the warm state dict)
``host_sidecar``  the real host weights of a warm build (torch)
``placeholders``  the warm ``state_dict`` of storage-free placeholders (torch)
``tensor_cache``  ``ttnn.as_tensor`` through the cache: mesh shards, atomic writes, checked loads (ttnn)
``warm_read``     the one warm read: gate, lease, every file checked against the gate, usage (ttnn)

The package's face is small: the seed design's public names, with the seed's signatures
(``weight_cache_is_complete``, ``mark_weight_cache_complete``, ``build_cached_state_dict``,
``load_host_sidecar``, ``marker_path``, ``list_cache_files``, ``normalize_mesh_shape``,
``checkpoint_name``, ``CachedStateDict`` and the four constants), and the project's most used
names (a variant's paths, its marker, the gate, deep verify, the build and the warm read). Every
other name is imported from the module that defines it, so each name has one import path. Names
resolve lazily, so importing a torch-free module never imports torch through this package. The
seed functions keep the seed's parameter name ``cache_path``: it is what everything else here
calls ``cache_dir``, one variant's directory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.common.lazy_exports import lazy_exports

SEED_NAMES = {  # the seed design's public names, with its signatures (see compat)
    "layout": ("WEIGHT_CACHE_MARKER", "HOST_WEIGHTS_SIDECAR", "marker_path", "list_cache_files"),
    "variant": ("normalize_mesh_shape",),
    "marker": ("WEIGHT_CACHE_FORMAT_VERSION",),
    "gate": ("DEFAULT_FORCE_ENV",),
    "compat": ("weight_cache_is_complete", "mark_weight_cache_complete", "load_host_sidecar", "build_cached_state_dict"),
    "placeholders": ("CachedStateDict",),
    "models.common.checkpoint": ("checkpoint_name",),  # the seed kept it here; it is the checkpoint module's
}
PROJECT_NAMES = {  # the project's most used
    "layout": ("VariantPaths", "CacheRoot"),
    "marker": ("WeightCacheError", "WeightCacheMarker", "read_marker"),
    "gate": ("CacheStatus", "weight_cache_status", "verify_weight_cache"),
    "compat": ("invalidate_weight_cache",),
    "build": ("BuildTransaction",),
    "warm_read": ("WarmRead",),
}
_EXPORTS = {module: (*SEED_NAMES.get(module, ()), *PROJECT_NAMES.get(module, ()))
            for module in (*SEED_NAMES, *PROJECT_NAMES)}
__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), _EXPORTS)


if TYPE_CHECKING:  # static analysers see the eager imports
    from models.common.checkpoint import checkpoint_name  # noqa: F401
    from models.common.weight_cache.build import BuildTransaction  # noqa: F401
    from models.common.weight_cache.compat import (  # noqa: F401
        build_cached_state_dict,
        invalidate_weight_cache,
        load_host_sidecar,
        mark_weight_cache_complete,
        weight_cache_is_complete,
    )
    from models.common.weight_cache.gate import (  # noqa: F401
        DEFAULT_FORCE_ENV,
        CacheStatus,
        verify_weight_cache,
        weight_cache_status,
    )
    from models.common.weight_cache.layout import (  # noqa: F401
        HOST_WEIGHTS_SIDECAR,
        WEIGHT_CACHE_MARKER,
        CacheRoot,
        VariantPaths,
        list_cache_files,
        marker_path,
    )
    from models.common.weight_cache.marker import (  # noqa: F401
        WEIGHT_CACHE_FORMAT_VERSION,
        WeightCacheError,
        WeightCacheMarker,
        read_marker,
    )
    from models.common.weight_cache.placeholders import CachedStateDict  # noqa: F401
    from models.common.weight_cache.variant import normalize_mesh_shape  # noqa: F401
    from models.common.weight_cache.warm_read import WarmRead  # noqa: F401
