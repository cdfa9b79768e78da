# SPDX-License-Identifier: Apache-2.0
"""The default environment and the vLLM one (another transformers) prepare the same snapshot and
tokenize it as the GGUF's own metadata says: ``<bos>`` / ``<eos>`` added by
``tokenizer.ggml.add_bos_token`` / ``add_eos_token``, its bos / eos ids, its chat template. Each
model is converted fresh in both environments (a child process in the other one), and every
snapshot is tokenized in both. Then one prepared snapshot serves both: preparing in the other
environment finds it, does no work and never repoints ``refs/main``.

Needs both environments (``TT_VENV``, ``TT_VLLM_VENV``); a missing one fails with the variable to set.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from models.demos.real_models.convert import SpecialTokenRule
from models.demos.real_models.gguf_file import read_gguf
from models.demos.real_models.known import KnownModel
from models.demos.real_models.prepare import MANIFEST_NAME, prepare_model
from models.demos.real_models.source import assemble_gguf
from models.testing.environments import (
    EnvironmentMissing,
    environment_python,
    other_environment,
    run_module,
    run_python,
    this_environment,
)
from tests.ttnn.real_models.conftest import model_params

pytestmark = pytest.mark.slow  # two conversions per model (one in each environment): a minute or two each
MODELS = ("gemma3-270m", "smollm2-135m")
PROMPTS = ["The capital of France is", "Hello, my name is", " leading space and\ttab", "1, 2, 3,"]
ENVIRONMENTS = ("default", "vllm")


@pytest.fixture(scope="module")
def other() -> str:
    try:
        environment_python(other_environment())
    except EnvironmentMissing as error:
        pytest.fail(str(error))
    return other_environment()


def prepare_in(environment: str, model: KnownModel, root: Path) -> Path:
    """A fresh conversion of ``model`` under ``root`` in ``environment`` (this process, or a child)."""
    if environment == this_environment():
        return prepare_model(model.name, root)
    proc = run_python(environment, "-m", "models.demos.real_models.prepare", model.name, "--model-root", str(root))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module", params=model_params(names=MODELS))
def prepared(request, other, tmp_path_factory) -> tuple[KnownModel, dict[str, Path]]:
    model = request.param
    roots = {environment: tmp_path_factory.mktemp(f"{model.name}-{environment}") for environment in ENVIRONMENTS}
    return model, {environment: prepare_in(environment, model, roots[environment]) for environment in ENVIRONMENTS}


def render_gguf_template(template: str, prompt: str, bos: str, eos: str) -> str:
    """The GGUF's chat template rendered as transformers and vLLM render one (jinja2, sandboxed,
    trimmed blocks), for one user message and the generation prompt."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
    return environment.from_string(template).render(messages=[{"role": "user", "content": prompt}],
                                                    add_generation_prompt=True, bos_token=bos, eos_token=eos)


def test_both_environments_tokenize_every_snapshot_as_the_gguf_says(prepared) -> None:
    from tokenizers import Tokenizer

    model, snapshots = prepared
    rule = SpecialTokenRule.of(read_gguf(assemble_gguf(model)).metadata)
    assert (rule.chat_template is not None) == model.chat
    # one tokenizer whichever transformers converted it
    tokenizer_files = {name: snapshots["default"] / name for name in ("tokenizer.json", "chat_template.jinja")}
    for name, path in tokenizer_files.items():
        if path.exists():
            assert (snapshots["vllm"] / name).read_bytes() == path.read_bytes(), name
    core = Tokenizer.from_file(str(tokenizer_files["tokenizer.json"]))
    bos, eos = core.id_to_token(rule.bos_id), core.id_to_token(rule.eos_id)

    seen = {}
    for made_in, snapshot in snapshots.items():
        for read_in in ENVIRONMENTS:
            report = run_module(read_in, "models.testing.transformers_reference", str(snapshot), json.dumps(PROMPTS))
            seen[made_in, read_in] = report["prompts"]
            for prompt, row in zip(PROMPTS, report["prompts"]):
                where = (model.name, made_in, read_in, report["transformers"], prompt)
                assert row["raw"] == rule.wrap(row["plain"]), where
                assert row["plain"] == core.encode(prompt, add_special_tokens=False).ids, where
                if rule.chat_template is None:
                    assert row["chat"] is None, where
                    continue
                rendered = render_gguf_template(rule.chat_template, prompt, bos, eos)
                assert row["rendered"] == rendered, where
                assert row["chat"] == core.encode(rendered, add_special_tokens=False).ids, where
    assert all(rows == seen["default", "default"] for rows in seen.values())


def test_one_snapshot_serves_both_environments(prepared, other) -> None:
    """The other environment's prepare finds this one's snapshot: same path, no conversion (not even
    an import of transformers), ``refs/main`` and the snapshot untouched."""
    model, snapshots = prepared
    snapshot = snapshots[this_environment()]
    assert snapshots[other].name == snapshot.name  # one revision in both environments
    watched = (snapshot, snapshot / MANIFEST_NAME, snapshot.parents[1] / "refs" / "main")
    before = [(path.stat().st_ino, path.stat().st_mtime_ns) for path in watched]
    probe = ("import json, sys\n"
             "from models.demos.real_models.prepare import prepare_model\n"
             f"path = prepare_model({model.name!r}, {str(snapshot.parents[3])!r})\n"
             "print(json.dumps({'path': str(path), 'imported': sorted(m for m in ('transformers', 'torch') "
             "if m in sys.modules)}))\n")
    proc = run_python(other, "-c", probe)
    assert proc.returncode == 0, proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (Path(report["path"]), report["imported"]) == (snapshot, [])
    assert [(path.stat().st_ino, path.stat().st_mtime_ns) for path in watched] == before
    assert (snapshot.parents[1] / "refs" / "main").read_text() == snapshot.name
