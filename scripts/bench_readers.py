# SPDX-License-Identifier: Apache-2.0
"""How each way of reading a warm cache's files moves them from an evicted page cache, side by side.

    sudo .venv/bin/python scripts/bench_readers.py                                 # Gemma 3 270M, bfloat8_b
    sudo .venv/bin/python scripts/bench_readers.py --model qwen2.5-coder-1.5b --repeat 3

The evidence behind ``models/common/prefetch.py``'s choices (docs/seeding.md). One seeded cache,
its files in the marker's order (the loader's), read in this process (no ttnn) after
``echo 3 > /proc/sys/vm/drop_caches`` (root), every case round-robin over ``--repeat`` rounds:

* ``cat`` and 4 parallel ``cat`` processes (the parallel-read floor);
* the consumer: 1 MiB copies through a mapping, file after file (what ttnn's mapping and a device
  upload do), alone, and with readers ahead of it: ``sendfile`` to ``/dev/null`` on 2 and 4
  threads, ``fadvise(WILLNEED)`` of every whole file, and the project's :class:`Prefetcher`;
* ``sendfile`` to ``/dev/null`` alone on 1, 2 and 4 threads; ``readinto`` on 4 threads.

Then, with every page cached, the consumer alone and with the same readers ahead (their cost when
there is nothing to read). Writes ``bench_readers.json`` and a PNG into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from _bench_output import DEFAULT_OUT_DIR, write_results
from bench_prefetch import cat, consume, drop_page_cache

from models.common.prefetch import Prefetcher

REPO = Path(__file__).resolve().parent.parent


def send(files: list[str]) -> None:
    """``sendfile`` each whole file to ``/dev/null``: the page cache fills, nothing is copied out."""
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        for path in files:
            fd = os.open(path, os.O_RDONLY)
            try:
                size, offset = os.fstat(fd).st_size, 0
                while offset < size and (sent := os.sendfile(sink, fd, offset, size - offset)):
                    offset += sent
            finally:
                os.close(fd)
    finally:
        os.close(sink)


def advise(files: list[str]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)


def read_into(files: list[str]) -> None:
    buffer = bytearray(8 << 20)
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buffer):
                pass


def threads(work: Callable[[list[str]], None], files: list[str], count: int) -> list[threading.Thread]:
    started = [threading.Thread(target=work, args=(files[i::count],), daemon=True) for i in range(count)]
    for thread in started:
        thread.start()
    return started


def run_all(work: Callable[[list[str]], None], files: list[str], count: int) -> None:
    for thread in threads(work, files, count):
        thread.join()


def ahead(work: Callable[[list[str]], None], files: list[str], count: int) -> None:
    """The consumer, with ``count`` threads running ``work`` over the files beside it."""
    helpers = threads(work, files, count)
    consume(files)
    for thread in helpers:
        thread.join()


def with_prefetcher(files: list[str]) -> None:
    prefetcher = Prefetcher()
    prefetcher.add(files)
    consume(files)
    prefetcher.wait()


EVICTED: dict[str, Callable[[list[str]], None]] = {
    "4 parallel cat (the floor)": lambda f: cat(f, 4, False),
    "cat": lambda f: cat(f, 1, False),
    "consumer alone": consume,
    "consumer + 2 sendfile threads": lambda f: ahead(send, f, 2),
    "consumer + 4 sendfile threads": lambda f: ahead(send, f, 4),
    "consumer + fadvise of every file": lambda f: ahead(advise, f, 1),
    "consumer + the Prefetcher": with_prefetcher,
    "sendfile, 1 thread": send,
    "sendfile, 2 threads": lambda f: run_all(send, f, 2),
    "sendfile, 4 threads": lambda f: run_all(send, f, 4),
    "readinto, 4 threads": lambda f: run_all(read_into, f, 4),
}
CACHED = ("consumer alone", "consumer + 2 sendfile threads", "consumer + 4 sendfile threads",
          "consumer + the Prefetcher")


def cache_files(model: str, precision: str, cache_root: Path) -> list[str]:
    """Seed the model's cache (in a child: ttnn) and return its files in the marker's order."""
    child = ("from models.common.device_env import ensure_host_cluster; ensure_host_cluster()\n"
             "import sys\n"
             "from models.common.weight_cache.marker import read_marker\n"
             "from models.demos.real_models.demo import make_loader\n"
             "from models.demos.real_models.known import known_model\n"
             "from models.demos.real_models.prepare import prepare_model\n"
             "model = known_model(sys.argv[1])\n"
             "loader = make_loader(model, prepare_model(model.name), sys.argv[2], '1x1')\n"
             "assert loader.seed().complete\n"
             "marker = read_marker(loader.paths)\n"
             "print('\\n'.join(str(loader.cache_dir / r.path) for r in marker.all_files()))\n")
    done = subprocess.run([sys.executable, "-c", child, model, precision], cwd=REPO, check=True, text=True,
                          capture_output=True, env=dict(os.environ, TT_CACHE_PATH=str(cache_root), PYTHONPATH=str(REPO)))
    return [line for line in done.stdout.splitlines() if line.startswith(str(cache_root))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--precision", default="bfloat8_b")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    opts = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("evicting the page cache needs root (echo 3 > /proc/sys/vm/drop_caches)")
    with tempfile.TemporaryDirectory(prefix="bench-readers-") as root:
        files = cache_files(opts.model, opts.precision, Path(root))
        size = sum(os.stat(f).st_size for f in files)
        print(f"{opts.model} {opts.precision}: {len(files)} files, {size / 2**20:,.0f} MiB, {opts.repeat} rounds, "
              f"{os.cpu_count()} cores", flush=True)
        samples: dict[str, list[float]] = {}
        for _ in range(opts.repeat):
            for name, read in EVICTED.items():
                drop_page_cache()
                start = time.perf_counter()
                read(files)
                samples.setdefault(f"evicted: {name}", []).append(time.perf_counter() - start)
            consume(files)  # every page cached from here
            for name in CACHED:
                start = time.perf_counter()
                EVICTED[name](files)
                samples.setdefault(f"cached: {name}", []).append(time.perf_counter() - start)
    medians = {case: statistics.median(values) for case, values in samples.items()}
    floor = medians["evicted: 4 parallel cat (the floor)"]
    print("\n| reader | page cache | median s | vs 4 parallel `cat` |\n| --- | --- | --- | --- |")
    for case, seconds in medians.items():
        where, name = case.split(": ", 1)
        print(f"| {name} | {where} | {seconds:.3f} | {seconds / floor:.2f}x |" if where == "evicted"
              else f"| {name} | {where} | {seconds:.3f} | |")
    groups = {where: {case.split(": ", 1)[1]: s for case, s in medians.items() if case.startswith(where)}
              for where in ("evicted", "cached")}
    write_results(opts.out_dir, "bench_readers", {"model": opts.model, "precision": opts.precision, "files": len(files),
                                                  "bytes": size, "samples": samples, "medians": medians},
                  {"": {"groups": groups, "title": f"{opts.model} {opts.precision}: reading {size / 2**20:,.0f} MiB",
                        "ylabel": "seconds (median)", "value_format": "{:.2f}"}})


if __name__ == "__main__":
    main()
