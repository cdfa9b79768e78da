# SPDX-License-Identifier: Apache-2.0
"""A process that keeps a model loaded over a cache root too small for it, for the full-disk tests:
``python -m models.testing.full_disk_child CHECKPOINT FULL_ROOT ROOMY_ROOT``.

It cold-loads the checkpoint with ``FULL_ROOT`` as the cache root (the build hits ENOSPC and falls
back to memory), then with ``ROOMY_ROOT`` (a normal build, cached), compares the two models' tensors
and prints ``ready {json}``; then it keeps both models alive until its stdin closes, so that the
parent can look at the full file system and at this process's mappings meanwhile."""

from __future__ import annotations

import json
import sys

from models.common.device_env import ensure_host_cluster


def main(argv: list[str]) -> int:
    checkpoint, full_root, roomy_root = argv
    ensure_host_cluster()
    import torch

    from models.common.checkpoint import read_config, resolve_checkpoint_dir
    from models.registry import family_of, loader_class
    from models.testing.tiny_models import tensors_of

    cls = loader_class(family_of(read_config(resolve_checkpoint_dir(checkpoint))))
    fallback = cls(checkpoint, precision="bfloat16", cache_root=full_root).load()
    normal = cls(checkpoint, precision="bfloat16", cache_root=roomy_root).load()
    ours, theirs = tensors_of(fallback), tensors_of(normal)
    differ = sorted(name for name in theirs if name not in ours
                    or not all(torch.equal(a, b) for a, b in zip(ours[name], theirs[name], strict=True)))
    report = {"fallback_cached": fallback.cached, "normal_cached": normal.cached, "weights": len(ours),
              "differ": differ + sorted(set(ours) - set(theirs))}
    del ours, theirs  # torch copies; the models themselves stay
    print("ready " + json.dumps(report), flush=True)
    sys.stdin.read()  # the models stay alive until the parent is done looking
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
