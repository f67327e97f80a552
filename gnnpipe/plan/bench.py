"""The profiler's bench: blocks as one-block stages over the real graph's chunks, each op timed.

One chunking gives every cost a plan needs. Of ``C`` METIS chunks the first half are merged into
one *big* chunk (half the graph: the rows a graph-parallel rank or ``single`` handles in one op
come closer to it than to a pipeline chunk's), and the last :func:`tiny_rows` rows become a
chunk of their own. Per block, the normal chunks' total seconds and the tiny chunk's op give
seconds per row and per chunk op (``t = rows·a + b``); the big op gives the seconds per row of
work done many rows at once.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe.core.techniques import Techniques
from gnnpipe.engine.chunked import StageExecutor, chunk_order
from gnnpipe.engine.driver import drive
from gnnpipe.engine.graph import chunk_rows, normalized_adjacency
from gnnpipe.nn import LayerStack
from gnnpipe.partition import chunk as make_chunks

__all__ = ["KINDS", "MAX_WARMUP", "STEADY", "TINY_ROWS", "SliceBench", "medians", "tiny_rows"]

#: Rows of the small chunk carved off the last chunk: its ops cost what every chunk op costs
#: whatever its rows.
TINY_ROWS = 32
#: The most untimed epochs a bench runs before timing its own, and how close (relative) an
#: epoch's time must come to the one before for the warm-up to be over.
MAX_WARMUP = 2
STEADY = 0.1
#: What a bench times per block: its ops on the normal chunks (summed), on the big and the tiny
#: chunk, and its step with the buffers' resets.
KINDS = ("forward", "backward", "forward_big", "backward_big", "forward_tiny",
         "backward_tiny", "step")


def tiny_rows(num_nodes: int) -> int:
    """Rows of the small chunk: :data:`TINY_ROWS`, at most a sixteenth of the graph."""
    return max(1, min(TINY_ROWS, num_nodes // 16))


def bench_bounds(bounds: Sequence[int], num_nodes: int,
                 merge: bool = True) -> tuple[list[int], int]:
    """``bounds`` (``C`` chunks) with its first half merged into one chunk (if ``merge`` and
    ``C >= 2``) and the last :func:`tiny_rows` rows a chunk of their own; and how many chunks
    were merged."""
    merged = len(bounds) // 2 if merge and len(bounds) > 2 else 0  # C // 2 of C + 1 bounds
    kept = [bounds[0], *bounds[merged:]] if merged > 1 else list(bounds)
    return [*kept[:-1], kept[-1] - tiny_rows(num_nodes), kept[-1]], merged if merged > 1 else 0


class SliceBench:
    """Blocks ``start:stop`` as one-block stages over the bench's chunks of the real graph: the
    chunked epoch, forward in the epoch's chunk order and backward in reverse, each op timed;
    an :class:`~gnnpipe.engine.driver.EpochProgram`. ``lean``: each chunk's backward right after
    its forward (one chunk's tensors held at a time), 16-bit historical buffers and no big
    chunk (half the graph's tensors through a stage's blocks overran a 100,000-node profile's
    workers capped at 0.75x single's need), for workers with little memory to spare."""

    def __init__(self, work: LayerStack, data: Data, chunks: int, start: int, stop: int,
                 seed: int, lean: bool = False) -> None:
        parts = make_chunks(data, chunks, seed=seed)
        self.data = ordered = parts.apply(data)
        self.bounds, self.merged = bench_bounds(parts.bounds.tolist(), data.num_nodes, not lean)
        self.tiny = len(self.bounds) - 2  # the last chunk
        self.big = 0 if self.merged else -1  # the first, when chunks were merged into it
        self.seed, self.lean = seed, lean
        adj = normalized_adjacency(ordered.edge_index, data.num_nodes, work.norm)
        # One stage's blocks share its chunks' rows (and gather buffer), hot from block to
        # block; each block's own copy would meet them cold and predict slower ops than a rank's.
        rows = chunk_rows(adj, self.bounds)
        history = torch.bfloat16 if lean else torch.float32
        self.executors = [StageExecutor(work, b, b + 1, adj, self.bounds, Techniques(), seed,
                                        input_grad=b > 0, rows=rows, history_dtype=history)
                          for b in range(start, stop)]
        self.optimizers = [torch.optim.Adam(params, lr=1e-3) if params else None
                           for params in (list(work.blocks[b].parameters())
                                          for b in range(start, stop))]
        gen = torch.Generator().manual_seed(seed)
        spans = list(itertools.pairwise(self.bounds))
        # A slice that does not start the model gets random inputs of the right widths, one
        # that does not end it unit output gradients: the values do not change op costs.
        self.inputs = [[ordered.x[lo:hi]] if start == 0 else
                       [torch.randn(hi - lo, w, generator=gen) for w in work.boundary_widths(start)]
                       for lo, hi in spans]
        self.out_grads = (None if stop == len(work) else
                          [[torch.ones(hi - lo, w) for w in work.boundary_widths(stop)]
                           for lo, hi in spans])
        self.num_train = max(int(ordered.train_mask.sum()), 1)
        self.took: dict[str, list[float]] = {}  # the last epoch's seconds (begin_epoch resets)

    @property
    def normal_chunks(self) -> int:
        """Chunks neither big nor tiny."""
        return len(self.bounds) - 2 - (1 if self.merged else 0)

    @property
    def big_rows(self) -> int:
        return self.bounds[1] - self.bounds[0] if self.merged else 0

    def target(self, c: int, k: int) -> tuple[Tensor, Tensor, int] | None:
        if self.out_grads is not None or k < len(self.executors) - 1:
            return None
        lo, hi = self.bounds[c], self.bounds[c + 1]
        return self.data.y[lo:hi], self.data.train_mask[lo:hi], self.num_train

    def _kind(self, base: str, c: int) -> str:
        return f"{base}_tiny" if c == self.tiny else f"{base}_big" if c == self.big else base

    def _forward(self, c: int) -> None:
        tensors, kind = self.inputs[c], self._kind("forward", c)
        for k, ex in enumerate(self.executors):
            start = time.perf_counter()
            tensors = ex.forward(c, tensors, self.target(c, k))
            self.took[kind][k] += time.perf_counter() - start

    def _backward(self, c: int) -> None:
        grads: Sequence[Tensor | None] | None = (
            None if self.out_grads is None else self.out_grads[c])
        kind = self._kind("backward", c)
        for k in range(len(self.executors) - 1, -1, -1):
            start = time.perf_counter()
            grads = self.executors[k].backward(c, grads)
            self.took[kind][k] += time.perf_counter() - start

    # An EpochProgram (gnnpipe.engine.driver) whose epochs record, in ``took``, the seconds per
    # block of its forwards, backwards and of its step + resets.
    def begin_epoch(self, epoch: int) -> None:
        n = len(self.executors)
        self.took = took = {kind: [0.0] * n for kind in KINDS}
        for k, ex in enumerate(self.executors):
            start = time.perf_counter()
            ex.begin_epoch(epoch)
            took["step"][k] += time.perf_counter() - start

    def run_chunks(self, epoch: int) -> None:
        order = chunk_order(len(self.bounds) - 1, self.seed, epoch, random_order=True)
        if self.lean:
            for c in order:
                self._forward(c)
                self._backward(c)
            return
        for c in order:
            self._forward(c)
        for c in reversed(order):
            self._backward(c)

    def step(self, epoch: int) -> None:
        for k, opt in enumerate(self.optimizers):
            start = time.perf_counter()
            if opt is not None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            self.took["step"][k] += time.perf_counter() - start

    def evaluate(self) -> dict[str, float]:
        return {}  # costs only: nothing to evaluate

    def kept_bytes(self) -> list[float]:
        """Bytes per row each block keeps from a chunk's forward to its backward: what autograd
        saves, plus the received inputs its executor holds."""
        c = self.normal_chunk()
        lo, hi = self.bounds[c], self.bounds[c + 1]
        tensors, out = self.inputs[c], []
        for k, ex in enumerate(self.executors):
            kept: dict[tuple, int] = {}

            def pack(t: Tensor, kept: dict[tuple, int] = kept) -> Tensor:
                kept[(t.data_ptr(), tuple(t.shape))] = t.numel() * t.element_size()
                # Detached: a saved output packed as itself holds its own grad_fn, a cycle
                # through autograd's C++ graph that Python's gc cannot free (it leaked every
                # buffer of the profile, ~0.5 GB per profile at 50,000 nodes, on the worker).
                return t.detach()

            if ex.start > 0:
                for t in tensors:
                    pack(t)
            ex.begin_epoch(ex.epoch + 1)  # a forward phase of its own, after the timed epochs
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                tensors = ex.forward(c, tensors, self.target(c, k))
            ex.saved.clear()
            out.append(sum(kept.values()) / (hi - lo))
        return out

    def normal_chunk(self) -> int:
        """A chunk neither big nor tiny (the first such)."""
        return 1 if self.merged else 0

    def buffer_bytes(self) -> list[float]:
        n = self.data.num_nodes
        return [sum(t.numel() * t.element_size() for buf in ex.buffers.values()
                    for t in buf.tensors().values()) / n
                for ex in self.executors]


def medians(bench: SliceBench, warmup: int, repeats: int,
            until: Callable[[], bool] | None = None) -> dict[str, list[float]]:
    """Per kind and block, the median seconds of ``repeats`` epochs, timed once the warm-up is
    over: at least ``warmup`` untimed epochs, and more (up to :data:`MAX_WARMUP`) while an
    epoch still ran more than :data:`STEADY` slower or faster than the one before (a fresh
    worker's heap is still growing). With ``until``, untimed epochs go on after the timed ones
    until it returns True (called once per epoch: keeping the host as busy as while timing, for
    other workers still timing theirs; :class:`gnnpipe.runtime.together.Together`)."""
    took: list[dict[str, list[float]]] = []
    seconds: list[float] = []
    timed_from: list[int] = [] if warmup else [0]  # where the timed epochs start, once known

    def keep(record: dict[str, Any]) -> bool:
        took.append(bench.took)
        seconds.append(record["epoch_time"])
        k = len(seconds)
        if not timed_from and k >= warmup and (
                k == MAX_WARMUP or (k >= 2 and abs(seconds[-1] / seconds[-2] - 1) <= STEADY)):
            timed_from.append(k)
        timed = bool(timed_from) and k >= timed_from[0] + repeats
        return timed and (until is None or until())

    total = MAX_WARMUP + repeats
    drive(bench, sys.maxsize if until else total, eval_every=sys.maxsize, callbacks=[keep])
    epochs = took[timed_from[0]:timed_from[0] + repeats]
    return {kind: [statistics.median(e[kind][k] for e in epochs)
                   for k in range(len(bench.executors))] for kind in epochs[0]}
