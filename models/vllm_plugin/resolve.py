# SPDX-License-Identifier: Apache-2.0
"""Where a vLLM-started model comes from, resolved as tt-metal's model code resolves it.

* checkpoint: the model vLLM was asked for (``hf_config._name_or_path``: the hub snapshot directory
  vLLM hands over under ``HF_HUB_OFFLINE=1``, or the id / directory the user passed) **wins**.
  tt-metal's ``$MODEL_WEIGHTS_DIR`` / ``$HF_MODEL`` are honoured only when they name that same
  checkpoint (the same string, or a path resolving to the same directory); one left over from
  another model is ignored with a warning naming both, so it never silently replaces
  ``LLM(model=...)``. ``additional_config={"checkpoint": ...}`` is the explicit override. The
  checkpoint goes to the loader unchanged: the loader owns the cache identity, so a cache-only
  deploy (config and tokenizer, no weights) is served by the cache of the same model.
* cache root: ``$TT_CACHE_PATH`` (read by the loader itself).
* mesh: the open ``mesh_device`` if there is one, else ``$MESH_DEVICE`` (``N150|N300|T3K|TG|
  BH-Galaxy|...`` or ``"(r,c)"``), else one device.
* precision: tt-metal's ``optimizations``, which names its precision policy (``performance`` or
  ``accuracy``: a dtype per decoder and tensor group, :mod:`models.common.precision`), unless a
  precision (a dtype, a policy name or a policy file) is named outright.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loguru import logger

from models.common import envs
from models.common.checkpoint import resolve_checkpoint_dir
from models.common.mesh import MeshShape
from models.common.precision import POLICY_NAMES

CHECKPOINT_ENVS = ("MODEL_WEIGHTS_DIR", "HF_MODEL")


class ResolveError(ValueError):
    """A setting the TT model cannot run with (named, with what it expected)."""


@dataclass(frozen=True)
class CheckpointChoice:
    """The checkpoint a TT model loads, and the environment overrides that were not followed."""

    reference: str
    ignored: tuple[str, ...] = ()  # "NAME=value" of each override left unused


def checkpoint_reference(hf_config: Any, explicit: str | None = None) -> CheckpointChoice:
    """The checkpoint to load: ``explicit`` (``additional_config["checkpoint"]``), else the model
    vLLM was asked for; an environment override only where it names that same checkpoint."""
    requested = getattr(hf_config, "_name_or_path", None) or getattr(hf_config, "name_or_path", None)
    requested = str(requested) if requested else None
    if explicit:
        if requested and explicit != requested:
            logger.info(f"serving checkpoint {explicit} (additional_config['checkpoint']) for vLLM's model {requested}")
        return CheckpointChoice(str(explicit))
    overrides = [(name, getattr(envs, name)) for name in CHECKPOINT_ENVS if getattr(envs, name)]
    if requested is None:
        if not overrides:
            raise ResolveError(f"no checkpoint named: set one of {', '.join(CHECKPOINT_ENVS)} or pass a model path")
        return CheckpointChoice(overrides[0][1])
    ignored = []
    for name, value in overrides:
        if same_checkpoint(value, requested):
            return CheckpointChoice(value, tuple(ignored))
        logger.warning(f"{name}={value} names another checkpoint than the model vLLM was asked for ({requested}): "
                       f"{name} is IGNORED and {requested} is served. To serve {value}, pass it as LLM(model=...) "
                       f"or additional_config={{'checkpoint': {value!r}}}; else unset {name}.")
        ignored.append(f"{name}={value}")
    return CheckpointChoice(requested, tuple(ignored))


def same_checkpoint(a: str, b: str) -> bool:
    """Whether two spellings (HF id, local directory, hub snapshot) name one checkpoint on this machine."""
    if a == b:
        return True
    dir_a, dir_b = resolve_checkpoint_dir(a), resolve_checkpoint_dir(b)
    if dir_a is None or dir_b is None:
        return False
    try:
        return dir_a.resolve() == dir_b.resolve() or dir_a.samefile(dir_b)
    except OSError:
        return False


def mesh_shape_for(mesh_device: Any = None) -> MeshShape:
    """The mesh a model is laid out for: the open device's shape, else ``$MESH_DEVICE``, else 1x1."""
    if mesh_device is not None:
        rows, cols = tuple(mesh_device.shape)
        return int(rows), int(cols)
    try:
        return envs.MESH_DEVICE or (1, 1)
    except envs.BadValue as error:
        raise ResolveError(str(error)) from None


def precision_for(optimizations: str | None, precision: str | None = None) -> str:
    """The precision of a build: ``precision`` if named, else the policy ``optimizations`` names
    (the same policy ``tt-cache build --precision performance`` and the demo build: one cache)."""
    if precision:
        return precision
    key = (optimizations or "performance").lower()
    if key not in POLICY_NAMES:
        raise ResolveError(f"optimizations={optimizations!r}: expected one of {sorted(POLICY_NAMES)}")
    return key
