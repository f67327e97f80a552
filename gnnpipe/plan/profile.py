"""Per-block costs measured in context: the chunked epoch run in this process, one stage per block.

Timing a block alone, over and over on one chunk, keeps its buffers hot in the CPU caches and
under-predicts a real pipeline by 2-3×. Here the whole model runs GNNPipe's chunked epoch with
every block a stage of its own (:class:`~gnnpipe.engine.local.LocalEngine`), so each op meets
the same buffers, chunk order and memory traffic it meets on a pipeline rank. Two chunk counts
separate the seconds per row from the seconds every chunk op costs whatever its size.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe import datasets
from gnnpipe.engine.chunked import Techniques
from gnnpipe.engine.graph import normalized_adjacency
from gnnpipe.engine.local import LocalEngine
from gnnpipe.models import LayerStack
from gnnpipe.partition import chunk as make_chunks

BYTES_PER_VALUE = 4  # fp32


@dataclass(frozen=True)
class BlockCost:
    """Measured costs of one block.

    ``forward_s``/``backward_s`` are seconds per chunk row, ``*_fixed_s`` seconds per chunk op
    whatever its rows, ``step_s`` seconds per epoch (its Adam step and buffer resets);
    ``activation_bytes`` are kept per row from a chunk's forward to its backward,
    ``buffer_bytes`` held per graph row (``Hbuf``, snapshot, ``dZbuf``); Adam's state
    (``optimizer_bytes``) is twice ``param_bytes``.
    """

    index: int
    name: str
    aggregates: bool
    out_dim: int
    forward_s: float
    backward_s: float
    forward_fixed_s: float
    backward_fixed_s: float
    step_s: float
    activation_bytes: float
    buffer_bytes: float
    param_bytes: int
    optimizer_bytes: int

    def seconds(self, num_nodes: int, chunks: int) -> float:
        """Compute seconds per epoch: every row forward and backward, ``chunks`` ops, one step."""
        return (num_nodes * (self.forward_s + self.backward_s) + self.step_s
                + chunks * (self.forward_fixed_s + self.backward_fixed_s))

    def memory(self, num_nodes: int) -> int:
        """Bytes held during an epoch: activations of every chunk (fill-drain keeps all in
        flight), full-graph buffers, weights, gradients and Adam's two moments."""
        rows = num_nodes * (self.activation_bytes + self.buffer_bytes)
        return math.ceil(rows) + 2 * self.param_bytes + self.optimizer_bytes


@dataclass(frozen=True)
class Profile:
    """Per-block costs of a model on a graph, and the bytes per row crossing each possible cut
    (``boundary_bytes[j]``: between blocks ``j`` and ``j + 1``, one direction).
    ``chunk_counts`` are the two chunkings the costs were measured at."""

    blocks: tuple[BlockCost, ...]
    num_nodes: int
    chunk_counts: tuple[int, int]
    boundary_bytes: tuple[int, ...]
    seconds: float = 0.0

    @property
    def chunk_overhead(self) -> float:
        """Seconds one chunk costs forward plus backward through the whole model besides its rows."""
        return sum(b.forward_fixed_s + b.backward_fixed_s for b in self.blocks)

    @classmethod
    def mean(cls, profiles: Sequence[Profile]) -> Profile:
        """Average of profiles of the same model and graph (e.g. one from each worker)."""
        first = profiles[0]
        timed = ("forward_s", "backward_s", "forward_fixed_s", "backward_fixed_s", "step_s")
        blocks = tuple(dataclasses.replace(b, **{f: statistics.fmean(getattr(p.blocks[i], f)
                                                                       for p in profiles)
                                                  for f in timed})
                       for i, b in enumerate(first.blocks))
        return dataclasses.replace(first, blocks=blocks,
                                   seconds=max(p.seconds for p in profiles))

    def to_frame(self) -> pd.DataFrame:
        """One row per block, with per-epoch seconds (one chunk) and bytes at this graph's size."""
        frame = pd.DataFrame([b.__dict__ for b in self.blocks]).set_index("index")
        frame["epoch_s"] = [b.seconds(self.num_nodes, 1) for b in self.blocks]
        frame["memory"] = [b.memory(self.num_nodes) for b in self.blocks]
        return frame


class _BlockAdams:
    """One Adam per block, stepped and timed one by one (``LocalEngine`` calls ``step`` once an
    epoch as it would a single optimizer)."""

    def __init__(self, model: LayerStack) -> None:
        self.optimizers = [torch.optim.Adam(params, lr=1e-3) if params else None
                           for params in (list(b.parameters()) for b in model.blocks)]
        self.seconds: list[list[float]] = [[] for _ in model.blocks]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            if opt is not None:
                opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for b, opt in enumerate(self.optimizers):
            start = time.perf_counter()
            if opt is not None:
                opt.step()
            self.seconds[b].append(time.perf_counter() - start)


@dataclass
class _Measured:
    """Per block, median seconds per epoch forward, backward and step at one chunk count."""

    chunks: int
    forward: list[float]
    backward: list[float]
    step: list[float]
    engine: LocalEngine


def _measure(work: LayerStack, data: Data, chunks: int, seed: int, warmup: int,
             repeats: int) -> _Measured:
    parts = make_chunks(data, chunks, seed=seed)
    ordered = parts.apply(data)
    adj = normalized_adjacency(ordered.edge_index, data.num_nodes, work.norm)
    ranges = [(b, b + 1) for b in range(len(work))]
    engine = LocalEngine(work, ordered, adj, parts.bounds, ranges, Techniques(), seed)
    adams = _BlockAdams(work)
    per_epoch: dict[tuple[str, int], list[float]] = {}
    for epoch in range(warmup + repeats):
        engine.events.clear()
        resets = []
        for ex in engine.stages:  # the buffer resets of begin_epoch, timed per block
            start = time.perf_counter()
            ex.begin_epoch(epoch)
            resets.append(time.perf_counter() - start)
        engine.train_epoch(adams, epoch)
        if epoch < warmup:
            continue
        for e in engine.events:
            key = (e.kind, e.stage)
            per_epoch.setdefault(key, [0.0] * repeats)[epoch - warmup] += e.end - e.start
        for b, seconds in enumerate(resets):
            per_epoch.setdefault(("reset", b), []).append(seconds)
    median = {k: statistics.median(v) for k, v in per_epoch.items()}
    steps = [statistics.median(s[warmup:]) + median[("reset", b)] for b, s in enumerate(adams.seconds)]
    blocks = range(len(work))
    return _Measured(chunks, [median[("forward", b)] for b in blocks],
                     [median[("backward", b)] for b in blocks], steps, engine)


def _kept_bytes(measured: _Measured) -> list[float]:
    """Bytes per row each block keeps from a chunk's forward to its backward: what autograd
    saves, plus the received inputs its executor holds."""
    engine, out = measured.engine, []
    lo, hi = engine.bounds[0], engine.bounds[1]
    ordered = engine.data
    tensors: list[Tensor] = [ordered.x[lo:hi]]
    for b, ex in enumerate(engine.stages):
        kept: dict[tuple, int] = {}

        def pack(t: Tensor, kept: dict[tuple, int] = kept) -> Tensor:
            kept[(t.data_ptr(), tuple(t.shape))] = t.numel() * t.element_size()
            return t

        if b > 0:
            for t in tensors:
                pack(t)
        last = b == len(engine.stages) - 1
        target = (ordered.y[lo:hi], ordered.train_mask[lo:hi], engine.num_train) if last else None
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            tensors = ex.forward(0, tensors, target)
        ex.saved.clear()
        out.append(sum(kept.values()) / (hi - lo))
    return out


def profile_model(model: LayerStack, data: Data, chunks: int = 8, *, repeats: int = 3,
                  warmup: int = 1, seed: int = 0, threads: int | None = 1) -> Profile:
    """Measure every block's costs inside GNNPipe's chunked epoch on the real graph.

    A copy of ``model`` (its weights stay untouched) trains ``warmup + repeats`` epochs in this
    process with each block a stage of its own, at ``chunks`` and at ``4 × chunks`` chunks (at
    most half the nodes). Per block, the medians of its per-epoch forward and backward seconds
    at the two counts give seconds per row and per chunk op (``t = rows·a + chunks·b``); its
    Adam step and buffer resets give the per-epoch seconds. Times are wall-clock seconds, like
    the epochs they predict: on a machine busy with other work, profile under that same load.
    ``threads`` torch threads are used (the Dask ranks use one).
    """
    check_inputs(model, data)
    n = data.num_nodes
    if n < 4:
        raise ValueError(f"data: profiling needs at least 4 nodes, got {n}")
    for name, value in (("repeats", repeats), ("chunks", chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    low = min(chunks, n // 4)
    high = min(4 * low, n // 2)
    began = time.perf_counter()
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    work = copy.deepcopy(model).train()
    try:
        at_low = _measure(work, data, low, seed, warmup, repeats)
        kept = _kept_bytes(at_low)
        buffers = [sum(t.numel() * t.element_size() for buf in ex.buffers.values()
                       for t in (buf.H, buf.dZ, buf.snap) if t is not None) / n
                   for ex in at_low.engine.stages]
        del at_low.engine
        at_high = _measure(work, data, high, seed, warmup, repeats)
    finally:
        torch.set_num_threads(before)
    costs = []
    for b, block in enumerate(model.blocks):
        (fwd, fwd_fixed), (bwd, bwd_fixed) = (
            _per_row_and_chunk(lo_s[b], hi_s[b], low, high, n)
            for lo_s, hi_s in ((at_low.forward, at_high.forward), (at_low.backward, at_high.backward)))
        params = sum(p.numel() * p.element_size() for p in block.parameters())
        costs.append(BlockCost(
            index=b, name=type(block).__name__, aggregates=block.aggregates,
            out_dim=block.out_dim, forward_s=fwd, backward_s=bwd, forward_fixed_s=fwd_fixed,
            backward_fixed_s=bwd_fixed, step_s=statistics.median([at_low.step[b], at_high.step[b]]),
            activation_bytes=kept[b], buffer_bytes=buffers[b], param_bytes=params,
            optimizer_bytes=2 * params))
    cuts = tuple(sum(model.boundary_widths(j)) * BYTES_PER_VALUE for j in range(1, len(model)))
    return Profile(tuple(costs), n, (low, high), cuts, time.perf_counter() - began)


def _per_row_and_chunk(t_low: float, t_high: float, low: int, high: int,
                       rows: int) -> tuple[float, float]:
    """Solve ``t = rows·a + chunks·b`` from two chunk counts (``b`` clipped at zero: noise can
    make the larger count look cheaper)."""
    per_chunk = max((t_high - t_low) / (high - low), 0.0) if high > low else 0.0
    per_row = max(t_low - low * per_chunk, 1e-12 * rows) / rows
    return per_row, per_chunk


def check_inputs(model: LayerStack, data: Data) -> None:
    datasets.validate(data)
    if not isinstance(model, LayerStack):
        raise TypeError(f"model: expected a gnnpipe LayerStack, got {type(model).__name__}")
    if data.x.size(1) != model.in_dim:
        raise ValueError(f"model: its input width {model.in_dim} does not match data.x's "
                         f"{data.x.size(1)} features")


def profile_on_workers(cluster: Any, workers: int, model: LayerStack, data: Data,
                       chunks: int = 8, **kwargs: Any) -> Profile:
    """:func:`profile_model` on ``workers`` Dask workers at once, averaged: the ops are timed
    while the workers share the machine as the pipeline's stages will."""
    from gnnpipe.runtime.cluster import resolve

    check_inputs(model, data)
    handle, owned = resolve(cluster, workers)
    try:
        addresses = handle.ready(workers)
        if len(addresses) < workers:
            raise ValueError(f"cluster: profiling on {workers} workers, the cluster has "
                             f"{len(addresses)}")
        client = handle.client
        shipped = client.scatter([model, data], broadcast=True, hash=False)
        futures = [client.submit(profile_model, *shipped, chunks, threads=handle.threads_per_worker,
                                 workers=[w], allow_other_workers=False, pure=False, **kwargs)
                   for w in addresses[:workers]]
        return Profile.mean(client.gather(futures))
    finally:
        if owned:
            handle.close()
