"""Checkpoints: one shard per rank (or the one process), written atomically, the manifest last.

A checkpoint of epoch ``e`` (``e`` epochs done) is the folder ``ROOT/epoch-0000e/`` holding
``rank-0000.pt`` ... (each rank's model slice, Adam state per parameter name, historical
buffers, layout) and ``manifest.json`` (the shards with their sizes, the run's config, the
parameters' shapes and the history so far). Every file is written to a temporary name and
renamed, and the manifest only after every shard is in place, so a crash mid-write never leaves a
checkpoint that loads: :func:`latest` skips folders without a complete manifest. Shards hold only
plain tensors, dicts, lists, ints and strings and load with ``torch.load(weights_only=True)``.

Nothing in training draws from a global random generator (chunk orders and dropout masks are
keyed by seed, epoch, chunk and layer), so no RNG state is stored: a resumed run is identical to
one never interrupted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from gnnpipe.core.job import TrainConfig

__all__ = [
    "FORMAT",
    "MANIFEST",
    "Checkpointer",
    "Manifest",
    "Recovery",
    "epoch_dir",
    "latest",
    "layout",
    "node_order",
    "save_manifest",
    "save_shard",
    "shard",
]

logger = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"


def epoch_dir(root: str | Path, epoch: int) -> Path:
    return Path(root) / f"epoch-{epoch:06d}"


def _atomic(path: Path, write: Any) -> Path:
    """``write(tmp)`` then fsync and rename ``tmp`` to ``path``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def save_shard(root: str | Path, epoch: int, rank: int, shard: dict[str, Any]) -> Path:
    """Write rank ``rank``'s shard of the checkpoint of epoch ``epoch``."""
    folder = epoch_dir(root, epoch)
    folder.mkdir(parents=True, exist_ok=True)
    return _atomic(folder / f"rank-{rank:04d}.pt", lambda tmp: torch.save(shard, tmp))


def save_manifest(root: str | Path, epoch: int, world: int, config: TrainConfig,
                  params: dict[str, list[int]], records: list[dict[str, Any]]) -> Path:
    """Complete the checkpoint of epoch ``epoch`` once all ``world`` shards are written."""
    folder = epoch_dir(root, epoch)
    shards = [folder / f"rank-{r:04d}.pt" for r in range(world)]
    missing = [p.name for p in shards if not p.exists()]
    if missing:
        raise RuntimeError(f"checkpoint: shards {missing} of epoch {epoch} are missing in {folder}")
    manifest = {"format": FORMAT, "epoch": epoch, "world": world, "config": config.to_dict(),
                "params": params, "records": records,
                "shards": [{"file": p.name, "bytes": p.stat().st_size} for p in shards]}
    text = json.dumps(manifest, default=str)
    path = _atomic(folder / MANIFEST, lambda tmp: tmp.write_text(text))
    logger.info("checkpoint of epoch %d written to %s", epoch, folder)
    return path


@dataclass(frozen=True)
class Manifest:
    """A complete checkpoint: its folder, epochs done, shards, config, shapes and history."""

    folder: str
    epoch: int
    world: int
    config: TrainConfig
    params: dict[str, list[int]]
    records: list[dict[str, Any]]

    @classmethod
    def read(cls, folder: str | Path) -> Manifest | None:
        """The manifest of ``folder`` if it and every shard it lists are complete, else None."""
        folder = Path(folder)
        try:
            raw = json.loads((folder / MANIFEST).read_text())
            if raw.get("format") != FORMAT:
                return None
            for entry in raw["shards"]:
                if (folder / entry["file"]).stat().st_size != entry["bytes"]:
                    return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return cls(str(folder), int(raw["epoch"]), int(raw["world"]),
                   TrainConfig.from_dict(raw["config"]), raw["params"], raw["records"])

    def shards(self) -> list[dict[str, Any]]:
        """Every shard, memory-mapped (a rank touches only the tensors it takes)."""
        return [torch.load(Path(self.folder) / f"rank-{r:04d}.pt", map_location="cpu",
                           weights_only=True, mmap=True) for r in range(self.world)]


def latest(root: str | Path) -> Manifest | None:
    """The newest complete checkpoint under ``root`` (None if there is none)."""
    root = Path(root)
    if not root.is_dir():
        return None
    for folder in sorted(root.glob("epoch-*"), reverse=True):
        manifest = Manifest.read(folder)
        if manifest is not None:
            return manifest
    return None


def shard(layout: dict[str, Any], model: dict[str, Tensor] | None = None,
          optimizer: dict[str, Any] | None = None,
          buffers: dict[str, dict[str, Tensor]] | None = None) -> dict[str, Any]:
    return {"format": FORMAT, "layout": layout, "model": model or {},
            "optimizer": optimizer or {}, "buffers": buffers or {}}


def layout(mode: str, ranges: Sequence[Sequence[int]], node_order: str, stage: int = 0,
           way: int = 0, ways: int = 1, rank: int = 0) -> dict[str, Any]:
    """Where a shard's state sat: mode, stage ranges, this participant's place, node order (plain
    values: a shard loads with ``weights_only=True``)."""
    return {"mode": str(mode), "ranges": [[int(a), int(b)] for a, b in ranges], "stage": stage,
            "way": way, "ways": ways, "rank": rank, "node_order": node_order}


class Checkpointer:
    """Epoch callback (:mod:`gnnpipe.engine.driver`): after every ``every``-th epoch and after the
    last one, this participant writes its shard (``program.checkpoint_state()``); ``gather``
    (distributed: a collective that returns every rank's records on rank 0) then tells rank 0
    that all shards are written, and rank 0 writes the manifest.

    Args:
        root: the checkpoint folder.
        every: epochs between checkpoints.
        epochs: the run's epochs (the last one is always checkpointed).
        program: what :meth:`~gnnpipe.engine.driver.EpochProgram.checkpoint_state` is asked.
        config: the run's job, kept in the manifest.
        params: the whole model's parameter shapes (:func:`param_shapes`).
        rank, world: this participant and how many there are.
        inherited: history records of the epochs before a resume.
        gather: collects the records of all ranks on rank 0 (None in one process).
    """

    def __init__(self, root: str | Path, every: int, epochs: int, program: Any,
                 config: TrainConfig, params: dict[str, list[int]], rank: int = 0,
                 world: int = 1, inherited: list[dict[str, Any]] | tuple = (),
                 gather: Any = None) -> None:
        self.root, self.every, self.epochs, self.program = Path(root), every, epochs, program
        self.config, self.params, self.rank, self.world = config, params, rank, world
        self.inherited, self.gather = list(inherited), gather
        self.records: list[dict[str, Any]] = []

    def __call__(self, record: dict[str, Any]) -> bool:
        self.records.append(dict(record))
        done = record["epoch"] + 1
        if done % self.every and done != self.epochs:
            return False
        save_shard(self.root, done, self.rank, self.program.checkpoint_state())
        everyone = self.gather(self.records) if self.gather is not None else [self.records]
        if self.rank == 0:
            records = self.inherited + [r for rank in everyone for r in rank]
            save_manifest(self.root, done, self.world, self.config, self.params, records)
        return False


def node_order(parts: Any) -> str:
    """A digest of a chunking's node order and chunk bounds (``"original"`` without one): equal
    digests mean historical buffer rows mean the same nodes."""
    if parts is None:
        return "original"
    digest = hashlib.sha256(parts.perm.numpy().tobytes())
    digest.update(parts.bounds.numpy().tobytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Recovery:
    """How a run checkpoints, resumes and restarts (``gp.train``'s ``checkpoint``,
    ``checkpoint_every``, ``resume`` and ``restarts``, checked by
    :func:`gnnpipe.api.door.check_recovery`)."""

    root: str | None = None
    every: int = 10
    restarts: int = 0
    resume: Manifest | None = None

    def config(self) -> dict[str, Any]:
        return {"checkpoint": self.root, "checkpoint_every": self.every if self.root else None,
                "restarts": self.restarts,
                "resume": self.resume.folder if self.resume is not None else None}

    def start(self, program: Any) -> tuple[int, list[dict[str, Any]]]:
        """Restore ``program`` from the resumed checkpoint: the first epoch to run and the
        history records before it (``0, []`` without ``resume``)."""
        if self.resume is None:
            return 0, []
        program.restore(self.resume.shards())
        return self.resume.epoch, list(self.resume.records)

    def events(self) -> list[dict[str, Any]]:
        """The resume as a ``run.events`` row (none without ``resume``)."""
        if self.resume is None:
            return []
        return [{"epoch": self.resume.epoch, "event": "resume", "attempt": 0, "rank": None,
                 "cause": f"resumed from {self.resume.folder}"}]
