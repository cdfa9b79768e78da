# SPDX-License-Identifier: Apache-2.0
"""Which cache one build of one model uses, and whether it is warm: everything a load decides
before it converts anything, without torch or ttnn (``tt-cache seed --check`` runs on a light
install, and a loader delegates here).

* **The cache dir** is found by what the weights are, not by a folder name:
  ``<root>/<name>--<content id>/<precision>/mesh_<r>x<c>[-layers<n>]``. The same weights under
  any folder name, HF id or hub snapshot share one cache (``<name>`` is only for people); different
  weights never do. With no weights on this machine (a cache-only deploy) it is the one cache
  whose marker records this model id (or that was loaded warm under it); none or several is an
  error that lists them (with ``$TT_CACHE_REMOTE`` set, the loader first asks the shared store
  for one: :func:`~models.common.weight_cache.remote.cold_start.pull_cache_only`). An explicit
  ``cache_dir=`` is checked the same way, by the gate.
* **The config** is the checkpoint's; a cache-only deploy's own ``config.json`` must agree with
  the one the cache was built with wherever it changes the computation (another ``rope_theta``
  on the same tensors would run warm and wrong), else it is an error naming the fields.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from models.common.checkpoint import (
    CONFIG_FILE,
    CheckpointError,
    checkpoint_name,
    has_weights,
    model_id,
    read_config,
    resolve_checkpoint_dir,
)
from models.common.weight_cache.gate import CacheStatus, weight_cache_status
from models.common.weight_cache.identity import BOOKKEEPING_CONFIG_FIELDS, CheckpointIdentity, checkpoint_identity
from models.common.weight_cache.layout import CacheRoot, VariantPaths, variant_subdir
from models.common.weight_cache.marker import WeightCacheError, read_marker
from models.common.weight_cache.stamps import StampIndex
from models.common.weight_cache.usage import answers_to

# config.json fields that do not change what the cached weights compute (bookkeeping, how the
# checkpoint was stored, which tokens start and stop generation): a cache-only deploy may differ in them
CONFIG_FIELDS_OUTSIDE_THE_FORWARD = BOOKKEEPING_CONFIG_FIELDS | frozenset({
    "torch_dtype", "dtype", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "output_attentions",
    "output_hidden_states", "return_dict",
})


@dataclass
class CacheRequest:
    """One build's cache: ``model`` (HF id, checkpoint dir or hub snapshot), its ``build_variant``
    and where it sits (``precision``, ``mesh_shape``, ``num_layers``) under ``cache_root``, or the
    explicit ``named_cache_dir``."""

    model: str | os.PathLike
    build_variant: Mapping[str, Any]
    precision: str
    mesh_shape: tuple[int, int]
    num_layers: int | None
    cache_root: Path | None  # None: the default root (``$TT_CACHE_PATH``)
    named_cache_dir: Path | None = None
    model_name: str = field(init=False)
    model_id: str = field(init=False)
    checkpoint_dir: Path | None = field(init=False)

    def __post_init__(self) -> None:
        self.cache_root = Path(self.cache_root) if self.cache_root is not None else CacheRoot.default().path
        self.model_name = checkpoint_name(self.model)
        self.model_id = model_id(self.model)
        self.checkpoint_dir = resolve_checkpoint_dir(self.model)

    @property
    def has_checkpoint_weights(self) -> bool:
        return has_weights(self.checkpoint_dir)

    @cached_property
    def identity(self) -> CheckpointIdentity | None:
        """The checkpoint's content id and what its files were seen as: what a build of this
        cache must read (None without weights on this machine)."""
        if not self.has_checkpoint_weights:
            return None
        root = CacheRoot(self.cache_root)
        name, location = self.model_name, self.checkpoint_dir
        stamps = StampIndex(root.checkpoint_stamps(name, location), root.user_checkpoint_stamps(name, location),
                            root.shared_checkpoint_stamps(name, location), location=location)
        return checkpoint_identity(self.checkpoint_dir, stamps)

    @property
    def content_id(self) -> str | None:
        """The checkpoint's content digest (None without weights on this machine)."""
        return self.identity.content_id if self.identity is not None else None

    @property
    def variant_subdir(self) -> Path:
        return Path(variant_subdir(self.precision, self.mesh_shape, self.num_layers))

    @cached_property
    def paths(self) -> VariantPaths:
        """This build's variant in the dir it uses: named by the user; else the dir holding this
        content (under any readable name), else a new one under this checkpoint's name; else
        (cache-only) the one cache of this model id. Made once per request: the gate, the warm read
        and the use record of one load all take this object."""
        if self.named_cache_dir is not None:
            return VariantPaths(self.named_cache_dir, self.build_variant)
        if self.content_id is None:
            return self._cache_only_paths()
        return self.content_paths(self.content_id)

    @property
    def cache_dir(self) -> Path:
        return self.paths.cache_dir

    def content_dir(self, content_id: str) -> Path:
        return self.content_paths(content_id).cache_dir

    def content_paths(self, content_id: str) -> VariantPaths:
        """This variant for the checkpoint content ``content_id``: in the dir holding it (under any
        readable name), else in a new one under this checkpoint's name (where a pull puts it too)."""
        root = CacheRoot(self.cache_root)
        own = VariantPaths(root.model_dir(self.model_name, content_id) / self.variant_subdir, self.build_variant)
        if own.marker.exists():
            return own
        for model_dir in root.model_dirs_of(content_id):
            candidate = VariantPaths(model_dir / self.variant_subdir, self.build_variant)
            if self._recorded(candidate, "content_id") == content_id:
                return candidate
        return own

    def find_again(self) -> None:
        """Forget the cache dir found, so the next use looks again (a pull may have added one)."""
        self.__dict__.pop("paths", None)

    def _recorded(self, paths: VariantPaths, attribute: str) -> Any:
        try:
            return getattr(read_marker(paths), attribute)
        except WeightCacheError:
            return None

    def cache_only_dirs(self) -> list[Path]:
        """The caches under the root that a cache-only load of this model id may use."""
        return [paths.cache_dir for paths in self._cache_only_candidates()[0]]

    def deployed_config(self) -> dict[str, Any] | None:
        """The deploy's own ``config.json`` (None where it has none)."""
        if self.checkpoint_dir is None or not (self.checkpoint_dir / CONFIG_FILE).is_file():
            return None
        return read_config(self.checkpoint_dir)

    def _cache_only_candidates(self) -> tuple[list[VariantPaths], list[str]]:
        """(caches of this model id, the model ids of the other caches of this name)."""
        candidates, same_name = [], []
        for model_dir in CacheRoot(self.cache_root).model_dirs():
            paths = VariantPaths(model_dir / self.variant_subdir, self.build_variant)
            recorded = self._recorded(paths, "model_id")
            if answers_to(paths, recorded, self.model_id):
                candidates.append(paths)
            elif recorded is not None and checkpoint_name(recorded) == self.model_name:
                same_name.append(recorded)
        return candidates, same_name

    def _cache_only_paths(self) -> VariantPaths:
        candidates, same_name = self._cache_only_candidates()
        if len(candidates) == 1:
            return candidates[0]
        where = f"{self.precision} {self.variant_subdir.name} caches under {self.cache_root}"
        if not candidates:
            seen = "; caches of that name are for " + ", ".join(sorted(set(same_name))) if same_name else ""
            raise CheckpointError(
                f"{self.model}: no checkpoint weights on this machine and no {where} built from "
                f"model id {self.model_id!r}{seen}"
            )
        listed = "\n  ".join(str(paths.cache_dir) for paths in candidates)
        raise CheckpointError(
            f"{self.model}: no checkpoint weights on this machine and {len(candidates)} {where} were built "
            f"from {self.model_id!r} (different weights); name one with cache_dir=:\n  {listed}"
        )

    def model_config(self) -> dict[str, Any]:
        """``config.json`` from the checkpoint, else the copy kept with the cache (see the module
        doc for a cache-only deploy's own config)."""
        local = self.checkpoint_dir is not None and (self.checkpoint_dir / CONFIG_FILE).is_file()
        if local and self.has_checkpoint_weights:
            return read_config(self.checkpoint_dir)
        try:
            recorded = read_marker(self.paths).model_config
        except WeightCacheError as error:
            if local:
                return read_config(self.checkpoint_dir)  # the gate will say why the cache cannot serve it
            raise CheckpointError(f"{self.model}: no checkpoint on this machine and no usable cache ({error})") from None
        if not local:
            if recorded is None:
                raise CheckpointError(f"{self.model}: no checkpoint config and the cache keeps none")
            return recorded
        deployed = read_config(self.checkpoint_dir)
        if recorded is not None:
            differ = sorted(key for key in set(deployed) | set(recorded)
                            if key not in CONFIG_FIELDS_OUTSIDE_THE_FORWARD and deployed.get(key) != recorded.get(key))
            if differ:
                raise CheckpointError(
                    f"{self.checkpoint_dir / CONFIG_FILE} differs from the config the cache {self.cache_dir} was "
                    f"built with in {', '.join(differ)}: those weights would compute another model "
                    f"(rebuild from the checkpoint, or deploy the config the cache was built with)"
                )
        return deployed

    def status(self, n_layers: int, components: Iterable[str]) -> CacheStatus:
        """The gate's verdict on this build's cache, for a build of ``n_layers`` and ``components``."""
        return weight_cache_status(
            self.paths,
            model_name=self.model_name,
            n_layers=n_layers,
            mesh_shape=self.mesh_shape,
            components=components,
            force_env=None,
            content_id=self.content_id,
            model_id=None if self.content_id is not None else self.model_id,
        )
