# SPDX-License-Identifier: Apache-2.0
"""A durable, content-addressed cache of frozen-backbone prefill features.

In resynthesis training the parent (backbone) model is frozen, so the prefill of a prompt yields
the same features at every step, epoch and decode-arm reset. They are kept twice:

* :class:`BaseForwardCache` - an in-process LRU of complete prefill outputs in (pinned) CPU
  memory; hits are read-only views (``memory``).
* :class:`FrozenBackboneFeatureSidecar` - one durable object per prompt on disk, shared by every
  later step, process and run on the host, and never read back wrong (``sidecar``).

Modules, from the bottom up:

``layout``       the on-disk format and its checks, without torch (the CLI imports only this,
                 ``usage`` and ``maintenance``, so ``tt-cache prefill`` starts in milliseconds)
``identity``     the authority: every input that can change the features, hashed canonically
``packet``       the rows a producer stores and a lookup returns
``sidecar``      store / lookup / validation proofs (``publish``: the write phases of a store;
                 ``legacy``: v1 objects found by today's authority)
``claims``       one producer per object across processes (torch-free)
``usage``        when an object was last used: the order of size-capped eviction (torch-free)
``memory``       the in-memory LRU and its read-only views
``maintenance``  ls, summary, deep verify and gc (debris, age, LRU down to a size cap) of a whole
                 cache root (torch-free): ``summarize`` and ``gc`` are what ``tt-cache ls|gc`` call

Public names are re-exported here lazily, so importing a torch-free submodule never pulls in
torch through this package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from models.common.lazy_exports import lazy_exports

_EXPORTS = {
    "layout": (
        "FROZEN_BACKBONE_AUTHORITY_SCHEMA_V1", "FROZEN_BACKBONE_AUTHORITY_SCHEMA",
        "FROZEN_BACKBONE_PACKET_SCHEMA", "FROZEN_BACKBONE_SIDECAR_SCHEMA_V1",
        "FROZEN_BACKBONE_SIDECAR_SCHEMA", "FROZEN_BACKBONE_SIDECAR_PROGRESS_SCHEMA",
        "FrozenBackboneCacheError",
    ),
    "identity": (
        "FEATURE_DTYPES", "FrozenBackboneCacheAuthority",
        "frozen_backbone_prompt_mask_sha256_boundary", "frozen_backbone_position_policy_sha256_boundary",
    ),
    "packet": ("FrozenBackbonePrefillPacket",),
    "claims": ("ProducerClaim",),
    "sidecar": ("FrozenBackboneFeatureSidecar",),
    "memory": (
        "BASE_FORWARD_CACHE_SCHEMA", "BASE_FORWARD_CACHE_ENV", "BASE_FORWARD_CACHE_ENTRIES_ENV",
        "BASE_FORWARD_CACHE_DEFAULT_ENTRIES", "BaseForwardCache", "BaseForwardCacheEntry",
        "ReadOnlyTensor", "ReadOnlyTensorError", "base_forward_cache_allowed_boundary",
        "base_forward_cache_capacity_boundary", "base_forward_cache_enabled_boundary",
        "base_forward_cache_key_boundary",
    ),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, globals(), _EXPORTS)


if TYPE_CHECKING:  # static analysers see the eager imports
    from models.common.prefill_cache.claims import *  # noqa: F403
    from models.common.prefill_cache.identity import *  # noqa: F403
    from models.common.prefill_cache.layout import *  # noqa: F403
    from models.common.prefill_cache.memory import *  # noqa: F403
    from models.common.prefill_cache.packet import *  # noqa: F403
    from models.common.prefill_cache.sidecar import *  # noqa: F403
