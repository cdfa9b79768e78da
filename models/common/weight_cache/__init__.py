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

The seed design's public names live on here (``weight_cache_is_complete``,
``mark_weight_cache_complete``, ``marker_path``, ``normalize_mesh_shape``, ``CachedStateDict``,
``build_cached_state_dict``, ``HOST_WEIGHTS_SIDECAR``, ``WEIGHT_CACHE_MARKER``, ...), resolved
lazily so that importing a torch-free module never imports torch through this package. Those
seed functions keep the seed's parameter name ``cache_path``: it is what everything else here
calls ``cache_dir``, one variant's directory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.common.lazy_exports import lazy_exports

_EXPORTS = {
    "layout": (
        "WEIGHT_CACHE_MARKER", "HOST_WEIGHTS_SIDECAR", "TENSORBIN_SUFFIX", "VariantPaths", "CacheRoot",
        "marker_path", "normalize_components", "list_cache_files", "cache_bytes",
    ),
    "variant": ("VariantIdentity", "normalize_mesh_shape", "canonical_variant", "variant_tag"),
    "stamps": ("FileStamp", "StampIndex"),
    "marker": (
        "WEIGHT_CACHE_FORMAT_VERSION", "WeightCacheError", "MarkerFormatError", "WeightCacheMarker", "FileRecord",
        "read_marker", "parse_marker", "marker_json", "weights_identity", "cached_model_config",
    ),
    "gate": ("DEFAULT_FORCE_ENV", "CacheStatus", "weight_cache_status", "verify_weight_cache"),
    "build": ("BuildTransaction",),
    "compat": (
        "weight_cache_is_complete", "mark_weight_cache_complete", "invalidate_weight_cache", "load_host_sidecar",
        "build_cached_state_dict",
    ),
    "warm_read": ("WarmRead",),
    "usage": ("touch_last_used", "last_used"),
    "host_sidecar": ("write_host_sidecar",),
    "models.common.checkpoint": ("checkpoint_name",),  # the seed kept it here; it is the checkpoint module's
    "placeholders": (
        "CachedStateDict", "MissingWeightError", "placeholder", "is_placeholder_tensor",
        "concat", "stack", "fp32_elementwise",
    ),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), _EXPORTS)


if TYPE_CHECKING:  # static analysers see the eager imports
    from models.common.checkpoint import checkpoint_name  # noqa: F401
    from models.common.weight_cache.build import *  # noqa: F403
    from models.common.weight_cache.compat import *  # noqa: F403
    from models.common.weight_cache.gate import *  # noqa: F403
    from models.common.weight_cache.host_sidecar import *  # noqa: F403
    from models.common.weight_cache.layout import *  # noqa: F403
    from models.common.weight_cache.marker import *  # noqa: F403
    from models.common.weight_cache.placeholders import *  # noqa: F403
    from models.common.weight_cache.stamps import *  # noqa: F403
    from models.common.weight_cache.usage import *  # noqa: F403
    from models.common.weight_cache.variant import *  # noqa: F403
    from models.common.weight_cache.warm_read import *  # noqa: F403
