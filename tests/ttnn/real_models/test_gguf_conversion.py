# SPDX-License-Identifier: Apache-2.0
"""The conversion against transformers' own GGUF loader, on complete tiny GGUF files (no download).

For each supported architecture (gemma3, llama, qwen2) a two-layer model is written with the
``gguf`` package's writer, in the storage types the real files use (Q4_1, Q5_0, Q8_0, Q4_K, Q6_K,
F32), with and without a separate output head. ``models.demos.real_models.convert`` must give the
config dict and every tensor (name, shape, bfloat16 bits) that transformers'
``load_gguf_checkpoint`` gives for the same file, in a model.safetensors whose bytes are ``save_file``'s: the Llama q/k row un-permutation, Gemma's shifted
norms, Qwen2's q/k/v biases and the tied or separate head included. The real models' byte identity
(``tests/real_models/test_prepare.py``, ``slow``) checks the same on the full files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from models.demos.real_models import convert

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 256, 4, 2, 512, 512, 2
HEAD_DIM = HIDDEN // HEADS


def _layer_tensors(architecture: str) -> dict[str, tuple[int, ...]]:
    layer = {
        "attn_norm.weight": (HIDDEN,), "attn_q.weight": (HEADS * HEAD_DIM, HIDDEN),
        "attn_k.weight": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_v.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
        "attn_output.weight": (HIDDEN, HEADS * HEAD_DIM), "ffn_norm.weight": (HIDDEN,),
        "ffn_gate.weight": (FFN, HIDDEN), "ffn_up.weight": (FFN, HIDDEN), "ffn_down.weight": (HIDDEN, FFN),
    }
    if architecture == "qwen2":
        layer |= {"attn_q.bias": (HEADS * HEAD_DIM,), "attn_k.bias": (KV_HEADS * HEAD_DIM,),
                  "attn_v.bias": (KV_HEADS * HEAD_DIM,)}
    if architecture == "gemma3":
        layer |= {"attn_q_norm.weight": (HEAD_DIM,), "attn_k_norm.weight": (HEAD_DIM,),
                  "post_attention_norm.weight": (HIDDEN,), "post_ffw_norm.weight": (HIDDEN,)}
    return layer


def write_tiny_model(path: Path, architecture: str, *, separate_head: bool) -> None:
    """A complete two-layer model of ``architecture``, quantized the way llama.cpp files are."""
    import gguf

    rng = np.random.default_rng(sum(map(ord, architecture)))
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_string("general.name", f"tiny {architecture}")
    writer.add_block_count(LAYERS)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    if architecture == "llama":
        writer.add_rope_dimension_count(HEAD_DIM)
    if architecture == "gemma3":
        writer.add_key_length(HEAD_DIM)
        writer.add_value_length(HEAD_DIM)
    writer.add_token_list([f"tok{i}" for i in range(VOCAB)])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    tensors = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,)}
    if separate_head:
        tensors["output.weight"] = (VOCAB, HIDDEN)
    for layer in range(LAYERS):
        tensors |= {f"blk.{layer}.{name}": shape for name, shape in _layer_tensors(architecture).items()}
    kinds = [gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q5_0, gguf.GGMLQuantizationType.Q8_0,
             gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K]
    for index, (name, shape) in enumerate(tensors.items()):
        if len(shape) == 1:
            qtype, raw = gguf.GGMLQuantizationType.F32, rng.standard_normal(shape, dtype=np.float32) + ("norm" in name)
        else:
            qtype = kinds[index % len(kinds)]
            if qtype in (gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K):
                # gguf cannot quantize k-quants: random blocks, bytes < 64 so every float16 scale is finite
                raw = rng.integers(0, 64, gguf.quant_shape_to_byte_shape(shape, qtype), dtype=np.uint8)
            else:
                raw = gguf.quantize(rng.standard_normal(shape, dtype=np.float32), qtype)
        writer.add_tensor(name, raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("separate_head", [False, True], ids=["tied", "separate-head"])
@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gemma3"])
def test_conversion_equals_transformers_gguf_loader(architecture: str, separate_head: bool, tmp_path: Path) -> None:
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = tmp_path / f"{architecture}.gguf"
    write_tiny_model(path, architecture, separate_head=separate_head)

    source = convert.read_source(path, architecture)
    config = convert.hf_config(source)
    plan, processor = convert.tensor_plan(source, config)
    shapes = convert.write_weights(source, plan, processor, tmp_path)
    ours = load_file(tmp_path / convert.WEIGHTS_NAME)

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    theirs = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model, torch_dtype=torch.bfloat16)

    assert convert.gguf_config_dict(source) == theirs["config"]
    assert config.tie_word_embeddings is not separate_head
    assert sorted(ours) == sorted(theirs["tensors"]) == list(shapes)
    for name, tensor in theirs["tensors"].items():
        assert ours[name].dtype == torch.bfloat16 and torch.equal(ours[name], tensor), name
    # the streamed file is, byte for byte, what save_file (and so save_pretrained) writes for these tensors
    save_file(theirs["tensors"], str(tmp_path / "save_file.safetensors"), metadata={"format": "pt"})
    assert (tmp_path / convert.WEIGHTS_NAME).read_bytes() == (tmp_path / "save_file.safetensors").read_bytes()
    if architecture == "llama":  # the q/k rows really were un-permuted (a no-op would pass the test above only by luck)
        raw = torch.from_numpy(source.tensors["blk.0.attn_q.weight"].dequantize()).to(torch.bfloat16)
        assert not torch.equal(ours["model.layers.0.self_attn.q_proj.weight"], raw)
    if architecture == "qwen2":
        assert "model.layers.1.self_attn.v_proj.bias" in ours
