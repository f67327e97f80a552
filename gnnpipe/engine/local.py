"""The GNNPipe chunked epoch in one process (``mode="local"``): stages chained without communication."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch_geometric.data import Data

from gnnpipe import checkpoint as ckpt
from gnnpipe.core.kinds import BlockKind, OpKind, TrainSchedule
from gnnpipe.core.techniques import Techniques
from gnnpipe.core.timeline import OpEvent
from gnnpipe.engine import state as engine_state
from gnnpipe.engine.chunked import StageExecutor, chunk_order
from gnnpipe.engine.graph import Adjacency
from gnnpipe.engine.single import evaluate
from gnnpipe.nn import LayerStack

__all__ = ["LocalEngine", "stage_ranges"]

R = TypeVar("R")


def stage_ranges(model: LayerStack | int, stages: int) -> list[tuple[int, int]]:
    """Split a model's blocks into ``stages`` contiguous ranges with its GNN layers as even as
    possible: a stage's time and its history buffers follow its GNN layers, so an input
    projection goes with the first stage and a classifier with the last (GCNII-32 on 4 stages:
    8 layers each, where equal block counts gave the middle stages 9 of the 32); layers left
    over go to the middle stages. With fewer GNN layers than stages, or an ``int`` (a number of
    blocks), the blocks themselves are split so."""
    num_blocks = model if isinstance(model, int) else len(model)
    if not 1 <= stages <= num_blocks:
        raise ValueError(f"stages: expected 1 to {num_blocks} (the model's blocks), got {stages}")
    gnn = [] if isinstance(model, int) else [
        i for i, b in enumerate(model.blocks) if b.kind == BlockKind.GNN]
    if len(gnn) < stages:
        gnn = list(range(num_blocks))
    counts = [len(gnn) // stages] * stages
    # the layers left over go to the middle stages (the first and last hold the projections)
    middle = sorted(range(stages), key=lambda s: (abs(2 * s - stages + 1), -s))
    for s in middle[:len(gnn) % stages]:
        counts[s] += 1
    firsts = list(itertools.accumulate(counts[:-1]))
    return list(itertools.pairwise([0, *(gnn[k] for k in firsts), num_blocks]))


class LocalEngine:
    """Runs the chunked epoch over ``S`` stage executors in one process; an
    :class:`~gnnpipe.engine.driver.EpochProgram`.

    Args:
        model: the stack to train (in place).
        data: the chunk-ordered graph (chunk ``c`` is rows ``bounds[c]:bounds[c+1]``).
        adj: its normalised adjacency.
        bounds: ``C + 1`` chunk offsets.
        ranges: the stages' block ranges.
        techniques, seed, recompute, history_dtype, wire_dtype: see
            :class:`~gnnpipe.engine.chunked.StageExecutor`.
        schedule: the epoch's order; with ``1f1b`` each chunk runs its backward right after its
            forward (the order of every stage's ops is 1F1B's, so ``pipeline`` computes the same),
            and one chunk at a time is stashed.
        optimizer: Adam over all of ``model``.
        layout: where its checkpoint shard comes from (:func:`gnnpipe.checkpoint.layout`).
    """

    def __init__(self, model: LayerStack, data: Data, adj: Adjacency, bounds: Sequence[int],
                 ranges: Sequence[tuple[int, int]], techniques: Techniques, seed: int,
                 recompute: bool, optimizer: torch.optim.Optimizer,
                 layout: dict[str, Any] | None = None,
                 history_dtype: torch.dtype = torch.float32,
                 wire_dtype: torch.dtype = torch.float32,
                 schedule: TrainSchedule = TrainSchedule.GNNPIPE) -> None:
        self.schedule = schedule
        self.data, self.bounds, self.seed, self.techniques = data, [int(b) for b in bounds], seed, techniques
        self.model, self.adj, self.optimizer, self.layout = model, adj, optimizer, layout or {}
        self.stages = [StageExecutor(model, a, b, adj, bounds, techniques, seed, recompute,
                                     history_dtype=history_dtype, wire_dtype=wire_dtype)
                       for a, b in ranges]
        if schedule is TrainSchedule.ONE_F_ONE_B:
            for ex in self.stages:
                ex.cache_in_slots()
        self.num_train = int(data.train_mask.sum())
        self.device = adj.A.device
        self.events: list[OpEvent] = []

    @property
    def num_chunks(self) -> int:
        return len(self.bounds) - 1

    def _target(self, c: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        lo, hi = self.bounds[c], self.bounds[c + 1]
        return self.data.y[lo:hi], self.data.train_mask[lo:hi], self.num_train

    def _timed(self, stage: int, chunk: int, epoch: int, kind: OpKind, fn: Callable[..., R],
               *args: Any) -> R:
        start = time.perf_counter()
        out = fn(*args)
        if self.device.type == "cuda":  # time the chunk's kernels, not their launch
            torch.cuda.synchronize(self.device)
        self.events.append(OpEvent(stage, stage, 0, chunk, epoch, kind, start, time.perf_counter()))
        return out

    def begin_epoch(self, epoch: int) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        for ex in self.stages:
            ex.begin_epoch(epoch)

    def run_chunks(self, epoch: int) -> float:
        """Forward all chunks in the epoch's order, backward in reverse (``gnnpipe``), or each
        chunk's backward right after its forward (``1f1b``); the summed loss."""
        order = chunk_order(self.num_chunks, self.seed, epoch, self.techniques.random_order)
        loss = 0.0
        if self.schedule is TrainSchedule.ONE_F_ONE_B:
            for c in order:  # every stage sees its forwards, and its backwards, in chunk order
                loss += self._forward(c, epoch)
                self._backward(c, epoch)
            return loss
        for c in order:
            loss += self._forward(c, epoch)
        for c in reversed(order):
            self._backward(c, epoch)
        return loss

    def _forward(self, c: int, epoch: int) -> float:
        """Chunk ``c`` forward through every stage; its loss."""
        lo, hi = self.bounds[c], self.bounds[c + 1]
        tensors = [self.data.x[lo:hi]]
        last = len(self.stages) - 1
        for s, ex in enumerate(self.stages):
            target = self._target(c) if s == last else None
            tensors = self._timed(s, c, epoch, OpKind.FORWARD, ex.forward, c, tensors, target)
        return float(tensors[0].detach())

    def _backward(self, c: int, epoch: int) -> None:
        """Chunk ``c`` backward through every stage, last to first."""
        grads = None
        for s in range(len(self.stages) - 1, -1, -1):
            grads = self._timed(s, c, epoch, OpKind.BACKWARD, self.stages[s].backward, c, grads)

    def step(self, epoch: int) -> None:
        self.optimizer.step()
        for ex in self.stages:
            ex.end_epoch()

    def evaluate(self) -> dict[str, float]:
        return evaluate(self.model, self.data, self.adj)

    def checkpoint_state(self) -> dict[str, Any]:
        buffers = {k: v for ex in self.stages for k, v in ex.buffer_state().items()}
        return ckpt.shard(self.layout, engine_state.model_shard(self.model, 0, len(self.model)),
                          engine_state.optimizer_shard(self.optimizer, self.model), buffers)

    def restore(self, shards: list[dict[str, Any]]) -> None:
        """Continue from a checkpoint: model and Adam state from any layout, the historical
        buffers where they carry over (:func:`gnnpipe.checkpoint.restore_buffers`)."""
        engine_state.restore_model(self.model, shards)
        engine_state.restore_optimizer(self.optimizer, self.model, shards)
        for ex in self.stages:
            ex.load_buffer_state(shards, self.layout)
