# SPDX-License-Identifier: Apache-2.0
"""The package face of ``models.common.weight_cache``: the seed design's public names with their
signatures, a handful of the project's own, and every other name imported from the module that
defines it (one import path per name)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from models.common import weight_cache as wc
from models.testing import REPO_ROOT

# the seed's public names; for a function, its positional parameters then its keyword-only ones
SEED_SIGNATURES: dict[str, tuple[tuple[str, ...], tuple[str, ...]] | None] = {
    "WEIGHT_CACHE_MARKER": None,
    "HOST_WEIGHTS_SIDECAR": None,
    "WEIGHT_CACHE_FORMAT_VERSION": None,
    "DEFAULT_FORCE_ENV": None,
    "CachedStateDict": None,
    "checkpoint_name": (("model_path",), ()),
    "marker_path": (("cache_path", "build_variant"), ()),
    "normalize_mesh_shape": (("mesh_shape",), ()),
    "list_cache_files": (("cache_path",), ()),
    "load_host_sidecar": (("cache_path",), ("consume",)),
    "weight_cache_is_complete": (
        ("cache_path",), ("model_name", "n_layers", "mesh_shape", "components", "build_variant", "force_env")),
    "mark_weight_cache_complete": (
        ("cache_path", "state_dict"),
        ("model_name", "n_layers", "mesh_shape", "components", "build_variant", "is_moe", "is_host_weight")),
    "build_cached_state_dict": (("cache_path", "host", "args", "build_variant"), ()),
}
MAX_PROJECT_NAMES = 12  # "about ten": past this the face grows back into a second import path


@pytest.mark.parametrize("name", sorted(SEED_SIGNATURES))
def test_the_seed_names_import_from_the_package_with_the_seeds_signatures(name):
    value = getattr(wc, name)
    expected = SEED_SIGNATURES[name]
    if expected is None:
        return
    parameters = inspect.signature(value).parameters.values()
    positional = tuple(p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD)
    keyword = tuple(p.name for p in parameters if p.kind is p.KEYWORD_ONLY)
    assert positional[:len(expected[0])] == expected[0]
    assert set(expected[1]) <= set(keyword) | set(positional[len(expected[0]):])


def test_the_face_is_the_seeds_names_and_about_ten_of_the_projects():
    project = set(wc.__all__) - set(SEED_SIGNATURES)
    assert set(SEED_SIGNATURES) <= set(wc.__all__)
    assert len(project) <= MAX_PROJECT_NAMES, sorted(project)


def _defined(module: Path) -> set[str]:
    """The names a module defines at its top level (not the ones it imports)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.col_offset == 0:
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.col_offset == 0:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_every_weight_cache_name_is_imported_from_the_module_that_defines_it():
    package = REPO_ROOT / "models" / "common" / "weight_cache"
    defined: dict[str, set[str]] = {}
    wrong = []
    for source in sorted(p for tree in ("models", "scripts", "tests") for p in (REPO_ROOT / tree).rglob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("models.common.weight_cache.")):
                continue
            module = package.joinpath(*node.module.split(".")[3:])
            path = module / "__init__.py" if module.is_dir() else module.with_suffix(".py")
            names = defined.setdefault(node.module, _defined(path))
            wrong += [f"{source.relative_to(REPO_ROOT)}:{node.lineno}: {alias.name} from {node.module}"
                      for alias in node.names
                      if alias.name not in names and not (module / f"{alias.name}.py").exists()]
    assert not wrong, "\n".join(wrong)
