# SPDX-License-Identifier: Apache-2.0
"""The light install (requirements-light.txt + the project without its dependencies, made by
scripts/setup_light_env.sh): a fresh venv with neither torch nor ttnn checks and lists a cache the
full install seeded, as the workflow's validate job does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from models.testing.tiny_models import make_checkpoint
from models.testing.tt_cache import REPO_ROOT, cli_env, json_out, tt_cache

HEAVY = ("torch", "ttnn", "transformers", "numpy", "safetensors")


@pytest.fixture(scope="module")
def light(tmp_path_factory) -> dict:
    """A cache seeded by the full install, and a light venv made by the script from the uv cache."""
    root = tmp_path_factory.mktemp("light")
    checkpoint = make_checkpoint("llama", root / "tiny-llama")
    plan = root / "plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": str(checkpoint), "meshes": ["N150", "N300"],
                                            "precisions": ["bfloat16"]}]}))
    env = cli_env(root / "cache")
    seed = tt_cache("seed", "--plan", str(plan), env=env)
    assert seed.returncode == 0, seed.stderr[-3000:]
    venv = root / "venv"
    full_bin = str(Path(sys.executable).parent)  # where this venv's uv is: the warm uv cache is used
    setup = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "setup_light_env.sh")], cwd=root,
                           env={**os.environ, "TT_VENV": str(venv), "PATH": f"{full_bin}:{os.environ['PATH']}"},
                           capture_output=True, text=True, timeout=600)
    assert setup.returncode == 0, setup.stderr[-3000:]
    # the light venv's own entry point, run outside the repo, with nothing of the full venv around
    light_env = {key: value for key, value in env.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    light_env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    return {"root": root, "plan": plan, "venv": venv, "env": light_env, "checkpoint": checkpoint,
            "cache": root / "cache"}


def _light(light: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(light["venv"] / "bin" / "tt-cache"), *args], cwd=light["root"], env=light["env"],
                          capture_output=True, text=True, timeout=120)


def test_the_light_venv_has_neither_torch_nor_ttnn(light):
    probe = subprocess.run([str(light["venv"] / "bin" / "python"), "-c",
                            "import importlib.util as u, json, models; "
                            f"print(json.dumps([m for m in {HEAVY!r} if u.find_spec(m)]), models.__file__)"],
                           cwd=light["root"], env=light["env"], capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr[-2000:]
    installed, models_file = probe.stdout.split()
    assert json.loads(installed) == [] and Path(models_file).is_relative_to(REPO_ROOT)


def test_seed_check_and_ls_on_the_light_install(light):
    check = _light(light, "seed", "--plan", str(light["plan"]), "--check", "--json")
    assert check.returncode == 0, check.stderr[-3000:]
    document = json_out(check)
    assert document["statistics"]["cache_hit"] and [c["outcome"] for c in document["cases"]] == ["warm", "warm"]
    assert all(Path(case["cache_dir"]).is_relative_to(light["cache"]) for case in document["cases"])
    listing = _light(light, "ls", "--json")
    assert listing.returncode == 0, listing.stderr[-3000:]
    rows = json_out(listing)["variants"]
    assert sorted(row["mesh"] for row in rows) == ["1x1", "1x2"] and {row["state"] for row in rows} == {"warm"}
    full = json_out(tt_cache("ls", "--json", env=cli_env(light["cache"])))
    assert json_out(listing)["variants"] == full["variants"]  # the same answer as the full install's
    for command in (["verify", str(light["cache"])], ["check", str(light["cache"])],
                    ["gc", "--max-size", "1T", "--dry-run", "--keep-plan", str(light["plan"])],
                    ["clean", str(light["cache"])]):
        out = _light(light, *command, "--json")
        assert out.returncode == 0 and json_out(out)["schema_version"] == 1, (command, out.stderr[-2000:])


def test_seeding_on_the_light_install_fails_the_case_and_says_why(light, tmp_path):
    """A cold variant needs the full install to build: one failed case naming it, no traceback."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps({"models": [{"model": str(light["checkpoint"]), "meshes": ["N150"],
                                            "precisions": ["bfloat8_b"]}]}))
    check = _light(light, "seed", "--plan", str(plan), "--check", "--json")
    assert check.returncode == 1 and json_out(check)["cases"][0]["outcome"] == "cold"
    seed = _light(light, "seed", "--plan", str(plan), "--json")
    assert seed.returncode == 1 and "Traceback" not in seed.stderr, seed.stderr[-3000:]
    (case,) = json_out(seed)["cases"]
    assert case["outcome"] == "failed" and "light install" in case["reason"] and "setup_env.sh" in case["reason"]
