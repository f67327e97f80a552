"""The GNNPipe chunked epoch in one process (``mode="local"``): stages chained without communication."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
from torch_geometric.data import Data

from gnnpipe import checkpoint as ckpt
from gnnpipe.core.kinds import OpKind
from gnnpipe.core.techniques import Techniques
from gnnpipe.core.timeline import OpEvent
from gnnpipe.engine import state as engine_state
from gnnpipe.engine.chunked import StageExecutor, chunk_order
from gnnpipe.engine.graph import Adjacency
from gnnpipe.engine.single import evaluate
from gnnpipe.nn import LayerStack

__all__ = ["LocalEngine", "stage_ranges"]

R = TypeVar("R")


def stage_ranges(num_blocks: int, stages: int) -> list[tuple[int, int]]:
    """Split ``num_blocks`` blocks into ``stages`` contiguous ranges, as even as possible."""
    if not 1 <= stages <= num_blocks:
        raise ValueError(f"stages: expected 1 to {num_blocks} (the model's blocks), got {stages}")
    cuts = [round(i * num_blocks / stages) for i in range(stages + 1)]
    return list(itertools.pairwise(cuts))


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
        optimizer: Adam over all of ``model``.
        layout: where its checkpoint shard comes from (:func:`gnnpipe.checkpoint.layout`).
    """

    def __init__(self, model: LayerStack, data: Data, adj: Adjacency, bounds: Sequence[int],
                 ranges: Sequence[tuple[int, int]], techniques: Techniques, seed: int,
                 recompute: bool, optimizer: torch.optim.Optimizer,
                 layout: dict[str, Any] | None = None,
                 history_dtype: torch.dtype = torch.float32,
                 wire_dtype: torch.dtype = torch.float32) -> None:
        self.data, self.bounds, self.seed, self.techniques = data, [int(b) for b in bounds], seed, techniques
        self.model, self.adj, self.optimizer, self.layout = model, adj, optimizer, layout or {}
        self.stages = [StageExecutor(model, a, b, adj, bounds, techniques, seed, recompute,
                                     history_dtype=history_dtype, wire_dtype=wire_dtype)
                       for a, b in ranges]
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
        """Forward all chunks in the epoch's order, backward in reverse; the summed loss."""
        order = chunk_order(self.num_chunks, self.seed, epoch, self.techniques.random_order)
        last = len(self.stages) - 1
        loss = 0.0
        for c in order:
            lo, hi = self.bounds[c], self.bounds[c + 1]
            tensors = [self.data.x[lo:hi]]
            for s, ex in enumerate(self.stages):
                target = self._target(c) if s == last else None
                tensors = self._timed(s, c, epoch, OpKind.FORWARD, ex.forward, c, tensors, target)
            loss += float(tensors[0].detach())
        for c in reversed(order):
            grads = None
            for s in range(last, -1, -1):
                grads = self._timed(s, c, epoch, OpKind.BACKWARD, self.stages[s].backward, c, grads)
        return loss

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
