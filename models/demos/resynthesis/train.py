# SPDX-License-Identifier: Apache-2.0
"""A child trained on the frozen parent's cached prefill features.

The child is a small head: it reads the parent's final state of a prompt, attends over the
prompt's summary tiles, and predicts a state that the parent's frozen LM head turns into
next-token logits. Its loss is KL(parent || child) of the next-token distributions. Epoch 1 fills
the prefill cache, later epochs (and later processes) are served from it; every epoch reports
its hit/miss telemetry and the number of parent prefills it computed.

Reproducible by construction: the batch order of epoch ``e`` is a permutation drawn from
``seed + e``, the child's init from ``seed``; a checkpoint (child, optimizer, epoch, history)
is written atomically after every epoch, so a restart from it continues the same curve.

A checkpoint records what the child was trained *on* (its binding: the parent's identity and
precision, the feature dtype and position policy, the prompt set) besides its configuration, and a
resume refuses any difference with a :class:`ChildCheckpointError` naming it: a child continued
on another parent or prompt set would silently mix two curves. A checkpoint that cannot be
written (a full disk) does not stop training: the run says which epochs were not saved.
"""

from __future__ import annotations

import io
import math
import pickle
import time
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from loguru import logger
from torch import nn

from models.common.fileio import atomic_write_bytes
from models.resynthesis.source import ParentFeatureSource
from models.resynthesis.waves import describe_os_error, prompt_set_sha256

CHECKPOINT_SCHEMA = "tt-warm-loaders.resynthesis.child_checkpoint.v2"
OLDER_CHECKPOINT_SCHEMAS = ("tt-warm-loaders.resynthesis.child_checkpoint.v1",)


class ChildCheckpointError(ValueError):
    """A child checkpoint that cannot be resumed by this run: unreadable, or trained on something
    else (the message says what)."""


def training_binding(source: ParentFeatureSource, prompts: list[torch.Tensor]) -> dict[str, Any]:
    """What a child's curve depends on besides its configuration: the parent (identity and
    precision), the features (dtype, position policy) and the prompt set."""
    producer = source.producer
    identity = producer.parent.identity
    return {
        "parent": {"checkpointId": identity.checkpoint_id, "weightsSha256": identity.weights_sha256,
                   "manifestSha256": identity.manifest_sha256},
        "precision": identity.precision,
        "featureDtype": producer.feature_dtype,
        "positionPolicySha256": producer.policy.sha256(producer.parent),
        "prompts": {"sha256": prompt_set_sha256(prompts), "count": len(prompts)},
    }


def _differences(saved: dict[str, Any], wanted: dict[str, Any], prefix: str = "") -> list[str]:
    """``name: saved -> wanted`` for every leaf that differs."""
    found = []
    for name in sorted(set(saved) | set(wanted)):
        old, new = saved.get(name), wanted.get(name)
        if isinstance(old, dict) and isinstance(new, dict):
            found += _differences(old, new, f"{prefix}{name}.")
        elif old != new:
            found.append(f"{prefix}{name}: checkpoint {old!r}, this run {new!r}")
    return found


class ChildHead(nn.Module):
    """Final state + attention over summary tiles -> a state in the parent's hidden space."""

    def __init__(self, hidden: int, width: int = 64) -> None:
        super().__init__()
        self.width = width
        self.query = nn.Linear(hidden, width)
        self.key = nn.Linear(hidden, width)
        self.value = nn.Linear(hidden, width)
        self.mix = nn.Linear(2 * width, width)
        self.out = nn.Linear(width, hidden)

    def forward(self, final: torch.Tensor, summary: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``final [B, H]``, ``summary [B, S, H]``, ``mask [B, S]`` (False = padding) -> ``[B, H]``."""
        query = self.query(final)
        scores = torch.einsum("bd,bsd->bs", query, self.key(summary)) / math.sqrt(self.width)
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        context = torch.einsum("bs,bsd->bd", weights, self.value(summary))
        return self.out(F.gelu(self.mix(torch.cat([query, context], -1))))


@dataclass
class TrainConfig:
    epochs: int = 3
    batch_size: int = 8
    learning_rate: float = 3e-3
    width: int = 64
    seed: int = 0


@dataclass
class EpochReport:
    epoch: int
    steps: int
    loss: float  # mean over the epoch's steps
    losses: list[float]  # every step's loss, in order
    prefills: int  # parent prefills computed in this epoch
    lru_hits: int
    lru_misses: int
    disk_hits: int
    disk_misses: int
    seconds: float
    feature_seconds: float  # getting parent features + logits (cache lookups or prefills)
    prefill_seconds: float
    store_seconds: float
    head_seconds: float  # parent logits from cached final states (the frozen LM head)
    waited: int = 0  # prompts another producer computed while this one waited for them
    unstored: int = 0  # prefills whose features could not be stored (kept in memory)
    wait_seconds: float = 0.0
    step_seconds: list[float] = field(default_factory=list)
    feature_step_seconds: list[float] = field(default_factory=list)

    def line(self) -> str:
        return (f"epoch {self.epoch}: loss {self.loss:.6f} over {self.steps} steps | parent prefills "
                f"{self.prefills} | memory hits {self.lru_hits}/{self.lru_hits + self.lru_misses} | disk hits "
                f"{self.disk_hits}/{self.disk_hits + self.disk_misses}"
                f"{f' ({self.waited} after waiting for another producer)' if self.waited else ''}"
                f"{f' | NOT stored {self.unstored}' if self.unstored else ''} | {self.seconds:.2f} s, of which parent "
                f"features {self.feature_seconds:.3f} s (prefill {self.prefill_seconds:.3f} s, "
                f"store {self.store_seconds:.3f} s), parent logits from the LM head {self.head_seconds:.3f} s")


def _collate(entries) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(final [B, H], summaries [B, S_max, H] zero-padded, mask [B, S_max], parent logits [B, V])."""
    final = torch.cat([e.hidden.float() for e in entries])
    longest = max(e.parent_context_hidden.shape[0] for e in entries)
    summary = torch.zeros(len(entries), longest, final.shape[1])
    mask = torch.zeros(len(entries), longest, dtype=torch.bool)
    for row, entry in enumerate(entries):
        length = entry.parent_context_hidden.shape[0]
        summary[row, :length] = entry.parent_context_hidden.float()
        mask[row, :length] = True
    logits = torch.cat([e.logits for e in entries])
    return final, summary, mask, logits


class Trainer:
    """The training loop; ``run`` continues from ``checkpoint`` when it exists."""

    def __init__(self, source: ParentFeatureSource, prompts: list[torch.Tensor], config: TrainConfig,
                 checkpoint: Path | None = None) -> None:
        self.source = source
        self.prompts = prompts
        self.config = config
        self.checkpoint = checkpoint
        self.binding = training_binding(source, prompts)
        self.unsaved: list[tuple[int, str]] = []  # (epoch, why) of checkpoints that could not be written
        self.parent = source.producer.parent
        torch.manual_seed(config.seed)
        self.child = ChildHead(self.parent.hidden_size, config.width)
        self.optimizer = torch.optim.Adam(self.child.parameters(), lr=config.learning_rate)
        self.history: list[EpochReport] = []

    def _order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(self.config.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.prompts), generator=generator).tolist()

    def step(self, batch: list[torch.Tensor]) -> tuple[float, float]:
        """One optimizer step; returns (loss, seconds spent getting the parent's features)."""
        before = self.source.stats.feature_seconds
        entries = self.source.batch(batch)
        feature_seconds = self.source.stats.feature_seconds - before
        final, summary, mask, parent_logits = _collate(entries)
        child_logits = self.parent.logits_of(self.child(final, summary, mask))
        loss = F.kl_div(F.log_softmax(child_logits, -1), F.log_softmax(parent_logits, -1),
                        log_target=True, reduction="batchmean")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach()), feature_seconds

    def epoch(self, epoch: int) -> EpochReport:
        before = replace(self.source.stats)
        start = time.perf_counter()
        order = self._order(epoch)
        losses, step_seconds, feature_step_seconds = [], [], []
        for first in range(0, len(order), self.config.batch_size):
            step_start = time.perf_counter()
            loss, feature_seconds = self.step([self.prompts[i] for i in order[first:first + self.config.batch_size]])
            losses.append(loss)
            feature_step_seconds.append(feature_seconds)
            step_seconds.append(time.perf_counter() - step_start)
        delta = self.source.stats.minus(before)
        return EpochReport(
            epoch=epoch, steps=len(losses), loss=sum(losses) / len(losses), losses=losses,
            prefills=delta.prefills, lru_hits=delta.lru_hits, lru_misses=delta.lru_misses,
            disk_hits=delta.disk_hits, disk_misses=delta.disk_misses,
            waited=delta.waited, unstored=delta.unstored, wait_seconds=delta.wait_seconds,
            seconds=time.perf_counter() - start, feature_seconds=delta.feature_seconds,
            prefill_seconds=delta.prefill_seconds, store_seconds=delta.store_seconds,
            head_seconds=delta.head_seconds,
            step_seconds=step_seconds, feature_step_seconds=feature_step_seconds,
        )

    def run(self, *, print_lines: bool = True) -> list[EpochReport]:
        first = self._restore() + 1
        for epoch in range(first, self.config.epochs + 1):
            report = self.epoch(epoch)
            self.history.append(report)
            if print_lines:
                print(report.line(), flush=True)
            self._save(epoch)
        return self.history

    # -- checkpoints ------------------------------------------------------------------------

    def _save(self, epoch: int) -> None:
        """Write the checkpoint; a failure (a full disk) is reported, not fatal."""
        if self.checkpoint is None:
            return
        state = {"schema": CHECKPOINT_SCHEMA, "epoch": epoch, "config": asdict(self.config),
                 "binding": self.binding, "child": self.child.state_dict(),
                 "optimizer": self.optimizer.state_dict(), "history": [asdict(r) for r in self.history]}
        buffer = io.BytesIO()  # serialized first: torch's writer turns a full disk into a RuntimeError
        torch.save(state, buffer)
        try:
            self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.checkpoint, buffer.getbuffer())
        except OSError as error:
            why = describe_os_error(error)
            self.unsaved.append((epoch, why))
            logger.warning("child checkpoint of epoch {} NOT written to {}: {}", epoch, self.checkpoint, why)

    def _load(self) -> dict[str, Any]:
        """The checkpoint's state, or ChildCheckpointError saying why it cannot be read."""
        path = self.checkpoint
        if path.is_dir():
            raise ChildCheckpointError(f"checkpoint {path} is a directory, not a child checkpoint file")
        try:
            state = torch.load(path, weights_only=True)
        except OSError as error:
            raise ChildCheckpointError(f"cannot read checkpoint {path}: {describe_os_error(error)}") from error
        except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError, KeyError,
                AttributeError, TypeError, IndexError) as error:
            raise ChildCheckpointError(f"checkpoint {path} is not a readable child checkpoint "
                                       f"({type(error).__name__}: {str(error)[:200]})") from error
        if not isinstance(state, dict):
            raise ChildCheckpointError(f"checkpoint {path} is not a child checkpoint (a {type(state).__name__})")
        return state

    def _restore(self) -> int:
        """The last finished epoch of the checkpoint (0 without one); ChildCheckpointError when it
        cannot be resumed by this run."""
        if self.checkpoint is None or not self.checkpoint.exists():
            return 0
        path, state = self.checkpoint, self._load()
        schema = state.get("schema")
        if schema in OLDER_CHECKPOINT_SCHEMAS:
            raise ChildCheckpointError(f"checkpoint {path} was written before checkpoints recorded their parent and "
                                       "prompt set, so resuming it cannot be checked; start a new --checkpoint")
        if schema != CHECKPOINT_SCHEMA:
            raise ChildCheckpointError(f"checkpoint {path} is not a child checkpoint (schema {schema!r:.80})")
        saved_binding = state.get("binding") if isinstance(state.get("binding"), dict) else {}
        problems = []
        differences = _differences(saved_binding, self.binding)
        if differences:
            problems.append("it was trained on something else: " + "; ".join(differences))
        same = {k: v for k, v in asdict(self.config).items() if k != "epochs"}
        saved = state.get("config") if isinstance(state.get("config"), dict) else {}
        differences = _differences({k: v for k, v in saved.items() if k != "epochs"}, same)
        if differences:
            problems.append("it has another training configuration: " + "; ".join(differences))
        if problems:
            raise ChildCheckpointError(f"cannot resume checkpoint {path}: " + "; and ".join(problems)
                                       + ". Resume it with the same --model, --precision, --feature-dtype, prompts "
                                       "and sizes, or start a new --checkpoint")
        try:
            self.child.load_state_dict(state["child"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.history = [EpochReport(**r) for r in state["history"]]
            epoch = int(state["epoch"])
        except (KeyError, RuntimeError, TypeError, ValueError) as error:
            raise ChildCheckpointError(f"checkpoint {path} is damaged: {type(error).__name__}: "
                                       f"{str(error)[:300]}") from error
        return epoch
