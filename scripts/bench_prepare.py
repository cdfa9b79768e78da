#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Preparing a known real model: the gguf-package conversion vs transformers' GGUF loader, side by side.

Each case is a fresh process (``models.common.measure``), run round-robin ``--repeat`` times:

* ``gguf package``: ``prepare_model(MODEL)`` into a new, empty model root: the whole prepare (GGUF
  already assembled, as after a first run, and re-hashed), convert, verify, seal, publish;
* ``transformers``: ``models.demos.real_models.transformers_recipe``, transformers' own conversion,
  into a new directory (convert only: no verify, seal or publish).

Reports wall seconds, CPU seconds (user + system, all threads: on a shared machine the figure that
does not depend on the neighbours) and peak RSS (own VmHWM) of each, checks the files are byte for
byte the same, prints a table and writes ``bench_prepare.json`` and PNGs to ``--out-dir``.

    python scripts/bench_prepare.py [--model gemma3-270m] [--repeat 1] [--workdir /tmp/tt-bench-prepare]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

from _bench_output import DEFAULT_OUT_DIR, REPO_ROOT, write_results

sys.path.insert(0, str(REPO_ROOT))

from models.common.fileio import sha256_file  # noqa: E402
from models.common.measure import run_measured  # noqa: E402
from models.demos.real_models.known import DEFAULT_MODEL, KNOWN_MODELS, known_model  # noqa: E402
from models.demos.real_models.prepare import MANIFEST_NAME  # noqa: E402
from models.demos.real_models.source import assemble_gguf  # noqa: E402

CASES = {
    "gguf package": r"""
import resource, sys, time
from models.common.measure import report
from models.demos.real_models.prepare import prepare_model
start = time.perf_counter()
snapshot = prepare_model(sys.argv[3], sys.argv[1])
usage = resource.getrusage(resource.RUSAGE_SELF)
report({"seconds": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime, "out": str(snapshot)})
""",
    "transformers": r"""
import resource, sys, time
from pathlib import Path
from models.common.measure import report
from models.demos.real_models.transformers_recipe import convert_with_transformers
start = time.perf_counter()
convert_with_transformers(Path(sys.argv[2]), Path(sys.argv[1]))
usage = resource.getrusage(resource.RUSAGE_SELF)
report({"seconds": time.perf_counter() - start, "cpu_s": usage.ru_utime + usage.ru_stime, "out": sys.argv[1]})
""",
}


def digests(directory: Path) -> dict[str, str]:
    return {path.name: sha256_file(path) for path in sorted(directory.iterdir())
            if path.is_file() and path.name != MANIFEST_NAME}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=list(KNOWN_MODELS))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tt-bench-prepare"))
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="JSON + PNG go here (default: %(default)s)")
    args = parser.parse_args()

    model = known_model(args.model)
    gguf_path = assemble_gguf(model)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT))
    samples: dict[str, list[dict]] = {case: [] for case in CASES}
    files: dict[str, dict[str, str]] = {}
    for round_ in range(args.repeat):
        for case, code in CASES.items():
            out = args.workdir / f"{case.replace(' ', '-')}-{round_}"
            shutil.rmtree(out, ignore_errors=True)
            result = run_measured([sys.executable, "-c", code, str(out), str(gguf_path), model.name], env=env, cwd=REPO_ROOT)
            samples[case].append(result)
            files[case] = digests(Path(result["out"]))
            shutil.rmtree(out, ignore_errors=True)
            print(f"{case}: {result['seconds']:.1f} s, CPU {result['cpu_s']:.1f} s, "
                  f"peak RSS {result['peak_rss_mib']:.0f} MiB", flush=True)
    same = files["gguf package"] == files["transformers"]

    med = {case: {key: statistics.median(r[key] for r in rows) for key in ("seconds", "process_s", "cpu_s", "peak_rss_mib")}
           for case, rows in samples.items()}
    fast, slow = med["gguf package"], med["transformers"]
    print(f"\n| conversion (median of {args.repeat}) | in-process s | process s | CPU s | peak RSS MiB |")
    print("| --- | --- | --- | --- | --- |")
    for case, r in med.items():
        print(f"| {case} | {r['seconds']:.1f} | {r['process_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_rss_mib']:.0f} |")
    target = f"; whole prepare < 20 s: {'met' if fast['process_s'] < 20 else 'MISSED'}" if model.name == DEFAULT_MODEL else ""
    print(f"\n{model.name}: gguf package / transformers: wall {fast['process_s'] / slow['process_s']:.2f}x, "
          f"CPU {fast['cpu_s'] / slow['cpu_s']:.2f}x{target} ({fast['process_s']:.1f} s)")
    print("same files, byte for byte: " + ("yes" if same else f"NO: {files}"))
    name = "bench_prepare" if model.name == DEFAULT_MODEL else f"bench_prepare_{model.name}"
    write_results(args.out_dir, name, {"model": model.name, "repeat": args.repeat, "median": med,
                                       "samples": samples, "same_files": same, "sha256": files}, {
        "": dict(groups={"wall s (whole process)": {case: r["process_s"] for case, r in med.items()},
                         "CPU s (all threads)": {case: r["cpu_s"] for case, r in med.items()}},
                 title=f"prepare {model.name} (GGUF -> bf16 safetensors + tokenizer)", ylabel="seconds",
                 value_format="{:.1f}"),
        "rss": dict(groups={"peak RSS (own VmHWM)": {case: r["peak_rss_mib"] for case, r in med.items()}},
                    title=f"prepare {model.name}: peak RSS", ylabel="MiB", value_format="{:.0f}"),
    })
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
