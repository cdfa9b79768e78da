# SPDX-License-Identifier: Apache-2.0
"""How close each weight precision keeps a real model to transformers: logits PCC and greedy top-1
agreement, per model, precision and mesh (docs/precision-fidelity.md holds the figures).

    python scripts/fidelity.py [--model NAME ...] [--precision P ...] [--mesh 1x1 ...] [--steps 32]

For each known model (prepared from its PyPI wheels: ``models.demos.real_models.prepare``),
transformers runs once in float32 in a child process (``tests/ttnn/real_models/transformers_side.py``:
each prompt's logits and its ``--steps`` greedy tokens). Each precision is then built cold into a
scratch cache, loaded warm, and run through the host reference forward (``models.common.reference``)
over the prompt and transformers' greedy tokens, one forward a prompt:

* **PCC**: of our logits and transformers' over every prompt position (the lowest of the prompts);
* **top-1**: at each of the ``--steps`` positions after the prompt, whether our argmax is the token
  transformers chose there (summed over the prompts). Teacher-forced, so it is the per-step agreement
  of greedy decoding, never counting one early miss as every later token lost.

``--precision`` is whatever the loader's ``precision=`` takes (a dtype, ``performance``,
``accuracy``, a policy file) and is built by the loader as it is: one code path for every value.
``performance`` and ``accuracy`` are tt-transformers' policies *for that model*
(``models.common.precision``): each row records the loader's policy and the dtype every tensor
group was stored in, read from the warm load (a group stored otherwise than its policy says is an
error, never a row). The JSON and a chart go to ``docs/fidelity.json`` / ``docs/fidelity.png``
through the shared ``_bench_output``; rows an earlier run wrote there that this one did not measure
again are kept, so models, meshes and precisions can be measured one run at a time. The results
table of ``docs/precision-fidelity.md`` (between its ``fidelity-table`` markers) is rewritten from
every row.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _bench_output import DEFAULT_OUT_DIR, REPO_ROOT, write_results

sys.path.insert(0, str(REPO_ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from models.common.precision import DECODER_GROUPS, MODEL_GROUPS, PrecisionPolicy, group_of  # noqa: E402
from models.common.reference import ReferenceDecoder  # noqa: E402
from models.demos.real_models.known import KNOWN_MODELS, KnownModel, known_model  # noqa: E402
from models.demos.real_models.prepare import prepare_model  # noqa: E402
from models.registry import loader_class  # noqa: E402

STEPS = 32
PROMPTS = {  # the parity tests' prompts (tests/ttnn/real_models/test_parity.py)
    False: ["The capital of France is", "def fibonacci(n):", "Water boils at"],
    True: ["What is the capital of France?", "Write a Python function that reverses a string.",
           "Explain in one sentence what a hash table is."],
}
DEFAULT_MODELS = ("smollm2-135m", "gemma3-270m")  # the two smallest: the 2 cores are shared
DEFAULT_PRECISIONS = ("bfloat16", "bfloat8_b", "bfloat4_b", "performance", "accuracy")
KEEP_FP32_BELOW_BYTES = 600 << 20  # as the parity tests: larger models read each weight back per use
TABLE_GROUPS = DECODER_GROUPS + MODEL_GROUPS  # the table's columns, where a model has the group
SHORT_DTYPES = {"bfloat16": "bf16", "bfloat8_b": "bfp8", "bfloat4_b": "bfp4", "float32": "fp32"}
DOC = "precision-fidelity.md"  # its results table sits between these markers
TABLE_START, TABLE_END = "<!-- fidelity-table: written by scripts/fidelity.py -->", "<!-- /fidelity-table -->"


def reference_side(model: KnownModel, snapshot: Path, out: Path, steps: int) -> dict[str, Any]:
    """transformers' logits and greedy tokens, from a child process (its float32 model is gone after)."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    subprocess.run([sys.executable, "-m", "tests.ttnn.real_models.transformers_side", str(snapshot), model.name,
                    str(out), str(steps), *PROMPTS[model.chat]], cwd=REPO_ROOT, env=env, check=True, timeout=3600)
    return torch.load(out)


def pcc(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.corrcoef(torch.stack([a.flatten().double(), b.flatten().double()]))[0, 1].item()


def measure(loaded: Any, model: KnownModel, expected: dict[str, Any]) -> dict[str, Any]:
    """PCC over the prompts' logits and top-1 agreement over the greedy steps, per prompt."""
    reference = ReferenceDecoder(loaded, keep_fp32=model.size < KEEP_FP32_BELOW_BYTES)
    pccs, agreed, first = [], [], []
    for ids, theirs, tokens in zip(expected["prompts"], expected["logits"], expected["greedy"], strict=True):
        forced = reference.logits(ids + tokens[:-1])
        chosen = forced[len(ids) - 1:].argmax(-1).tolist()
        pccs.append(pcc(forced[: len(ids)], theirs))
        agreed.append(sum(a == b for a, b in zip(chosen, tokens)))
        first.append(chosen[0] == tokens[0])
    steps = len(expected["greedy"][0])
    return {"pcc_min": min(pccs), "pcc": pccs, "top1": agreed, "top1_rate": sum(agreed) / (steps * len(agreed)),
            "first_token_equal": sum(first), "prompts": len(pccs), "steps": steps}


def stored_dtypes(loaded: Any, policy: PrecisionPolicy, label: str) -> dict[str, list[str]]:
    """The dtypes each tensor group was stored in, read from the warm load's formats (several: a
    per-decoder override); RuntimeError where a weight is not in the dtype its policy gives it."""
    stored: dict[str, set[str]] = {}
    for name, fmt in loaded.formats.items():
        try:
            group, _ = group_of(name)
            wanted = policy.dtype_of(name)
        except LookupError:  # embeddings, norms, routers, biases: no policy group
            continue
        dtype = fmt.dtype.name.lower()
        if dtype != wanted:
            raise RuntimeError(f"{label}: {name} is stored in {dtype}, its policy {policy.label} says {wanted}")
        stored.setdefault(group, set()).add(dtype)
    return {group: sorted(dtypes) for group, dtypes in sorted(stored.items())}


class Builds:
    """Warm loads of one model on one mesh, one per precision, each built cold first into a scratch cache."""

    def __init__(self, model: KnownModel, snapshot: Path, mesh: tuple[int, int], root: Path) -> None:
        self.model, self.snapshot, self.mesh, self.root = model, snapshot, mesh, root
        self.seconds: dict[str, dict[str, float]] = {}

    def load(self, precision: str) -> tuple[Any, PrecisionPolicy]:
        """The warm load of ``precision`` as the loader builds it, and the loader's policy of it
        (ValueError: the loader does not take it)."""
        cls = loader_class(self.model.family)
        cache = self.root / f"{self.mesh[0]}x{self.mesh[1]}"
        start = time.perf_counter()
        cls(str(self.snapshot), precision=precision, mesh_shape=self.mesh, cache_root=cache).load()
        cold = time.perf_counter() - start
        start = time.perf_counter()
        loader = cls(str(self.snapshot), precision=precision, mesh_shape=self.mesh, cache_root=cache)
        warm = loader.load()
        if not warm.warm:
            raise RuntimeError(f"{self.model.name} {precision}: the second load was not warm ({warm.reason})")
        self.seconds[precision] = {"cold": cold, "warm": time.perf_counter() - start}
        return warm, loader.policy


def run(models: list[str], precisions: list[str], meshes: list[tuple[int, int]], steps: int) -> list[dict[str, Any]]:
    rows = []
    scratch = Path(tempfile.mkdtemp(prefix="fidelity-"))
    try:
        for name in models:
            model = known_model(name)
            snapshot = prepare_model(name)
            expected = reference_side(model, snapshot, scratch / f"{name}.pt", steps)
            for mesh in meshes:
                builds = Builds(model, snapshot, mesh, scratch / name)
                for precision in precisions:
                    try:
                        loaded, policy = builds.load(precision)
                    except ValueError as error:
                        print(f"{name} {precision}: not measured ({error})")
                        continue
                    label = f"{name} {precision} {mesh[0]}x{mesh[1]}"
                    start = time.perf_counter()
                    result = measure(loaded, model, expected)
                    row = {"model": name, "precision": precision, "mesh": f"{mesh[0]}x{mesh[1]}",
                           "policy": policy.describe(), "stored": stored_dtypes(loaded, policy, label),
                           "forward_s": time.perf_counter() - start, **result,
                           "build_s": builds.seconds.get(precision)}
                    rows.append(row)
                    print(table_row(row), flush=True)
                    del loaded
                    gc.collect()
                del builds
                gc.collect()
                shutil.rmtree(scratch / name, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return rows


HEADER = ("| model | precision | mesh | stored: " + " / ".join(TABLE_GROUPS[:5]) +
          " | logits PCC (min of 3) | top-1 agreement | per prompt | first token |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")


def stored_cell(row: dict[str, Any]) -> str:
    """The dtype of each tensor group, in :data:`TABLE_GROUPS` order (a group the model lacks left
    out); in a policy that mixes dtypes, its bfloat4_b groups in bold."""
    stored = row.get("stored")
    if not stored:
        return "not recorded"
    cells = ["+".join(SHORT_DTYPES.get(d, d) for d in stored[group]) for group in TABLE_GROUPS if group in stored]
    mixed = len(set(cells)) > 1
    return " / ".join(f"**{cell}**" if mixed and "bfp4" in cell else cell for cell in cells)


def table_row(row: dict[str, Any]) -> str:
    agreed = ", ".join(f"{n}/{row['steps']}" for n in row["top1"])
    return (f"| {row['model']} | {row['precision']} | {row['mesh']} | {stored_cell(row)} | {row['pcc_min']:.6f} | "
            f"{row['top1_rate'] * 100:.1f}% | {agreed} | {row['first_token_equal']}/{row['prompts']} |")


def measured_key(row: dict[str, Any]) -> tuple[str, str, str]:
    return row["model"], row["mesh"], row["precision"]


def table_order(row: dict[str, Any]) -> tuple:
    """Models as :data:`KNOWN_MODELS` lists them, then mesh, then the default precisions' order."""
    names, precisions = list(KNOWN_MODELS), list(DEFAULT_PRECISIONS)
    rank = precisions.index(row["precision"]) if row["precision"] in precisions else len(precisions)
    return (names.index(row["model"]) if row["model"] in names else len(names), row["mesh"], rank, row["precision"])


def earlier_rows(path: Path, rows: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """The rows an earlier run wrote (at the same steps) that this run did not measure again: a
    shared machine measures one model or mesh at a time, and the table keeps them all."""
    if not path.exists():
        return []
    earlier = json.loads(path.read_text())
    if earlier.get("steps") != steps:
        return []
    measured = {measured_key(row) for row in rows}
    return [row for row in earlier.get("rows", []) if measured_key(row) not in measured]


def write_table(doc: Path, rows: list[dict[str, Any]]) -> None:
    """Rewrite the results table between the markers of ``doc`` (left alone without them)."""
    if not doc.exists():
        return
    text = doc.read_text()
    head, start, rest = text.partition(TABLE_START)
    _, end, tail = rest.partition(TABLE_END)
    if not (start and end):
        print(f"{doc}: no {TABLE_START} ... {TABLE_END} markers: table not written")
        return
    table = "\n".join([HEADER, *(table_row(row) for row in rows)])
    doc.write_text(f"{head}{TABLE_START}\n{table}\n{TABLE_END}{tail}")


def publish(out_dir: Path, steps: int, rows: list[dict[str, Any]]) -> None:
    """``fidelity.json`` (every row), ``fidelity.png`` (top-1 agreement per model, mesh and precision)
    and the table of ``precision-fidelity.md``."""
    rows = sorted(rows, key=table_order)
    groups: dict[str, dict[str, float]] = {}
    for row in rows:
        groups.setdefault(f"{row['model']} {row['mesh']}", {})[row["precision"]] = round(row["top1_rate"] * 100, 1)
    write_results(out_dir, "fidelity", {"steps": steps, "prompts": PROMPTS, "rows": rows},
                  {"": {"groups": groups, "title": f"greedy top-1 agreement with transformers ({steps} steps)",
                        "ylabel": "% of steps", "value_format": "{:.0f}"}})
    write_table(out_dir / DOC, rows)


def parse_mesh(text: str) -> tuple[int, int]:
    rows, _, columns = text.partition("x")
    if not (rows.isdigit() and columns.isdigit()):
        raise argparse.ArgumentTypeError(f"mesh {text!r}: expected ROWSxCOLUMNS, e.g. 1x8")
    return int(rows), int(columns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", choices=sorted(KNOWN_MODELS), help=f"default: {DEFAULT_MODELS}")
    parser.add_argument("--precision", action="append", help=f"default: {DEFAULT_PRECISIONS}")
    parser.add_argument("--mesh", action="append", type=parse_mesh, help="default: 1x1 and 1x8 (T3K)")
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # see tests/ttnn/real_models/conftest.py: one_torch_thread
    print(HEADER)
    rows = run(args.model or list(DEFAULT_MODELS), args.precision or list(DEFAULT_PRECISIONS),
               args.mesh or [(1, 1), (1, 8)], args.steps)
    publish(args.out_dir, args.steps, earlier_rows(args.out_dir / "fidelity.json", rows, args.steps) + rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
