# SPDX-License-Identifier: Apache-2.0
"""The TT model interface vLLM's Tenstorrent model runner calls, one class per architecture.

``initialize_vllm_model`` builds the model through its family's loader, so a warm ttnn cache is
used and no checkpoint file is opened; then ``allocate_kv_cache``, ``prefill_forward``,
``decode_forward`` and ``read_decode_output`` serve vLLM's paged batches. The forward runs on
the host from the cached ttnn tensors (:mod:`models.vllm_plugin.host_decoder`). With an open
``mesh_device`` the loader also puts the weights on the device; a device forward is not part of
this project, so the host forward still computes the tokens.

Nothing here imports vLLM: these classes are usable (and tested) without it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import torch
from loguru import logger

from models.common.checkpoint import CheckpointError
from models.common.loader import LoadedModel
from models.common.reference import rope_kind
from models.common.weight_cache.remote.cold_start import StoreCannotServe
from models.registry import loader_class
from models.vllm_plugin.architectures import ARCHITECTURES, MODEL_CAPABILITIES, tt_architecture
from models.vllm_plugin.host_decoder import paged_decoder
from models.vllm_plugin.paged_kv import PagedBatch, PagedKVCache
from models.vllm_plugin.resolve import ResolveError, checkpoint_reference, mesh_shape_for, precision_for


class TTHostCausalLM:
    """A decoder served from the warm ttnn cache; subclasses name their family."""

    family: ClassVar[str]
    model_capabilities: ClassVar[dict[str, bool]] = MODEL_CAPABILITIES

    def __init__(self, loaded: LoadedModel, max_batch_size: int, max_seq_len: int | None,
                 mesh_device: Any = None) -> None:
        self.loaded = loaded
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len or loaded.args.max_position_embeddings
        self.mesh_device = mesh_device
        self.decoder = paged_decoder(loaded)
        self.checkpoint: str | None = None
        self.ignored_overrides: list[str] = []
        self.timings: dict[str, float] = {"weights": loaded.seconds}

    @classmethod
    def initialize_vllm_model(cls, hf_config: Any, mesh_device: Any, max_batch_size: int,
                              max_seq_len: int | None = None, n_layers: int | None = None, tt_data_parallel: int = 1,
                              optimizations: str | None = "performance", precision: str | None = None,
                              checkpoint: str | None = None, **kwargs: Any) -> TTHostCausalLM:
        """Load through the family's loader (warm from the cache when it is complete).
        ``checkpoint``: an explicit override of the model vLLM was asked for."""
        if tt_data_parallel != 1:
            raise ResolveError(f"tt_data_parallel={tt_data_parallel}: the host forward serves one replica")
        choice = checkpoint_reference(hf_config, checkpoint)
        model = choice.reference
        loader = loader_class(cls.family)(model, mesh_shape=mesh_shape_for(mesh_device),
                                          precision=precision_for(optimizations, precision),
                                          num_layers=n_layers, mesh_device=mesh_device)
        try:
            loaded = loader.load()
        except StoreCannotServe as error:  # the store's answer says what to do
            raise StoreCannotServe(f"cannot start {model}: {error}") from None
        except CheckpointError as error:
            raise CheckpointError(
                f"cannot start {model}: no warm ttnn cache for it under {loader.cache_root} and no checkpoint weights "
                f"to build one from ({error}). Build the cache where the weights are (tt-cache build) and point "
                f"TT_CACHE_PATH at it, or TT_CACHE_REMOTE at a shared store it was pushed to (tt-cache push), or make "
                f"the weights reachable (MODEL_WEIGHTS_DIR, HF_MODEL, HF_HOME)."
            ) from None
        state = "warm" if loaded.warm else f"cold ({loaded.reason})"
        logger.info(f"{cls.__name__}: {model} loaded {state} in {loaded.seconds:.3f} s from {loaded.cache_dir}")
        served = cls(loaded, max_batch_size, max_seq_len, mesh_device)
        served.checkpoint, served.ignored_overrides = model, list(choice.ignored)
        return served

    @property
    def long_context_switch(self) -> int | None:
        """For LongRoPE (Phi-3): the context length past which the long factors apply, else None.
        A sequence that grows past it is recomputed from its first token, as transformers'
        Phi-3 drops its cache there, so every key carries the long factors."""
        scaling = self.loaded.args.rope_scaling
        if isinstance(scaling, dict) and rope_kind(scaling) == "longrope":
            return int(scaling.get("original_max_position_embeddings")
                       or self.loaded.args.config.get("original_max_position_embeddings"))
        return None

    def modules(self) -> Iterator[Any]:
        """No torch submodules (the weights are ttnn tensors); vLLM's engine clean-up walks this."""
        return iter(())

    # -- KV cache ---------------------------------------------------------------------------

    def allocate_kv_cache(self, kv_cache_shape: Sequence[int], dtype: torch.dtype, num_layers: int) -> PagedKVCache:
        """Host pages for every layer. ``kv_cache_shape`` is vLLM's ``(num_blocks, kv_heads,
        block_size, head_dim)``; heads and head_dim per layer and column come from the model."""
        num_blocks, _, block_size, _ = kv_cache_shape
        layout = self.decoder.kv_layout()
        if num_layers != len(layout):
            raise ValueError(f"vLLM asked for {num_layers} KV cache layers; the model has {len(layout)}")
        return PagedKVCache.allocate(layout, int(num_blocks), int(block_size))

    # -- forward ----------------------------------------------------------------------------

    @torch.no_grad()
    def prefill_forward(self, tokens: torch.Tensor, page_table: torch.Tensor, kv_cache: PagedKVCache,
                        prompt_lens: Sequence[int], start_pos: Sequence[int] | None = None,
                        return_all_logits: Sequence[bool] | None = None,
                        **kwargs: Any) -> torch.Tensor | list[torch.Tensor]:
        """``[batch, 1, vocab]`` logits of each prompt's last token. ``tokens`` ``[batch, >=len]``
        holds each prompt (padded); positions below ``start_pos`` are already cached (a prefix
        cache hit, an earlier chunk). ``return_all_logits``: per prompt, whether to return the
        logits of every position computed (prompt logprobs) or of the last one only; the result
        is then a list of ``[positions, vocab]``."""
        starts = [0] * len(prompt_lens) if start_pos is None else [int(s) for s in start_pos]
        chunks = [(tokens[i, starts[i]:int(n)].tolist(), starts[i], page_table[i]) for i, n in enumerate(prompt_lens)]
        if not return_all_logits or not any(return_all_logits):
            return self._run(chunks, kv_cache)
        batch = PagedBatch.build(chunks, kv_cache.block_size)
        picked = [torch.arange(seq.rows.start, seq.rows.stop) if every else torch.tensor([seq.rows.stop - 1])
                  for seq, every in zip(batch.sequences, return_all_logits)]
        logits = self.decoder.run(batch, kv_cache, rows=torch.cat(picked))
        return list(logits.split([len(rows) for rows in picked]))

    @torch.no_grad()
    def decode_forward(self, tokens: torch.Tensor, start_pos: torch.Tensor, page_table: torch.Tensor | None = None,
                       kv_cache: PagedKVCache | None = None, enable_trace: bool = False, read_from_device: bool = True,
                       **kwargs: Any) -> torch.Tensor:
        """``[batch, 1, vocab]`` logits after one new token per sequence at position ``start_pos``."""
        if page_table is None or kv_cache is None:
            raise ValueError("decode_forward needs the page table and the KV cache")
        chunks = [([int(tokens[i].reshape(-1)[0])], int(start_pos[i]), page_table[i]) for i in range(len(start_pos))]
        return self._run(chunks, kv_cache)

    def read_decode_output(self, tt_out: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """The host forward's output is already on the host."""
        return tt_out

    def _run(self, chunks: list, kv_cache: PagedKVCache) -> torch.Tensor:
        batch = PagedBatch.build(chunks, kv_cache.block_size)
        return self.decoder.run(batch, kv_cache).unsqueeze(1)

    # -- warmup -----------------------------------------------------------------------------

    def warmup_model_prefill(self, kv_cache: PagedKVCache, enable_trace: bool = False, **kwargs: Any) -> None:
        """Read every weight back from its ttnn tensor now, then run one token through every
        layer in block 0 (vLLM's null block, never handed to a request)."""
        start, cpu = time.perf_counter(), time.process_time()
        nbytes = self.decoder.w.materialize()
        self.timings["materialize"] = time.perf_counter() - start
        self.timings["materialize_cpu"] = time.process_time() - cpu  # every thread's: wall above it is waiting for a core
        start = time.perf_counter()
        self.prefill_forward(torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, dtype=torch.long), kv_cache, [1])
        self.timings["warmup_forward"] = time.perf_counter() - start
        logger.info(f"{type(self).__name__}: {nbytes / 2**20:.0f} MiB of weights read back for the host forward in "
                    f"{self.timings['materialize']:.2f} s; warm-up forward {self.timings['warmup_forward']:.2f} s")

    def startup_report(self) -> dict[str, Any]:
        """How this model started: warm or cold (and why), where from, and the seconds of each step."""
        loaded = self.loaded
        return {"model": type(self).__name__, "checkpoint": self.checkpoint, "ignored_overrides": self.ignored_overrides,
                "warm": loaded.warm, "reason": loaded.reason,
                "cache_dir": str(loaded.cache_dir), "mesh_shape": list(loaded.mesh_shape),
                "layers": loaded.args.n_layers, **{f"{k}_seconds": v for k, v in self.timings.items()}}

    def warmup_model_decode(self, kv_cache: PagedKVCache, enable_trace: bool = False, **kwargs: Any) -> None:
        """Nothing to capture on the host (no traces): decode reuses the prefill path."""


def _tt_class(architecture: str, family: str) -> type[TTHostCausalLM]:
    return type(tt_architecture(architecture), (TTHostCausalLM,),
                {"family": family, "__module__": __name__,
                 "__doc__": f"vLLM's ``{tt_architecture(architecture)}``: a {family} checkpoint from the warm ttnn cache."})


# One TT<Arch>ForCausalLM per architecture of the family table (models.registry): no list of our own.
for _architecture, _family in ARCHITECTURES.items():
    globals()[tt_architecture(_architecture)] = _tt_class(_architecture, _family)
