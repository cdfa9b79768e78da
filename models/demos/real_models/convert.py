# SPDX-License-Identifier: Apache-2.0
"""GGUF -> a plain bfloat16 Hugging Face checkpoint, byte for byte what transformers' GGUF loader writes.

transformers' own route (``from_pretrained(gguf_file=...)`` + ``save_pretrained``) parses the whole
metadata with ``gguf.GGUFReader`` (10-25 s for a 262,144-entry vocabulary) and dequantizes on one
thread. Here the header is read by :mod:`~models.demos.real_models.gguf_file` without walking the
vocabulary, tensors are dequantized by the ``gguf`` package in row chunks on a few threads, and
everything that decides a value or a name is transformers' own:

* the config comes from the metadata through transformers' key table (``GGUF_CONFIG_MAPPING``),
  with the same derived fields (tied head, vocabulary size, ``gemma3`` -> ``gemma3_text``);
* tensor names come from ``get_gguf_hf_weights_map`` run on the model class built on the ``meta``
  device (no memory), and each tensor goes through the architecture's ``TensorProcessor`` (Llama's
  q/k rows un-permuted, Gemma's norms shifted back by 1) in float32, then one cast to bfloat16;
* the tokenizer is the class transformers' ``AutoTokenizer`` picks for the architecture, loaded from
  the GGUF and saved as it would be, then held to the GGUF's own rule for special tokens
  (``tokenizer.ggml.add_bos_token`` / ``add_eos_token``), whichever transformers saved it.

Per architecture only the tokenizer class is named here (``AutoTokenizer`` would re-parse the whole
metadata to find it); the slow test against transformers' own conversion checks every file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import dequantize

from models.common.cpus import usable_cpus
from models.demos.real_models.gguf_file import GgufError, GgufFile, GgufTensor, read_gguf
from models.demos.real_models.source import PrepareError

WEIGHTS_NAME = "model.safetensors"
CHUNK_BYTES = 32 << 20  # float32 bytes per dequantization job
WEIGHTS_DTYPE = "BF16"
MAX_WEIGHTS_BYTES = 50 * 10**9  # save_pretrained's default max_shard_size ("50GB")
# The tokenizer class transformers' AutoTokenizer resolves for a GGUF of each architecture.
TOKENIZER_CLASSES = {"gemma3": "GemmaTokenizer", "llama": "TokenizersBackend", "qwen2": "Qwen2Tokenizer"}
# GGUF architecture -> HF model_type where they differ (transformers' loader does the same rename).
MODEL_TYPES = {"gemma3": "gemma3_text"}


def _transformers():
    """transformers, offline: nothing here may touch the hub."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import transformers

    return transformers


def read_source(gguf_path: Path, architecture: str) -> GgufFile:
    """The GGUF's header and tensor table (tensor bytes stay mapped until dequantized); its
    architecture must be the expected one and one this conversion supports."""
    try:
        gguf = read_gguf(gguf_path)
    except GgufError as error:
        raise PrepareError(str(error)) from error
    found = gguf.metadata.get("general.architecture")
    if found != architecture:
        raise PrepareError(f"{gguf_path}: architecture {found!r}, expected {architecture!r}")
    if found not in TOKENIZER_CLASSES:
        raise PrepareError(f"{gguf_path}: architecture {found!r} is not supported; "
                           f"supported: {sorted(TOKENIZER_CLASSES)}")
    return gguf


def gguf_config_dict(gguf: GgufFile) -> dict[str, Any]:
    """The HF config dict transformers' GGUF loader derives from the metadata (its own key table),
    without its metadata parser, which reads every vocabulary entry one by one."""
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

    architecture = gguf.metadata["general.architecture"]
    updated = architecture
    if "llama" in architecture and gguf.metadata.get("general.name") == "mistral":
        updated = "mistral"  # llama.cpp files Mistral under llama; transformers renames it back
    config: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in gguf.tensors}
    defaults = GGUF_CONFIG_DEFAULTS_MAPPING.get(updated) or GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture) or {}
    for key, value in defaults.items():
        config.setdefault(key, value)
    for key, value in gguf.metadata.items():
        prefix, _, rest = key.replace(architecture, updated).partition(".")
        if isinstance(value, str) and architecture in value:
            value = value.replace(architecture, updated)
        renamed = GGUF_CONFIG_MAPPING.get(prefix, {}).get(rest)
        if renamed not in (None, -1):
            config[renamed] = value
    config["model_type"] = MODEL_TYPES.get(config["model_type"], config["model_type"])
    tokens = gguf.metadata.get("tokenizer.ggml.tokens")  # a long array is read as its length, a short one whole
    if tokens is not None:
        config.setdefault("vocab_size", tokens if isinstance(tokens, int) else len(tokens))
    return config


def hf_config(gguf: GgufFile):
    """The model's config as ``save_pretrained`` writes it: bfloat16, its class named, no quantization."""
    transformers = _transformers()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = transformers.AutoConfig.for_model(**gguf_config_dict(gguf))
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]
    config.dtype = torch.bfloat16
    return config


@contextlib.contextmanager
def _cached_tensor_name_maps() -> Iterator[None]:
    """``get_gguf_hf_weights_map`` recurses into every submodule and rebuilds gguf's whole
    ``TensorNameMap`` at each one (5 s for SmolLM2's 30 layers); the map depends only on its
    arguments and is only read, so one per (arch, layers) gives the same names."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


def tensor_plan(gguf: GgufFile, config) -> tuple[dict[str, str], Any]:
    """(GGUF name -> HF name for every tensor, the architecture's tensor processor).

    The names are transformers' own mapping of the model's parameters, built on the ``meta`` device.
    A GGUF tensor with no counterpart, or a parameter no tensor fills (other than a tied head), is
    an error: transformers would drop the one and leave the other randomly initialized."""
    transformers = _transformers()
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    architecture = gguf.metadata["general.architecture"]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=gguf_config_dict(gguf))
    with _cached_tensor_name_maps():
        mapping = get_gguf_hf_weights_map(model, processor)
    unknown = [name for name in gguf.tensors if name not in mapping]
    if unknown:
        raise PrepareError(f"{gguf.path}: GGUF tensor {unknown[0]!r} has no {config.model_type} counterpart "
                           f"({len(unknown)} such tensors)")
    plan = {name: mapping[name] for name in gguf.tensors}
    parameters = {name for name, _ in model.named_parameters()}  # a tied head appears once, as the embedding
    missing = sorted(parameters - set(plan.values()))
    if missing:
        raise PrepareError(f"{gguf.path}: no GGUF tensor for {missing[0]} ({len(missing)} parameters missing)")
    return plan, processor


def _row_chunks(shape: tuple[int, ...]) -> list[slice]:
    if len(shape) < 2:
        return [slice(0, shape[0])]
    step = max(1, CHUNK_BYTES // (4 * prod(shape[1:])))
    return [slice(start, start + step) for start in range(0, shape[0], step)]


def convert_tensor(tensor: GgufTensor, processor, pool: ThreadPoolExecutor) -> torch.Tensor:
    """One tensor as transformers' loader makes it: ``gguf.dequantize`` to float32 (row chunks on the
    pool: rows are independent blocks, so chunks give the bits of the whole), the processor on the
    whole tensor, one round-to-nearest cast to bfloat16 (chunked too)."""
    values = np.empty(tensor.shape, dtype=np.float32)

    def dequantize_rows(rows: slice) -> None:
        values[rows] = dequantize(tensor.raw[rows], tensor.qtype).reshape(-1, *tensor.shape[1:])

    chunks = _row_chunks(tensor.shape)
    list(pool.map(dequantize_rows, chunks))  # list(): re-raises a failed chunk's error
    result = processor.process(weights=values, name=tensor.name)
    if result.name != tensor.name:
        raise PrepareError(f"{tensor.name}: the tensor processor renamed it to {result.name!r}; not supported here")
    source = torch.from_numpy(np.ascontiguousarray(result.weights))
    out = torch.empty(source.shape, dtype=torch.bfloat16)
    list(pool.map(lambda rows: out[rows].copy_(source[rows]), _row_chunks(tuple(source.shape))))
    return out


def write_weights(gguf: GgufFile, plan: dict[str, str], processor, out_dir: Path) -> dict[str, tuple[int, ...]]:
    """Write model.safetensors tensor by tensor; returns every tensor's HF name and shape.

    The file is byte for byte what ``safetensors.torch.save_file(tensors, metadata={"format": "pt"})``
    (and so ``save_pretrained``) writes for these bfloat16 tensors: compact JSON header, the metadata
    first, tensors sorted by name and stored in that order, the header padded with spaces to 8 bytes.
    Streaming it keeps one tensor in memory instead of the model twice over (``save_file`` serializes
    the whole model into one buffer first). Tensors go one at a time, each split over the threads
    (see :func:`convert_tensor`)."""
    order = sorted(plan.items(), key=lambda item: item[1])
    shapes = {name: gguf.tensors[source].shape for source, name in order}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        end = offset + 2 * prod(shape)
        header[name] = {"dtype": WEIGHTS_DTYPE, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    if offset > MAX_WEIGHTS_BYTES:
        raise PrepareError(f"{gguf.path}: {offset:,} bytes of weights; save_pretrained would shard them, "
                           f"this writer writes one file (at most {MAX_WEIGHTS_BYTES:,} bytes)")
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(out_dir / WEIGHTS_NAME, "xb") as out, ThreadPoolExecutor(max_workers=min(4, usable_cpus())) as pool:
        out.write(struct.pack("<Q", len(blob)) + blob)
        for source, name in order:
            tensor = convert_tensor(gguf.tensors[source], processor, pool)
            if tuple(tensor.shape) != shapes[name]:
                raise PrepareError(f"{source}: converted to shape {tuple(tensor.shape)}, the GGUF says {shapes[name]}")
            if not bool(torch.isfinite(tensor).all()):
                raise PrepareError(f"{gguf.path}: {source} ({name}) has NaN or inf values after dequantization")
            out.write(memoryview(tensor.view(torch.int16).numpy()).cast("B"))
    return shapes


def save_config(config, out_dir: Path) -> None:
    """config.json and generation_config.json, as ``save_pretrained`` of the model writes them."""
    transformers = _transformers()
    config.save_pretrained(out_dir)
    transformers.GenerationConfig.from_model_config(config).save_pretrained(out_dir)


def save_tokenizer(gguf: GgufFile, out_dir: Path) -> None:
    """The tokenizer rebuilt from the GGUF's vocabulary, saved in the usual HF files (and the chat
    template, which the GGUF carries, as ``chat_template.jinja``), then made to add the special
    tokens the GGUF says (:func:`follow_gguf_special_tokens`)."""
    transformers = _transformers()
    tokenizer_class = getattr(transformers, TOKENIZER_CLASSES[gguf.metadata["general.architecture"]])
    tokenizer = tokenizer_class.from_pretrained(str(gguf.path.parent), gguf_file=gguf.path.name)
    tokenizer.save_pretrained(out_dir)
    follow_gguf_special_tokens(gguf.metadata, out_dir)


@dataclass(frozen=True)
class SpecialTokenRule:
    """What the GGUF's tokenizer metadata says a tokenized prompt starts and ends with."""

    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    chat_template: str | None

    @classmethod
    def of(cls, metadata: dict[str, Any]) -> SpecialTokenRule:
        template = metadata.get("tokenizer.chat_template")
        return cls(metadata.get("tokenizer.ggml.bos_token_id"), metadata.get("tokenizer.ggml.eos_token_id"),
                   bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
                   bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
                   template if isinstance(template, str) else None)

    def wrap(self, body: list[int]) -> list[int]:
        """The ids of a prompt whose tokens (without special tokens) are ``body``."""
        return [self.bos_id] * self.add_bos + list(body) + [self.eos_id] * self.add_eos


def _post_processor(rule: SpecialTokenRule, core):
    """transformers' own post-processor for these flags (``update_post_processor`` of its Llama and
    Gemma tokenizers): ``bos? $A eos?`` and ``bos? $A eos? bos?:1 $B:1 eos?:1``."""
    from tokenizers.processors import TemplateProcessing

    bos = core.id_to_token(rule.bos_id) if rule.add_bos else None
    eos = core.id_to_token(rule.eos_id) if rule.add_eos else None
    single = " ".join([f"{bos}:0"] * rule.add_bos + ["$A:0"] + [f"{eos}:0"] * rule.add_eos)
    pair = " ".join([single] + [f"{bos}:1"] * rule.add_bos + ["$B:1"] + [f"{eos}:1"] * rule.add_eos)
    special = [(bos, rule.bos_id)] * rule.add_bos + [(eos, rule.eos_id)] * (rule.add_eos and eos != bos)
    return TemplateProcessing(single=single, pair=pair, special_tokens=special)


def _follows(rule: SpecialTokenRule, core) -> bool:
    probe = "Hello world"
    return core.encode(probe).ids == rule.wrap(core.encode(probe, add_special_tokens=False).ids)


def follow_gguf_special_tokens(metadata: dict[str, Any], out_dir: Path) -> None:
    """Make ``tokenizer.json`` add ``<bos>`` / ``<eos>`` exactly as ``tokenizer.ggml.add_bos_token`` /
    ``add_eos_token`` say. Some transformers versions drop the GGUF's flags when they save (5.20
    writes Gemma 3 a post-processor without ``<bos>``), so the same GGUF would tokenize differently
    by which environment prepared it. A file that already follows the rule is left as written."""
    from tokenizers import Tokenizer

    rule = SpecialTokenRule.of(metadata)
    path = out_dir / "tokenizer.json"
    core = Tokenizer.from_file(str(path))
    if _follows(rule, core):
        return
    core.post_processor = _post_processor(rule, core)
    core.save(str(path))  # the writer save_pretrained uses: the same bytes transformers would write


def verify_special_tokens(metadata: dict[str, Any], out_dir: Path) -> None:
    """The saved tokenizer tokenizes as the GGUF says: its special tokens added by the rule, the
    GGUF's bos / eos ids named as ``bos_token`` / ``eos_token``, and the GGUF's chat template."""
    from tokenizers import Tokenizer

    rule = SpecialTokenRule.of(metadata)
    core = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    if not _follows(rule, core):
        raise PrepareError(f"tokenizer.json does not add the special tokens the GGUF says "
                           f"(add_bos_token={rule.add_bos}, add_eos_token={rule.add_eos})")
    settings = json.loads((out_dir / "tokenizer_config.json").read_text())
    for role, token_id in (("bos", rule.bos_id), ("eos", rule.eos_id)):
        if token_id is not None and settings.get(f"{role}_token") != core.id_to_token(token_id):
            raise PrepareError(f"tokenizer_config.json {role}_token {settings.get(f'{role}_token')!r}, the GGUF's "
                               f"{role} id {token_id} is {core.id_to_token(token_id)!r}")
    template = out_dir / "chat_template.jinja"
    saved = template.read_text() if template.is_file() else None
    if saved != rule.chat_template:
        raise PrepareError("chat_template.jinja is not the GGUF's tokenizer.chat_template"
                           if rule.chat_template else "chat_template.jinja written, the GGUF has no chat template")


def verify_checkpoint(out_dir: Path, model_type: str, expected: dict[str, tuple[int, ...]]) -> None:
    """Check what was written before it is published: config, tokenizer, and the weights' header
    (every expected name with its shape, all bfloat16, nothing else)."""
    from safetensors import safe_open

    config = json.loads((out_dir / "config.json").read_text())
    if config.get("model_type") != model_type:
        raise PrepareError(f"config.json model_type {config.get('model_type')!r}, expected {model_type!r}")
    if "quantization_config" in config:
        raise PrepareError("config.json still carries quantization settings")
    if not (out_dir / "tokenizer.json").is_file():
        raise PrepareError("the tokenizer was not saved (tokenizer.json missing)")
    path = out_dir / WEIGHTS_NAME
    with safe_open(str(path), framework="pt") as weights:
        found = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
        wrong = [name for name in found if weights.get_slice(name).get_dtype() != WEIGHTS_DTYPE]
    if found != expected:
        odd = sorted(set(found) ^ set(expected)) or [n for n in expected if found[n] != expected[n]]
        raise PrepareError(f"{path}: {len(found)} tensors, expected {len(expected)}; first difference: {odd[0]}")
    if wrong:
        raise PrepareError(f"{path}: {len(wrong)} tensors are not {WEIGHTS_DTYPE}, e.g. {wrong[0]}")
