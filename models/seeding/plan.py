# SPDX-License-Identifier: Apache-2.0
"""A seeding plan: which models x meshes x precisions x components a CI cache must hold.

::

    models:
      - model: google/gemma-3-270m        # HF id, local dir or hub snapshot
        meshes: [N150, N300]
        precisions: [performance, accuracy, bfloat16]   # a policy, a dtype or a policy file
      - model: /data/llama-3.2-1b
        family: llama                     # optional: from config.json otherwise
        meshes: [T3K]
        precisions: [bfloat16, bfloat8_b]
        components: [text]                # optional: the family's default otherwise

Parsing checks the plan's shape, and that each combination can be built at all (its mesh and
precision names, a policy file's contents; its model on that mesh and its policy's groups and decoders
when its config.json is here: :func:`combination_problem`),
torch-free; the rest is checked before anything is built (:mod:`models.seeding.runner`). The
same combination written twice is an error; two spellings of one variant (``N150`` and ``1x1``,
``components: [text]`` and the family's default) are merged by the runner, which knows the
variant each one names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from models.common.checkpoint import CheckpointError, read_config, resolve_checkpoint_dir
from models.common.heads import layout_problem
from models.common.mesh import MeshError, parse_mesh_shape
from models.common.model_args import ModelArgs
from models.common.precision import PolicyError, spec_problem
from models.registry import family_facts, family_of

ENTRY_KEYS = {"model", "family", "meshes", "precisions", "components"}


class PlanError(ValueError):
    """The plan file cannot be read or has the wrong shape; the message names the file and the spot."""


@dataclass(frozen=True)
class Combination:
    """One model x mesh x precision (x components) of a plan: one JUnit case, one cache variant."""

    model: str
    mesh: str
    precision: str
    family: str | None = None
    components: tuple[str, ...] | None = None
    entry: int | None = field(default=None, compare=False)  # its index in the plan's ``models`` list

    @property
    def case_name(self) -> str:
        parts = [self.mesh, self.precision] + ([",".join(self.components)] if self.components else [])
        return f"{self.model} [{' '.join(parts)}]"

    @property
    def entry_name(self) -> str | None:
        """The plan entry it comes from, as the plan's error messages name it (``models[1]``)."""
        return None if self.entry is None else f"models[{self.entry}]"

    @property
    def where(self) -> str:
        """The case name with the plan entry it comes from (``models[1] org/m [1x1 bfloat16]``)."""
        return self.case_name if self.entry is None else f"{self.entry_name} {self.case_name}"

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "family": self.family, "mesh": self.mesh, "precision": self.precision,
                "components": list(self.components) if self.components else None, "entry": self.entry}


@dataclass(frozen=True)
class Plan:
    path: Path
    combinations: tuple[Combination, ...]


def _string_list(entry: dict[str, Any], key: str, where: str, *, required: bool) -> list[str] | None:
    value = entry.get(key)
    if value is None and not required:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise PlanError(f"{where}: '{key}' must be a non-empty list of names, got {value!r}")
    return value


def _entry_combinations(entry: Any, where: str, index: int | None = None) -> list[Combination]:
    if not isinstance(entry, dict):
        raise PlanError(f"{where}: expected a mapping with 'model', 'meshes' and 'precisions', got {entry!r}")
    unknown = set(entry) - ENTRY_KEYS
    if unknown:
        raise PlanError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(ENTRY_KEYS)}")
    model, family = entry.get("model"), entry.get("family")
    if not isinstance(model, str) or not model:
        raise PlanError(f"{where}: 'model' must be an HF id or a path, got {model!r}")
    if family is not None and not isinstance(family, str):
        raise PlanError(f"{where}: 'family' must be a name, got {family!r}")
    meshes = _string_list(entry, "meshes", where, required=True)
    precisions = _string_list(entry, "precisions", where, required=True)
    components = _string_list(entry, "components", where, required=False)
    return [
        Combination(model, mesh, precision, family, tuple(components) if components else None, index)
        for mesh in meshes
        for precision in precisions
    ]


def combination_problem(combination: Combination) -> str | None:
    """Why a combination can never be built, or None: its mesh or precision is no name, or (its
    config.json on this machine) its model cannot be laid over the mesh. Torch-free: a plan is
    refused when it is loaded, not seconds into a seed."""
    problems, mesh = [], None
    try:
        mesh = parse_mesh_shape(combination.mesh)
    except MeshError as error:
        problems.append(str(error))
    if problem := spec_problem(combination.precision):
        problems.append(problem)
    if problems or mesh is None:
        return "; ".join(problems)
    checkpoint = resolve_checkpoint_dir(combination.model)
    try:
        config = read_config(checkpoint) if checkpoint else None
        args = ModelArgs.from_hf_config(config) if config else None
    except (CheckpointError, KeyError, TypeError, ValueError):
        return None  # a config.json it cannot use: the seed names it
    if args is not None and (problem := policy_problem(combination, config, args.full_n_layers)):
        return problem
    problem = args and layout_problem(args, mesh)
    shape = f"{mesh[0]}x{mesh[1]}"
    named = combination.mesh if combination.mesh == shape else f"{combination.mesh} ({shape})"
    return f"cannot be built on mesh {named}: {problem}" if problem else None


def policy_problem(combination: Combination, config: dict[str, Any], n_decoders: int) -> str | None:
    """Why the combination's precision names no policy of this model (an unknown group for its
    family, a decoder it does not have), or None; torch-free."""
    try:
        facts = family_facts(combination.family or family_of(config))
        facts.policy(combination.precision, combination.model).check_decoders(n_decoders)
    except PolicyError as error:
        return str(error)
    except ValueError:
        return None  # an unknown family: the seed names it
    return None


def parse_plan(text: str, path: Path) -> Plan:
    try:
        body = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise PlanError(f"{path}: not valid YAML ({' '.join(str(error).split())})") from None
    if not isinstance(body, dict) or not isinstance(body.get("models"), list) or not body["models"]:
        raise PlanError(f"{path}: expected a mapping with a non-empty 'models' list")
    combinations: list[Combination] = []
    for index, entry in enumerate(body["models"]):
        combinations += _entry_combinations(entry, f"{path}: models[{index}]", index)
    seen: dict[Combination, Combination] = {}
    for combination in combinations:
        if combination in seen:
            first = seen[combination]
            raise PlanError(f"{path}: {combination.case_name} is listed twice (models[{first.entry}] and "
                            f"models[{combination.entry}])")
        seen[combination] = combination
        if problem := combination_problem(combination):
            raise PlanError(f"{path}: {combination.entry_name} {combination.model}: {problem}")
    return Plan(path, tuple(combinations))


def load_plan(path: Path) -> Plan:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise PlanError(f"{path}: cannot read the plan ({error.strerror or error})") from None
    except UnicodeDecodeError as error:
        raise PlanError(f"{path}: not UTF-8 text ({error.reason})") from None
    return parse_plan(text, path)
