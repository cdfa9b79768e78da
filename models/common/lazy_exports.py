# SPDX-License-Identifier: Apache-2.0
"""A package's public names, resolved on first use (PEP 562).

The caches' packages (:mod:`models.common.weight_cache`, :mod:`models.common.prefill_cache`) keep
torch-free modules beside torch ones; their ``__init__`` must name every public name without
importing any module, so that ``tt-cache ls`` imports no torch through the package face.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(package: str, namespace: dict[str, Any], exports: Mapping[str, Iterable[str]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for ``package`` whose names live in the modules of
    ``exports`` (``{module: names}``, modules relative to the package unless absolute, i.e. with a
    dot); a resolved name is stored in ``namespace`` (the package's globals), so it costs once."""
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module if "." in module else f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return __getattr__, __dir__, sorted(module_of)
