# SPDX-License-Identifier: Apache-2.0
"""What cannot be built is refused before any work: one line on stderr, exit 2, no traceback.

``scripts/run_demo.sh`` (the demo) before the model is prepared, ``tt-cache build`` before torch is
imported, a seeding plan when it is loaded (every refused plan is tested here: one that cannot be read or
parsed, and one no seed could build, naming the entry, the model and the reason). A mesh name is read
in one place (:func:`models.common.mesh.parse_mesh_shape`), so each says the same."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from models.common.mesh import MeshError, parse_mesh_shape
from models.testing import REPO_ROOT
from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import cli_env, tt_cache

UNKNOWN_MESH = "unknown mesh 'T4K': expected N150, N300, T3K, TG or RxC"
VENV = Path(sys.executable).parent.parent


def one_line(done: subprocess.CompletedProcess, prefix: str) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(prefix) and "Traceback" not in done.stdout, done.stderr[-2000:]
    return lines[0]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """Hidden 128, MLP 256, vocabulary 512: a 1x3 mesh cannot split its MLP, 3x1 its width."""
    return make_checkpoint("llama", tmp_path_factory.mktemp("refusals") / "tiny-llama")


def test_a_mesh_that_is_no_name_is_one_error() -> None:
    for bad in ("T4K", "0x2", "1x2x3", "big", ""):
        with pytest.raises(MeshError, match="expected N150, N300, T3K, TG or RxC"):
            parse_mesh_shape(bad)
    assert parse_mesh_shape(" t3k ") == (1, 8)


def demo(*args: str, model_data: Path, script: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO_ROOT), TT_MODEL_DATA=str(model_data),
               TT_CACHE_PATH=str(model_data / "cache"), TT_VENV=str(VENV))
    command = ["bash", str(REPO_ROOT / "scripts" / "run_demo.sh")] if script else \
        [sys.executable, "-m", "models.demos.real_models.demo"]
    return subprocess.run([*command, *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)


DEMO_REFUSALS = {
    "mesh": (["--mesh", "T4K"], UNKNOWN_MESH),
    "precision": (["--precision", "bf7"], "argument --precision: unknown precision 'bf7': expected a dtype"),
    "model": (["--model", "llama-7b"], "argument --model: invalid choice: 'llama-7b'"),
}


@pytest.mark.parametrize("kind", list(DEMO_REFUSALS))
def test_the_demo_refuses_bad_names_before_preparing(kind, tmp_path) -> None:
    args, problem = DEMO_REFUSALS[kind]
    start = time.perf_counter()
    line = one_line(demo(*args, model_data=tmp_path / "model_data"), "demo: ")
    assert problem in line, line
    assert not (tmp_path / "model_data").exists()  # nothing prepared, nothing built
    print(f"demo {kind}: refused in {time.perf_counter() - start:.2f} s")


def test_run_demo_sh_refuses_a_mistyped_mesh_before_preparing(tmp_path) -> None:
    stamp = VENV / ".setup-stamp"
    if not stamp.is_file():
        pytest.skip("the test venv was not made by scripts/setup_env.sh")
    want = subprocess.run("cat requirements.txt setup.py | sha256sum", shell=True, cwd=REPO_ROOT, text=True,
                          capture_output=True, check=True).stdout.split()[0]
    if stamp.read_text().strip() != want:
        pytest.skip("the venv's requirements differ from this tree's: run_demo.sh would reinstall it")
    start = time.perf_counter()
    line = one_line(demo("--model", "smollm2-135m", "--mesh", "T4K", model_data=tmp_path / "model_data", script=True),
                    "demo: ")
    assert UNKNOWN_MESH in line and not (tmp_path / "model_data").exists()
    print(f"run_demo.sh --mesh T4K: refused in {time.perf_counter() - start:.2f} s")


BUILD_REFUSALS = {
    "mesh": (["--mesh", "T4K"], UNKNOWN_MESH),
    "precision": (["--precision", "bf7"], "unknown precision 'bf7': expected a dtype (bfloat16, bfloat8_b"),
    "columns": (["--mesh", "1x3"], "cannot be built on mesh 1x3: its MLP hidden size 256 cannot be split over 3 "
                                   "mesh columns"),
    "rows": (["--mesh", "3x1"], "cannot be built on mesh 3x1: its hidden size 128 cannot be split over 3 mesh rows"),
}


@pytest.mark.parametrize("kind", list(BUILD_REFUSALS))
def test_tt_cache_build_refuses_before_building(kind, checkpoint, tmp_path) -> None:
    args, problem = BUILD_REFUSALS[kind]
    start = time.perf_counter()
    line = one_line(tt_cache("build", str(checkpoint), *args, env=cli_env(tmp_path / "cache")), "tt-cache build: ")
    assert line.startswith(f"tt-cache build: {checkpoint}: ") and problem in line, line
    assert not (tmp_path / "cache").exists()
    print(f"tt-cache build {kind}: refused in {time.perf_counter() - start:.2f} s")


def test_tt_cache_build_takes_a_t3k_and_a_galaxy_for_heads_that_do_not_divide(checkpoint, tmp_path) -> None:
    """8 query / 2 KV heads would divide; SmolLM2's shape (9 / 3) does not, and still builds."""
    smol = make_checkpoint("llama", tmp_path / "smol-shaped", num_attention_heads=9, num_key_value_heads=3,
                           head_dim=32, hidden_size=288)
    for mesh in ("T3K", "TG"):
        done = tt_cache("build", str(smol), "--mesh", mesh, "--precision", "bfloat16", env=cli_env(tmp_path / "cache"))
        assert done.returncode == 0, done.stderr[-3000:]


# Every way a seeding plan is refused, in one table: (the plan's text, with {checkpoint} for a tiny model's
# directory, or None for no plan file; what its one line must say, with {plan} and {checkpoint}).
PLAN_REFUSALS = {
    "unreadable": (None, ["{plan}: cannot read the plan"]),
    "not YAML": ("models: [", ["{plan}", "not valid YAML"]),
    "no models": ("models: []", ["{plan}", "non-empty 'models' list"]),
    "unknown key": ("models:\n  - model: x\n    mesh: [N150]\n    precisions: [bfloat16]\n",
                    ["{plan}", "unknown key(s) ['mesh']"]),
    "no precisions": ("models:\n  - model: x\n    meshes: N150\n    precisions: []\n",
                      ["{plan}", "'precisions' must be a non-empty list"]),
    "no model": ("models:\n  - {{meshes: [N150], precisions: [bfloat16]}}\n", ["{plan}", "models[0]: 'model' must be"]),
    "listed twice": ("models:\n  - {{model: a, meshes: [N150, N150], precisions: [bfloat16]}}\n",
                     ["{plan}", "listed twice"]),
    # what no seed can build, found when the plan is loaded: the entry, the model and the reason
    "mesh": ("models:\n  - {{model: {checkpoint}, meshes: [T3K], precisions: [bfloat16]}}\n"
             "  - {{model: {checkpoint}, meshes: [TG, T4K], precisions: [bfloat16]}}\n",
             [f"{{plan}}: models[1] {{checkpoint}}: {UNKNOWN_MESH}"]),
    "precision": ("models:\n  - {{model: {checkpoint}, meshes: [T3K], precisions: [bfloat16]}}\n"
                  "  - {{model: {checkpoint}, meshes: [TG, T3K], precisions: [bf7]}}\n",
                  ["{plan}: models[1] {checkpoint}: unknown precision 'bf7'"]),
    "layout": ("models:\n  - {{model: {checkpoint}, meshes: [T3K], precisions: [bfloat16]}}\n"
               "  - {{model: {checkpoint}, meshes: [TG, 1x3], precisions: [bfloat16]}}\n",
               ["{plan}: models[1] {checkpoint}: cannot be built on mesh 1x3: its MLP hidden size 256 cannot be "
                "split over 3"]),
    "mesh and precision": ("models:\n  - model: {checkpoint}\n    meshes: [N3000]\n    precisions: [bfloat9]\n",
                           ["{plan}", "mesh 'N3000'", "precision 'bfloat9'"]),
}


@pytest.mark.parametrize("kind", list(PLAN_REFUSALS))
def test_a_plan_that_no_seed_can_use_is_refused_before_any_seed(kind, checkpoint, tmp_path) -> None:
    text, problems = PLAN_REFUSALS[kind]
    plan = tmp_path / "plan.yaml"
    if text is not None:
        plan.write_text(text.format(checkpoint=checkpoint))
    start = time.perf_counter()
    line = one_line(tt_cache("seed", "--plan", str(plan), env=cli_env(tmp_path / "cache")), "tt-cache seed: ")
    for problem in problems:
        assert problem.format(plan=plan, checkpoint=checkpoint) in line, line
    assert not (tmp_path / "cache").exists()  # no seed started
    print(f"plan {kind}: refused in {time.perf_counter() - start:.2f} s")
