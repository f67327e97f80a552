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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:  # the engines import this module: no import of them at run time
    from gnnpipe.engine.chunked import StageExecutor
    from gnnpipe.models import LayerStack

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


def save_manifest(root: str | Path, epoch: int, world: int, config: dict[str, Any],
                  params: dict[str, list[int]], records: list[dict[str, Any]]) -> Path:
    """Complete the checkpoint of epoch ``epoch`` once all ``world`` shards are written."""
    folder = epoch_dir(root, epoch)
    shards = [folder / f"rank-{r:04d}.pt" for r in range(world)]
    missing = [p.name for p in shards if not p.exists()]
    if missing:
        raise RuntimeError(f"checkpoint: shards {missing} of epoch {epoch} are missing in {folder}")
    manifest = {"format": FORMAT, "epoch": epoch, "world": world, "config": config,
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
    config: dict[str, Any]
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
        return cls(str(folder), int(raw["epoch"]), int(raw["world"]), raw["config"],
                   raw["params"], raw["records"])

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


def param_shapes(model: LayerStack) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------- shard contents
def model_shard(model: LayerStack, start: int, stop: int) -> dict[str, Tensor]:
    """The state of blocks ``start:stop`` (parameter names as in the whole stack)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()
            if start <= int(k.split(".")[1]) < stop}


def optimizer_shard(optimizer: torch.optim.Optimizer, model: LayerStack) -> dict[str, Any]:
    """Adam's state of each parameter ``optimizer`` updates, by parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: {k: v.detach().cpu().clone() if isinstance(v, Tensor) else v
                           for k, v in state.items()}
            for p, state in optimizer.state.items()}


def buffer_shard(executor: StageExecutor) -> dict[str, dict[str, Tensor]]:
    """The stage's historical buffers by block key (``H``; ``dZ`` and ``snap`` if allocated)."""
    out = {}
    for key, buf in executor.buffers.items():
        out[str(key)] = {k: v.cpu().clone() for k, v in buf.tensors().items()}
    return out


def shard(layout: dict[str, Any], model: dict[str, Tensor] | None = None,
          optimizer: dict[str, Any] | None = None,
          buffers: dict[str, dict[str, Tensor]] | None = None) -> dict[str, Any]:
    return {"format": FORMAT, "layout": layout, "model": model or {},
            "optimizer": optimizer or {}, "buffers": buffers or {}}


# --------------------------------------------------------------------------- restoring
def restore_model(model: LayerStack, shards: list[dict[str, Any]], start: int = 0,
                  stop: int | None = None) -> None:
    """Load blocks ``start:stop`` of ``model`` from whichever shards hold them."""
    stop = len(model) if stop is None else stop
    merged = {k: v for s in shards for k, v in s["model"].items()
              if start <= int(k.split(".")[1]) < stop}
    wanted = set(model_shard(model, start, stop))
    if set(merged) != wanted:
        raise ValueError(f"resume: the checkpoint lacks parameters {sorted(wanted - set(merged))}")
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if name in merged:
                value.copy_(merged[name])


def restore_optimizer(optimizer: torch.optim.Optimizer, model: LayerStack,
                      shards: list[dict[str, Any]]) -> None:
    """Give each parameter ``optimizer`` updates its Adam state from the checkpoint (by name)."""
    merged = {k: v for s in shards for k, v in s["optimizer"].items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = merged.get(names[id(p)])
            if state is not None:  # a parameter never stepped has no state yet
                optimizer.state[p] = {k: v.clone() if k == "step" else v.to(p.device).clone()
                                      for k, v in state.items()}


def restore_buffers(executor: StageExecutor, shards: list[dict[str, Any]],
                    layout: dict[str, Any]) -> None:
    """Take the historical buffers of the stage's blocks from the checkpoint where they carry over
    exactly: the same node order and chunking, and either one pipeline per stage (``local``,
    ``pipeline``) or the same ranks (``hybrid`` resumed as itself). Buffers that do not carry over
    start from zeros like epoch 0 (a logged warning)."""
    from gnnpipe.engine.chunked import LayerBuffers

    start, stop = executor.start, executor.stop
    for s in shards:
        old = s["layout"]
        if old.get("node_order") != layout["node_order"]:
            continue
        same_ranks = all(old.get(k) == layout[k] for k in ("mode", "ranges", "ways", "rank"))
        if old.get("ways", 1) != 1 and not same_ranks:
            continue
        for key, tensors in s["buffers"].items():
            k = int(key)
            if start <= k < stop and ("snap" in tensors) == executor.techniques.snapshot:
                on = {name: t.to(executor.device).clone() for name, t in tensors.items()}
                shared = executor.techniques.grad_in_h  # dZbuf restarts from zeros in Hbuf
                executor.buffers[k] = LayerBuffers(on["H"], on.get("snap"),
                                                   None if shared else on.get("dZ"), shared)
    blocks = executor.model.blocks
    fresh = [k for k in range(start, stop) if blocks[k].aggregates and k not in executor.buffers]
    if fresh:
        logger.warning("resume: the historical buffers of blocks %s start from zeros like epoch 0 "
                       "(the checkpoint's node order, chunking or stage layout differs)", fresh)


def layout(mode: str, ranges: list[tuple[int, int]] | list[list[int]], node_order: str,
           stage: int = 0, way: int = 0, ways: int = 1, rank: int = 0) -> dict[str, Any]:
    """Where a shard's state sat: mode, stage ranges, this participant's place, node order."""
    return {"mode": mode, "ranges": [[int(a), int(b)] for a, b in ranges], "stage": stage,
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
        config: the run's config (plain values), kept in the manifest.
        params: the whole model's parameter shapes (:func:`param_shapes`).
        rank, world: this participant and how many there are.
        inherited: history records of the epochs before a resume.
        gather: collects the records of all ranks on rank 0 (None in one process).
    """

    def __init__(self, root: str | Path, every: int, epochs: int, program: Any,
                 config: dict[str, Any], params: dict[str, list[int]], rank: int = 0,
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
    :func:`gnnpipe.validate.check_recovery`)."""

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
