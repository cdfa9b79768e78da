#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""uv vs pip for ``scripts/setup_env.sh``, as on a fresh machine: cold and warm download cache.

Each run is the real script (``TT_INSTALLER=uv|pip``) building a new venv under ``--workdir``:

* ``cold``: an empty download cache (``PIP_CACHE_DIR`` and ``UV_CACHE_DIR`` pointed at new, empty
  directories): everything comes from the package index, as on a fresh machine;
* ``warm``: the venv deleted, the cache of the cold run kept: what a rebuild after a change of
  ``requirements.txt`` costs (the stamp makes an unchanged environment return at once).

Variants: ``uv`` (as setup_env.sh runs it: bytecode left to first imports), ``uv-compile`` (uv with
``UV_COMPILE_BYTECODE=1``: every module compiled at install, as pip does) and ``pip``.

Installers run one after the other in the order given, so noise hits them alike only roughly:
compare within one run. The venvs are deleted after each run (about 7 GB each). Also checks that
both installers give the same packages at the same versions (``pip freeze``). Prints a table and
writes ``bench_setup_env.json`` and a PNG to ``--out-dir``.

    python scripts/bench_setup_env.py [--installers uv uv-compile pip] [--workdir /tmp/tt-bench-setup]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _bench_output import DEFAULT_OUT_DIR, REPO_ROOT, write_results


VARIANTS = {"uv": ("uv", {}), "uv-compile": ("uv", {"UV_COMPILE_BYTECODE": "1"}), "pip": ("pip", {})}


def build(variant: str, venv: Path, caches: Path) -> float:
    """Run setup_env.sh into ``venv`` with the download caches under ``caches``; returns seconds."""
    installer, extra = VARIANTS[variant]
    env = dict(os.environ, TT_VENV=str(venv), TT_INSTALLER=installer, PIP_CACHE_DIR=str(caches / "pip"),
               UV_CACHE_DIR=str(caches / "uv"), **extra)
    start = time.perf_counter()
    subprocess.run(["bash", str(REPO_ROOT / "scripts" / "setup_env.sh")], env=env, check=True)
    return time.perf_counter() - start


def frozen(venv: Path) -> list[str]:
    """Installed distributions and versions, the project itself left out (its line names the path)."""
    out = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze", "--exclude-editable"],
                         capture_output=True, text=True, check=True).stdout
    return sorted(line for line in out.splitlines() if line and not line.startswith(("uv==", "pip==")))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--installers", nargs="+", default=["uv", "pip"], choices=list(VARIANTS))
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/tt-bench-setup"))
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR, help="JSON + PNG go here (default: %(default)s)")
    args = parser.parse_args()

    shutil.rmtree(args.workdir, ignore_errors=True)
    seconds: dict[str, dict[str, float]] = {}
    freezes: dict[str, list[str]] = {}
    for installer in args.installers:
        caches, venv = args.workdir / f"cache-{installer}", args.workdir / f"venv-{installer}"  # own caches: cold
        seconds[installer] = {"cold": build(installer, venv, caches)}
        freezes[installer] = frozen(venv)
        shutil.rmtree(venv)
        seconds[installer]["warm"] = build(installer, venv, caches)
        shutil.rmtree(venv)
        print(f"{installer}: cold {seconds[installer]['cold']:.1f} s, warm {seconds[installer]['warm']:.1f} s", flush=True)
    shutil.rmtree(args.workdir, ignore_errors=True)

    ratios = [name for name in args.installers if name != "pip"] if "pip" in seconds else []
    print(f"\n| download cache | {' | '.join(args.installers)} |" + "".join(f" {name} / pip |" for name in ratios))
    print("| --- " * (len(args.installers) + 1 + len(ratios)) + "|")
    for state in ("cold", "warm"):
        cells = " | ".join(f"{seconds[name][state]:.1f} s" for name in args.installers)
        print(f"| {state} | {cells} |" + "".join(f" {seconds[name][state] / seconds['pip'][state]:.2f}x |" for name in ratios))
    same = len({tuple(packages) for packages in freezes.values()}) == 1
    print("\nsame packages and versions from every installer: " + ("yes" if same else "NO"))
    if not same:
        first, *others = args.installers
        for other in others:
            print(f"  only {first}: {sorted(set(freezes[first]) - set(freezes[other]))}")
            print(f"  only {other}: {sorted(set(freezes[other]) - set(freezes[first]))}")
    write_results(args.out_dir, "bench_setup_env", {"seconds": seconds, "same_packages": same, "freeze": freezes}, {
        "": dict(groups={f"{state} download cache": {name: seconds[name][state] for name in args.installers}
                         for state in ("cold", "warm")},
                 title="scripts/setup_env.sh: new venv, uv vs pip", ylabel="seconds", value_format="{:.0f}"),
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
