# SPDX-License-Identifier: Apache-2.0
"""Precision policies: the dtype each weight of a build is stored in, per decoder and tensor group.

**The rule: a weight's dtype is its policy's answer for its (tensor group, decoder)**, its group the
first row of :data:`WEIGHT_GROUPS` that matches its name; no loader picks a dtype of its own. A
policy is named by a dtype (every group in it: today's ``precision=``, the degenerate policy), by
``performance`` or ``accuracy``, or by a policy file; all three resolve (:func:`resolve_policy`) to
one :class:`PrecisionPolicy`: the groups' dtypes and the decoders that differ from them.

**Where the named policies come from.** tt-transformers' ``models/tt_transformers/tt/model_config.py``
(tenstorrent/tt-metal): ``ModelOptimizations._default_settings`` (every weight group ``BFP8``),
``ModelOptimizations.performance`` (``FF1_FF3`` ``BFP4``; ``Qwen2.5-7B`` and ``Qwen2.5-VL-7B``:
``WQKV``/``WO`` ``BF16`` and the MLP ``BFP8``), ``ModelOptimizations.accuracy`` (``WQKV``/``WO``
``BF16``; ``BFP8`` for ``Llama-3*``, ``Mistral-7B*``, ``Phi-3-mini*``, ``phi-4*``; the >70B models
keep ``FF1_FF3`` at ``BFP4``), and ``DecodersPrecision._precision_factory``, which reads a model's
``model_params/<model>/{performance,accuracy}_decoder_config.json`` (``parse_decoder_json``: a listed
decoder is the default settings plus its ``precision_cfg``). tt-transformers keys all of it by the
model's name (``HF_MODEL``'s base name); so does :data:`MODEL_RULES`, with the checkpoint's name.
Our groups beyond tt-transformers' (the LM head, Gemma 4's per-layer inputs and vision tower) are
``bfloat8_b`` in both, as tt-transformers builds its LM head; embeddings, norms, routers and biases
keep the dtype the device code reads them in, whatever the policy (:data:`FIXED_GROUPS`).

**Policy files** have tt-transformers' per-decoder shape, ``{"decoders": {"31": {"precision_cfg":
{"FF1_FF3": "BFP8"}}}}``, with its meaning (a listed decoder: ``bfloat8_b`` everywhere plus what it
lists), and two optional keys of ours: ``"base"`` (the policy the unlisted decoders keep; default
``performance``, as ``parse_decoder_json``'s) and ``"groups"`` (dtypes for whole groups, the LM head
included). Groups and dtypes may be spelled either way (``FF1_FF3``/``ff1_ff3``, ``BFP8``/``bfloat8_b``);
``KV_CACHE``, ``ACTIVATION`` and ``fidelity_cfg`` change no stored byte and are accepted and ignored.

**Identity.** A policy's :meth:`~PrecisionPolicy.canonical` form holds the full per-decoder map (a
decoder is listed only where it differs), so two spellings of one policy are one map and one cache,
and any difference is another. Its :attr:`~PrecisionPolicy.label` names its variant dir: the dtype
when every group has it (the build variant is then exactly today's: those caches stay warm),
``performance`` or ``accuracy`` when the map is that policy's for this model, else ``custom-<digest8>``.
Importing this module imports nothing heavy (no torch, no ttnn).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.common.checkpoint import CheckpointError, checkpoint_name, read_config, resolve_checkpoint_dir
from models.common.weight_cache.layout import PRECISIONS as DTYPES

POLICY_NAMES = ("performance", "accuracy")
DECODER_GROUPS = ("wqkv", "wo", "ff1_ff3", "ff2")
MODEL_GROUPS = ("lm_head", "per_layer_input", "vision")
FIXED_GROUPS = {"embedding": "bfloat16", "norm": "bfloat16 (Gemma: float32)", "router": "bfloat16",
                "bias": "bfloat16"}  # stored as the device code reads them: no policy changes them
MAX_POLICY_FILE_BYTES = 1 << 20

# tt-transformers' spellings (TensorGroup and PrecisionSetting member names) -> ours
TT_GROUPS = {"WQKV": "wqkv", "WO": "wo", "FF1_FF3": "ff1_ff3", "FF2": "ff2"}
TT_RUNTIME_GROUPS = frozenset({"KV_CACHE", "ACTIVATION", "kv_cache", "activation"})  # no stored weight
TT_DTYPES = {"BFP4": "bfloat4_b", "BFP8": "bfloat8_b", "BF16": "bfloat16"}

# Which weights (the loaders' names) are in which group; ``decoder`` is the layer index.
WEIGHT_GROUPS: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(pattern), group) for pattern, group in (
    (r"output", "lm_head"),
    (r"layers\.(?P<decoder>\d+)\.attention\.wq\w*", "wqkv"),  # fused q|k|v (Gemma 4: q|k on KV-shared layers)
    (r"layers\.(?P<decoder>\d+)\.attention\.wo", "wo"),
    (r"layers\.(?P<decoder>\d+)\.(feed_forward|moe)\.(experts\.)?w[13]", "ff1_ff3"),  # gate/up, MoE experts too
    (r"layers\.(?P<decoder>\d+)\.(feed_forward|moe)\.(experts\.)?w2", "ff2"),  # down
    (r"(layers\.\d+\.)?per_layer_\w+", "per_layer_input"),  # Gemma 4's per-layer input projections
    (r"vision\.[\w.]+", "vision"),  # Gemma 4's vision tower and its projector
))

# tt-transformers' settings, as deltas on its default (every weight group bfloat8_b)
_FF1_FF3_BFP4 = {"ff1_ff3": "bfloat4_b"}
_ATTENTION_BF16 = {"wqkv": "bfloat16", "wo": "bfloat16"}
_EXACT, _PREFIX = "exact", "prefix"
MODEL_RULES: dict[str, tuple[tuple[str, str, dict[str, str]], ...]] = {
    # (how the base name matches, the name, the groups it sets); the first match wins, else the last row's
    "performance": (
        (_EXACT, "Qwen2.5-7B", {**_ATTENTION_BF16}),
        (_EXACT, "Qwen2.5-VL-7B", {**_ATTENTION_BF16}),
        (_PREFIX, "", _FF1_FF3_BFP4),
    ),
    "accuracy": (
        *((_EXACT, name, _FF1_FF3_BFP4) for name in ("Llama-3.1-70B", "Llama-3.2-90B", "DeepSeek-R1-Distill-Llama-70B",
                                                      "Qwen2.5-72B")),
        *((_PREFIX, name, {}) for name in ("Llama-3", "Mistral-7B", "Phi-3-mini", "phi-4")),
        (_PREFIX, "", _ATTENTION_BF16),
    ),
}
# tt-transformers' model_params/<model>/<policy>_decoder_config.json, as their policy files read
DECODER_FILES: dict[tuple[str, str], dict[int, dict[str, str]]] = {
    ("performance", "Llama-3.1-8B-Instruct"): {31: {"ff1_ff3": "bfloat8_b"}},
    ("performance", "Qwen3-32B"): {d: {g: "bfloat4_b" for g in DECODER_GROUPS} for d in range(64)},
    ("accuracy", "phi-4"): {0: {"wqkv": "bfloat8_b"}},
}


class PolicyError(ValueError):
    """A precision that names no policy, or a policy file that cannot be one; the message is one line."""


def _base_matches(model_name: str, how: str, name: str) -> bool:
    """tt-transformers compares the model's base name (``Llama-3.1-8B`` of ``Llama-3.1-8B-Instruct``)."""
    if how == _PREFIX:
        return model_name.startswith(name)
    return model_name == name or model_name.startswith(name + "-")


@dataclass(frozen=True)
class PrecisionPolicy:
    """A dtype per tensor group (``groups``) and the decoders that differ from it (``decoders``:
    ``((decoder, ((group, dtype), ...)), ...)``, in canonical form: sorted, no entry equal to its group's)."""

    family: str
    groups: tuple[tuple[str, str], ...]  # every group of the family (its ``tensor_groups``) and its dtype
    decoders: tuple[tuple[int, tuple[tuple[str, str], ...]], ...] = ()
    label: str = ""

    @classmethod
    def of(cls, family: str, groups: Mapping[str, str], decoders: Mapping[int, Mapping[str, str]] | None = None,
           label: str = "") -> PrecisionPolicy:
        """The canonical policy of these settings (a decoder's entry equal to its group's is dropped)."""
        base = tuple(sorted(groups.items()))
        differ = tuple((d, tuple(sorted((g, t) for g, t in over.items() if groups.get(g) != t)))
                       for d, over in sorted((decoders or {}).items()))
        return cls(family, base, tuple((d, over) for d, over in differ if over), label)

    def dtype(self, group: str, decoder: int | None = None) -> str:
        if decoder is not None:
            for index, over in self.decoders:
                if index == decoder:
                    found = dict(over).get(group)
                    if found is not None:
                        return found
        return dict(self.groups)[group]

    def dtype_of(self, weight: str) -> str:
        """The dtype of one weight by its loader name; ``LookupError`` for a weight no group holds
        (a loader asking for a linear weight's format by a name :data:`WEIGHT_GROUPS` lacks)."""
        group, decoder = group_of(weight)
        if group not in dict(self.groups):
            raise LookupError(f"weight {weight!r} is in group {group!r}, which {self.family} does not have")
        return self.dtype(group, decoder)

    @property
    def uniform(self) -> str | None:
        """The dtype of every group, when one is (the degenerate policy: today's ``precision=``)."""
        dtypes = {t for _, t in self.groups}
        return dtypes.pop() if len(dtypes) == 1 and not self.decoders else None

    def canonical(self) -> dict[str, Any]:
        """The full per-decoder map, as the build variant records it (JSON-ready, key order fixed)."""
        return {"groups": dict(self.groups), "decoders": {str(d): dict(over) for d, over in self.decoders}}

    @property
    def digest(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def folded(self, n_decoders: int) -> PrecisionPolicy:
        """The same per-decoder map over a model of ``n_decoders``, in the one form every spelling of
        it has: each decoder group's dtype the one most of its decoders have (a tie: the first by
        name), the decoders that differ listed (a file overriding every decoder is a group setting)."""
        groups, decoders = dict(self.groups), {}
        for group in DECODER_GROUPS:
            if group not in groups:
                continue
            values = [self.dtype(group, d) for d in range(n_decoders)]
            groups[group] = min(set(values), key=lambda dtype: (-values.count(dtype), dtype)) if values else groups[group]
            for decoder, dtype in enumerate(values):
                if dtype != groups[group]:
                    decoders.setdefault(decoder, {})[group] = dtype
        return PrecisionPolicy.of(self.family, groups, decoders, self.label)

    def check_decoders(self, n_decoders: int) -> None:
        """A decoder the model does not have is bad input (one line), before anything is built."""
        for decoder, _ in self.decoders:
            if decoder >= n_decoders:
                raise PolicyError(f"precision policy {self.label}: decoder {decoder} is out of range "
                                  f"(the model has {n_decoders} decoders, 0 to {n_decoders - 1})")

    def describe(self) -> str:
        """One line: its label, and the groups and decoders that make it."""
        groups = ", ".join(f"{g} {t}" for g, t in self.groups)
        decoders = "; ".join(f"decoder {d}: " + ", ".join(f"{g} {t}" for g, t in over) for d, over in self.decoders)
        return f"{self.label} ({groups}{'; ' + decoders if decoders else ''})"

    def __reduce__(self) -> tuple:  # pickled into seed workers: by value
        return (PrecisionPolicy, (self.family, self.groups, self.decoders, self.label))


def group_of(weight: str) -> tuple[str, int | None]:
    """The tensor group of a weight (loader name) and its decoder (None outside the decoders)."""
    for pattern, group in WEIGHT_GROUPS:
        match = pattern.fullmatch(weight)
        if match:
            decoder = match.groupdict().get("decoder")
            return group, int(decoder) if decoder is not None and group in DECODER_GROUPS else None
    raise LookupError(f"weight {weight!r} is in no tensor group (models.common.precision.WEIGHT_GROUPS)")


def _settings(policy: str, model_name: str) -> dict[str, str]:
    """tt-transformers' settings of a named policy for a model: its default, then the first rule matching."""
    for how, name, groups in MODEL_RULES[policy]:
        if _base_matches(model_name, how, name):
            return {**{g: "bfloat8_b" for g in DECODER_GROUPS + MODEL_GROUPS}, **groups}
    raise AssertionError("the last rule matches every name")


def _named_map(policy: str, family: str, groups: tuple[str, ...], model_name: str,
               n_decoders: int | None) -> PrecisionPolicy:
    """``performance`` or ``accuracy`` for one model of a family (its tensor ``groups``), with its
    per-decoder overrides."""
    settings = _settings(policy, model_name)
    decoders = {d: {g: t for g, t in _tt_decoder(over).items() if g in groups}
                for d, over in DECODER_FILES.get((policy, model_name), {}).items()}
    return _canonical(PrecisionPolicy.of(family, {g: settings[g] for g in groups}, decoders), n_decoders)


def _canonical(policy: PrecisionPolicy, n_decoders: int | None) -> PrecisionPolicy:
    if n_decoders is None:
        return policy
    policy.check_decoders(n_decoders)
    return policy.folded(n_decoders)


def _tt_decoder(listed: Mapping[str, str]) -> dict[str, str]:
    """A decoder a tt-transformers decoder file lists: the default (bfloat8_b) plus what it lists."""
    return {**{g: "bfloat8_b" for g in DECODER_GROUPS}, **listed}


def uniform_policy(dtype: str, family: str, groups: tuple[str, ...]) -> PrecisionPolicy:
    if dtype not in DTYPES:
        raise PolicyError(f"dtype {dtype!r} cannot be stored: expected one of {', '.join(DTYPES)}")
    return PrecisionPolicy.of(family, {g: dtype for g in groups}, label=dtype)


def _labelled(policy: PrecisionPolicy, model_name: str, n_decoders: int | None) -> PrecisionPolicy:
    """The policy under the name its map has: a dtype, ``performance``/``accuracy``, or ``custom-<digest8>``."""
    if policy.uniform:
        return PrecisionPolicy(policy.family, policy.groups, policy.decoders, policy.uniform)
    for name in POLICY_NAMES:
        try:
            named = _named_map(name, policy.family, tuple(g for g, _ in policy.groups), model_name, n_decoders)
        except PolicyError:  # its own overrides do not fit this model: it is not this map
            continue
        if (named.groups, named.decoders) == (policy.groups, policy.decoders):
            return PrecisionPolicy(policy.family, policy.groups, policy.decoders, name)
    return PrecisionPolicy(policy.family, policy.groups, policy.decoders, f"custom-{policy.digest}")


def model_facts(model: str | os.PathLike) -> tuple[str, int | None]:
    """What a policy is keyed by: the checkpoint's name, and its decoders where its ``config.json``
    is on this machine (None otherwise: the map is then left as spelled)."""
    directory = resolve_checkpoint_dir(model)
    try:
        config = read_config(directory) if directory is not None else None
        text = (config.get("text_config") or config) if isinstance(config, dict) else None
        layers = text.get("num_hidden_layers") if isinstance(text, dict) else None
    except (CheckpointError, OSError, ValueError):
        layers = None
    return checkpoint_name(model), layers if type(layers) is int and layers > 0 else None


def is_policy_file(spec: str | os.PathLike) -> bool:
    """A precision naming a file (a path separator, or a ``.json`` name), not a dtype or policy name."""
    text = os.fspath(spec)
    return os.sep in text or text.endswith(".json") or Path(text).is_file()


def resolve_policy(spec: str | os.PathLike | PrecisionPolicy, family: str, groups: tuple[str, ...],
                   model_name: str, n_decoders: int | None = None) -> PrecisionPolicy:
    """The policy a ``precision=`` names for a model (its checkpoint's name: the per-model
    overrides are keyed by it) of a family with these tensor ``groups`` (the family table's:
    :meth:`models.registry.Family.policy`): a dtype, a policy name, a policy file or a policy.
    With the model's ``n_decoders`` known, a decoder past them is refused and the map folded into
    its one canonical form (:meth:`PrecisionPolicy.folded`)."""
    if isinstance(spec, PrecisionPolicy):
        if spec.family != family:
            raise PolicyError(f"precision policy {spec.label} is for {spec.family}, not {family}")
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise PolicyError(f"precision {spec!r}: expected a dtype, a policy name or a policy file")
    text = os.fspath(spec)
    if text in DTYPES:
        return uniform_policy(text, family, groups)
    if text in POLICY_NAMES:
        return _labelled(_named_map(text, family, groups, model_name, n_decoders), model_name, n_decoders)
    if is_policy_file(text):
        policy = _canonical(policy_from_file(Path(text), family, groups, model_name), n_decoders)
        return _labelled(policy, model_name, n_decoders)
    raise PolicyError(f"precision {text!r}: expected a dtype ({', '.join(DTYPES)}), a policy "
                      f"({', '.join(POLICY_NAMES)}) or a policy file (.json)")


def spec_problem(spec: Any) -> str | None:
    """Why a precision can name no policy of any family (torch-free, for plans and CLIs), or None;
    what depends on the model (its groups, its decoders) is checked when it is resolved."""
    if not isinstance(spec, (str, os.PathLike)):
        return f"precision {spec!r}: expected a dtype, a policy name or a policy file"
    text = os.fspath(spec)
    if text in DTYPES or text in POLICY_NAMES:
        return None
    try:
        if not is_policy_file(text):
            raise PolicyError(f"unknown precision {text!r}: expected a dtype ({', '.join(DTYPES)}), a policy "
                              f"({', '.join(POLICY_NAMES)}) or a policy file (.json)")
        _read_policy_file(Path(text), DECODER_GROUPS + MODEL_GROUPS)
    except PolicyError as error:
        return str(error)
    return None


def policy_from_file(path: Path, family: str, groups: tuple[str, ...], model_name: str) -> PrecisionPolicy:
    base, whole, decoders = _read_policy_file(path, groups, family)
    policy = resolve_policy(base, family, groups, model_name)  # unfolded: the caller folds
    settings = {**dict(policy.groups), **whole}
    merged = {d: dict(over) for d, over in policy.decoders}
    for decoder, over in decoders.items():
        merged[decoder] = {**merged.get(decoder, {}), **over}
    return PrecisionPolicy.of(family, settings, merged)


def _dtype(value: Any, where: str) -> str:
    dtype = TT_DTYPES.get(value, value) if isinstance(value, str) else value
    if dtype not in DTYPES:
        raise PolicyError(f"{where}: dtype {value!r} cannot be stored (expected one of "
                          f"{', '.join(DTYPES)}, or {', '.join(TT_DTYPES)})")
    return dtype


def _group_dtypes(settings: dict, where: str, groups: tuple[str, ...], family: str | None) -> dict[str, str]:
    """A file's ``{group: dtype}`` in our names; groups tt-transformers has and we store nothing
    of (``KV_CACHE``, ``ACTIVATION``) are left out."""
    dtypes = {}
    for name, value in settings.items():
        group = _group(name, where, groups, family)
        if group is not None:
            dtypes[group] = _dtype(value, f"{where}.{name}")
    return dtypes


def _group(name: Any, where: str, groups: tuple[str, ...], family: str | None) -> str | None:
    """Our name of a group (None for one that stores no weight); an unknown one is bad input."""
    if name in TT_RUNTIME_GROUPS:
        return None
    group = TT_GROUPS.get(name, name) if isinstance(name, str) else name
    if group not in groups:
        owner = f"{family} has" if family else "known"
        raise PolicyError(f"{where}: unknown tensor group {name!r} ({owner}: {', '.join(groups)})")
    return group


def _read_policy_file(path: Path, groups: tuple[str, ...], family: str | None = None
                      ) -> tuple[str, dict[str, str], dict[int, dict[str, str]]]:
    """(base, whole-group dtypes, per-decoder dtypes) of a policy file; :class:`PolicyError` naming
    the file and the spot for anything else."""
    try:
        with open(path, "rb") as file:
            raw = file.read(MAX_POLICY_FILE_BYTES + 1)
    except OSError as error:
        raise PolicyError(f"{path}: cannot read the precision policy ({error.strerror or error})") from None
    if len(raw) > MAX_POLICY_FILE_BYTES:
        raise PolicyError(f"{path}: a precision policy file is at most {MAX_POLICY_FILE_BYTES} bytes")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as error:
        raise PolicyError(f"{path}: not a JSON precision policy ({error})") from None
    if not isinstance(body, dict) or not set(body) <= {"base", "groups", "decoders"} or not body:
        raise PolicyError(f"{path}: expected an object with 'decoders', 'groups' and/or 'base'")
    base = body.get("base", "performance")
    if base not in DTYPES and base not in POLICY_NAMES:
        raise PolicyError(f"{path}: base {base!r} is no policy ({', '.join(POLICY_NAMES + DTYPES)})")
    whole = body.get("groups", {})
    if not isinstance(whole, dict):
        raise PolicyError(f"{path}: 'groups' must map tensor groups to dtypes")
    settings = _group_dtypes(whole, f"{path}: groups", groups, family)
    listed = body.get("decoders", {})
    if not isinstance(listed, dict):
        raise PolicyError(f"{path}: 'decoders' must map decoder numbers to settings")
    decoders = {}
    for key, entry in listed.items():
        where = f"{path}: decoders.{key}"
        if not (isinstance(key, str) and key.isdigit()) or not isinstance(entry, dict) or \
                not set(entry) <= {"precision_cfg", "fidelity_cfg"}:
            raise PolicyError(f"{where}: expected a decoder number mapped to {{'precision_cfg': {{group: dtype}}}}")
        cfg = entry.get("precision_cfg", {})
        if not isinstance(cfg, dict):
            raise PolicyError(f"{where}.precision_cfg: expected {{group: dtype}}")
        over = _group_dtypes(cfg, f"{where}.precision_cfg", groups, family)
        if any(g not in DECODER_GROUPS for g in over):
            raise PolicyError(f"{where}: only {', '.join(DECODER_GROUPS)} are set per decoder")
        if "precision_cfg" in entry:
            decoders[int(key)] = _tt_decoder(over)
    return base, settings, decoders
