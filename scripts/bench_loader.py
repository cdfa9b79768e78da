# SPDX-License-Identifier: Apache-2.0
"""Cold vs warm model loading, side by side in one run, each case in a fresh process.

    python scripts/bench_loader.py                      # a ~0.7 GB llama-shaped checkpoint made here
    python scripts/bench_loader.py --model gemma3-270m  # the real Gemma 3 270M (prepared if needed)

Cases (median of ``--repeat`` rounds, run round-robin so machine noise hits all alike):

* ``import``: a bare ``python -c "import torch, ttnn"`` process.
* ``cold``: a full cold build (``TT_TRANSFORMERS_FORCE_MODEL_LOAD=1``): checkpoint read, convert,
  write, hash, mark. Also reports the summed ``ttnn.from_torch`` time of its weights.
* ``warm lazy``: a warm build; ``ttnn.load_tensor`` maps files lazily, so this is NOT the time to
  have the bytes: see the next case.
* ``warm pages``: a warm build, then every page of every cached file read once (one byte each);
  ``warm bytes``: every byte copied once (what a device upload moves).
* ``warm process``: a whole ``python`` process doing a warm start (imports included).
* ``transformers``: ``AutoModelForCausalLM.from_pretrained`` of the same checkpoint (bf16).
* ``cat``: ``cat`` of the cache files to /dev/null: the raw read, the physical floor.
Peak RSS is each case process's own ``VmHWM`` (``models.common.measure``; ``ru_maxrss`` would carry
this script's peak into every child). Page cache is warm for every case. Results also go to
``--out-dir`` as ``bench_loader-<model>.json`` and a PNG chart (cold vs warm vs transformers vs cat).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from _bench_output import DEFAULT_OUT_DIR, write_results  # noqa: E402

from models.common.measure import run_measured  # noqa: E402
from models.registry import FAMILY_LOADERS as FAMILIES  # noqa: E402  (family name -> "module:Class")

PY = sys.executable

CASE = r"""
import mmap, os, sys, time
t0 = time.perf_counter()
case, family, model, precision, mesh = sys.argv[1:6]
result = {}
if case == "import":
    import torch, ttnn
elif case == "transformers":
    import torch
    from transformers import AutoModelForCausalLM
    t = time.perf_counter()
    AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)
    result["inner"] = time.perf_counter() - t
else:
    import importlib
    module, name = family.split(":")
    loader_cls = getattr(importlib.import_module(module), name)
    t = time.perf_counter()
    loaded = loader_cls(model, precision=precision, mesh_shape=mesh).load()
    result["inner"] = time.perf_counter() - t
    result["warm"] = loaded.warm
    result.update({f"t_{k}": v for k, v in loaded.timings.items()})
    if case in ("warm_pages", "warm_bytes"):
        t = time.perf_counter()
        page, chunk = mmap.PAGESIZE, bytearray(1 << 20)
        for path in sorted(loaded.cache_dir.rglob("*.tensorbin")):
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
                if case == "warm_pages":  # one byte of every page: each page brought in once
                    sum(m[i] for i in range(0, len(m), page))
                else:  # every byte copied once, 1 MiB at a time (what a device upload moves)
                    source, target = memoryview(m), memoryview(chunk)
                    for start in range(0, len(m), len(chunk)):
                        piece = source[start : start + len(chunk)]
                        target[: len(piece)] = piece
                    del source, piece, target
        result["pages"] = time.perf_counter() - t
        result["inner"] += result["pages"]
    from models.common.weight_cache.layout import cache_bytes
    result["cache_bytes"] = cache_bytes(loaded.cache_dir)
    result["cache_dir"] = str(loaded.cache_dir)
result["process"] = time.perf_counter() - t0
from models.common.measure import report
report(result)  # adds this process's own peak RSS (VmHWM)
"""


def run_case(case: str, family: str, model: str, precision: str, mesh: str, env: dict[str, str]) -> dict:
    """One case in a fresh interpreter; ``wall`` is the whole process, ``rss_mib`` its own peak RSS."""
    result = run_measured([PY, "-c", CASE, case, FAMILIES[family], model, precision, mesh], env=env, cwd=REPO)
    result["wall"], result["rss_mib"] = result.pop("process_s"), result.pop("peak_rss_mib")
    return result


def cat_seconds(cache_dir: str) -> float:
    files = [str(p) for p in sorted(Path(cache_dir).rglob("*.tensorbin"))]
    start = time.perf_counter()
    subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def make_llama_checkpoint(directory: Path, layers: int) -> Path:
    """A llama-shaped bf16 checkpoint of random weights (hidden 2048, GQA 32/8 heads)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    if (directory / "model.safetensors").is_file():
        return directory
    config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=32000, tie_word_embeddings=False, dtype="bfloat16")
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(directory)
    g = torch.Generator().manual_seed(0)
    rand = lambda *shape: (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)  # noqa: E731
    tensors = {"model.embed_tokens.weight": rand(32000, 2048), "lm_head.weight": rand(32000, 2048),
               "model.norm.weight": torch.ones(2048, dtype=torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {p + "self_attn.q_proj.weight": rand(2048, 2048), p + "self_attn.k_proj.weight": rand(512, 2048),
                    p + "self_attn.v_proj.weight": rand(512, 2048), p + "self_attn.o_proj.weight": rand(2048, 2048),
                    p + "mlp.gate_proj.weight": rand(5632, 2048), p + "mlp.up_proj.weight": rand(5632, 2048),
                    p + "mlp.down_proj.weight": rand(2048, 5632),
                    p + "input_layernorm.weight": torch.ones(2048, dtype=torch.bfloat16),
                    p + "post_attention_layernorm.weight": torch.ones(2048, dtype=torch.bfloat16)}
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-synthetic", help="checkpoint dir, 'gemma3-270m' or 'llama-synthetic'")
    parser.add_argument("--family", default=None, choices=sorted(FAMILIES))
    parser.add_argument("--precision", nargs="+", default=["bfloat8_b", "bfloat16"])
    parser.add_argument("--mesh", default="1x1")
    parser.add_argument("--layers", type=int, default=4, help="layers of the synthetic llama")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "tt-bench-loader")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR,
                        help="where bench_loader-<model>.json and its PNG go (default: %(default)s)")
    opts = parser.parse_args()

    if opts.model == "llama-synthetic":
        model, family = str(make_llama_checkpoint(opts.workdir / "llama-synthetic", opts.layers)), "llama"
    elif opts.model == "gemma3-270m":
        from models.demos.real_models.prepare import prepare_gemma3_270m

        model, family = str(prepare_gemma3_270m()), "gemma3"
    else:
        model, family = opts.model, opts.family or "llama"
    weights = sum(p.stat().st_size for p in Path(model).glob("*.safetensors"))
    print(f"model {model} ({family}), checkpoint {weights / 2**20:.0f} MiB, mesh {opts.mesh}, "
          f"{opts.repeat} rounds, {os.cpu_count()} cores")

    env = dict(os.environ, TT_CACHE_PATH=str(opts.workdir / "cache"), HF_HUB_OFFLINE="1")
    forced = dict(env, TT_TRANSFORMERS_FORCE_MODEL_LOAD="1")
    report = {}
    for precision in opts.precision:
        samples: dict[str, list[dict]] = {}
        run_case("cold", family, model, precision, opts.mesh, forced)  # seed once before measuring
        for _ in range(opts.repeat):
            plan = [("import", env), ("cold", forced), ("warm_lazy", env), ("warm_pages", env), ("warm_bytes", env),
                    ("transformers", env)]
            for case, case_env in plan:
                samples.setdefault(case, []).append(run_case(case, family, model, precision, opts.mesh, case_env))
            samples.setdefault("cat", []).append({"inner": cat_seconds(samples["warm_lazy"][-1]["cache_dir"])})
        report[precision] = summarize(samples)
        print_table(precision, report[precision])
    label = opts.model if opts.model in ("llama-synthetic", "gemma3-270m") else Path(opts.model).name
    write_output(opts.out_dir, label, {"model": model, "family": family, "mesh": opts.mesh, "rounds": opts.repeat,
                  "checkpoint_bytes": weights, "precisions": report})


def write_output(out_dir: Path, label: str, results: dict) -> None:
    """JSON of every median, and two charts per model: seconds (cold vs warm vs transformers vs
    cat, log scale) and each case process's peak RSS, grouped by precision."""
    seconds, rss = {}, {}
    for precision, r in results["precisions"].items():
        seconds[precision] = {"cold build": r["cold"]["inner"], "warm, pages read": r["warm_pages"]["inner"],
                              "warm, bytes copied": r["warm_bytes"]["inner"],
                              "transformers from_pretrained": r["transformers"]["inner"], "cat of the cache": r["cat"]["inner"]}
        rss[precision] = {"bare import torch, ttnn": r["import"]["rss_mib"], "cold build": r["cold"]["rss_mib"],
                          "warm + pages": r["warm_pages"]["rss_mib"], "transformers": r["transformers"]["rss_mib"]}
    title = f"{label}, mesh {results['mesh']}: median of {results['rounds']}, page cache warm"
    write_results(out_dir, f"bench_loader-{label}", results, {
        "": dict(groups=seconds, title=f"load time, {title}", ylabel="seconds (log scale)", log=True),
        "rss": dict(groups=rss, title=f"peak RSS of each process (own VmHWM), {label}", ylabel="MiB",
                    value_format="{:.0f}"),
    })


def summarize(samples: dict[str, list[dict]]) -> dict[str, dict[str, float]]:
    keys = ("inner", "process", "wall", "rss_mib", "t_from_torch", "pages", "cache_bytes")
    return {case: {k: statistics.median(r[k] for r in rows) for k in keys if all(k in r for r in rows)}
            for case, rows in samples.items()}


def print_table(precision: str, r: dict[str, dict[str, float]]) -> None:
    cold, lazy, pages, cat = r["cold"]["inner"], r["warm_lazy"]["inner"], r["warm_pages"]["inner"], r["cat"]["inner"]
    bare = r["import"]["wall"]
    print(f"\n### {precision}: cache {r['warm_lazy']['cache_bytes'] / 2**20:.0f} MiB")
    print("| case | seconds | peak RSS MiB |\n| --- | --- | --- |")
    print(f"| bare `import torch, ttnn` process | {bare:.3f} | {r['import']['rss_mib']:.0f} |")
    print(f"| cold build (summed ttnn.from_torch {r['cold']['t_from_torch']:.3f}) | {cold:.3f} | {r['cold']['rss_mib']:.0f} |")
    print(f"| warm build, lazy (files mapped, bytes not read) | {lazy:.4f} | {r['warm_lazy']['rss_mib']:.0f} |")
    print(f"| warm build + every page read once | {pages:.4f} | {r['warm_pages']['rss_mib']:.0f} |")
    print(f"| warm build + every byte copied once | {r['warm_bytes']['inner']:.4f} | {r['warm_bytes']['rss_mib']:.0f} |")
    print(f"| whole warm-start process (imports included) | {r['warm_lazy']['wall']:.3f} | {r['warm_lazy']['rss_mib']:.0f} |")
    print(f"| transformers from_pretrained (bf16) | {r['transformers']['inner']:.3f} | {r['transformers']['rss_mib']:.0f} |")
    print(f"| cat of the cache files | {cat:.4f} | |")
    print("\n| ratio | measured | target |\n| --- | --- | --- |")
    print(f"| cold / summed from_torch | {cold / r['cold']['t_from_torch']:.2f}x | <= 1.1x |")
    print(f"| warm (pages read) / cat | {pages / cat:.2f}x | <= 1.5x |")
    print(f"| warm (every byte copied) / cat | {r['warm_bytes']['inner'] / cat:.2f}x | (<= 1.5x) |")
    print(f"| warm (pages read) / cold | 1/{cold / pages:.0f} | <= 1/20 |")
    print(f"| warm-start process / bare import | {r['warm_lazy']['wall'] / bare:.2f}x | <= 1.3x |")
    rss_budget = r["import"]["rss_mib"] + r["warm_lazy"]["cache_bytes"] / 2**20
    print(f"| warm (pages) peak RSS / (import RSS + cache MiB) | {r['warm_pages']['rss_mib']:.0f} / {rss_budget:.0f} MiB | <= 1 |")


if __name__ == "__main__":
    main()
