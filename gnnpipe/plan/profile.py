"""Per-block costs measured in context: the chunked epoch run in this process, one stage per block.

Timing a block alone, over and over on one chunk, keeps its buffers hot in the CPU caches and
under-predicts a real pipeline by 2-3×. Here the model (or a slice of it) runs GNNPipe's
chunked epoch with every block a stage of its own (a
:class:`~gnnpipe.engine.chunked.StageExecutor` each), so each op meets the same buffers, chunk
order and memory traffic it meets on a pipeline rank. Two chunk counts separate the seconds per
row from the seconds every chunk op costs whatever its size. :func:`profile_on_workers` runs
the slices of a uniform split on the Dask workers at once, as the stages will run.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import os
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe.core.techniques import Techniques
from gnnpipe.datasets.fit import model_graph
from gnnpipe.engine.chunked import StageExecutor, chunk_order
from gnnpipe.engine.driver import drive
from gnnpipe.engine.graph import chunk_rows, normalized_adjacency
from gnnpipe.nn import LayerStack, check_stack
from gnnpipe.partition import chunk as make_chunks
from gnnpipe.pyg import as_stack

__all__ = [
    "BYTES_PER_VALUE",
    "TINY_ROWS",
    "WORKER_WARMUP",
    "BlockCost",
    "Profile",
    "check_inputs",
    "profile_counts",
    "profile_model",
    "profile_on_workers",
    "tiny_rows",
]

BYTES_PER_VALUE = 4  # fp32
#: Unmeasured epochs before the timed ones on Dask workers: a worker's first chunked epoch runs
#: slower than its steady ones (measured 3×: its heap and allocator thresholds still growing),
#: and a fresh one would otherwise predict a slower pipeline than it is.
WORKER_WARMUP = 1
#: Rows of the small chunk the profile carves off its last chunk: its ops cost what every
#: chunk op costs whatever its rows, so one chunking gives both a block's seconds per row and
#: per chunk op.
TINY_ROWS = 32


@dataclass(frozen=True)
class BlockCost:
    """Measured costs of one block.

    ``forward_s``/``backward_s`` are seconds per chunk row, ``*_fixed_s`` seconds per chunk op
    whatever its rows, ``step_s`` seconds per epoch (its Adam step and buffer resets);
    ``activation_bytes`` are kept per row from a chunk's forward to its backward,
    ``buffer_bytes`` held per graph row with the default techniques (``Hbuf``, its snapshot and
    ``dZbuf``; with every technique on ``dZbuf`` lives in ``Hbuf``, a third less);
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
    ``chunk_counts``: the chunk count the costs were measured at, and the most chunks their
    line (from :data:`TINY_ROWS` rows to that count's chunks) reaches."""

    blocks: tuple[BlockCost, ...]
    num_nodes: int
    chunk_counts: tuple[int, int]
    boundary_bytes: tuple[int, ...]
    seconds: float = 0.0
    #: Workers that profiled at once on one host of ``cores`` cores, ``threads`` torch threads
    #: each (``cores`` 0: on hosts of their own, or in one process).
    concurrent: int = 1
    cores: int = 0
    threads: int = 1

    def slowdown(self, workers: int) -> float:
        """How much slower (or, below 1, faster) an op runs on one of ``workers`` ranks on the
        profile's host than it ran profiled: ranks share its cores (``workers × threads /
        cores`` when above 1), as the profiled workers did."""
        if not self.cores:
            return 1.0
        def load(k: int) -> float:
            return max(1.0, k * self.threads / self.cores)
        return load(workers) / load(self.concurrent)

    @property
    def chunk_overhead(self) -> float:
        """Seconds one chunk costs forward plus backward through the whole model besides its rows."""
        return sum(b.forward_fixed_s + b.backward_fixed_s for b in self.blocks)

    @classmethod
    def join(cls, parts: Sequence[Profile]) -> Profile:
        """One profile from profiles of consecutive block ranges of the same model and graph."""
        blocks = tuple(b for p in parts for b in p.blocks)
        if [b.index for b in blocks] != list(range(len(blocks))):
            raise ValueError("parts: expected profiles of consecutive block ranges from block 0")
        return dataclasses.replace(parts[0], blocks=blocks, seconds=max(p.seconds for p in parts))

    def to_frame(self) -> pd.DataFrame:
        """One row per block, with per-epoch seconds (one chunk) and bytes at this graph's size."""
        frame = pd.DataFrame([b.__dict__ for b in self.blocks]).set_index("index")
        frame["epoch_s"] = [b.seconds(self.num_nodes, 1) for b in self.blocks]
        frame["memory"] = [b.memory(self.num_nodes) for b in self.blocks]
        return frame


class _SliceBench:
    """Blocks ``start:stop`` as one-block stages over the chunks of the real graph: the chunked
    epoch, forward in the epoch's chunk order and backward in reverse, each op timed."""

    def __init__(self, work: LayerStack, data: Data, chunks: int, start: int, stop: int,
                 seed: int) -> None:
        parts = make_chunks(data, chunks, seed=seed)
        self.data = ordered = parts.apply(data)
        self.bounds = _with_tiny(parts.bounds.tolist(), tiny_rows(data.num_nodes))
        self.tiny = len(self.bounds) - 2  # the last chunk: tiny_rows(n) rows
        self.seed = seed
        adj = normalized_adjacency(ordered.edge_index, data.num_nodes, work.norm)
        # One stage's blocks share its chunks' rows (and gather buffer), hot from block to
        # block; each block's own copy would meet them cold and predict slower ops than a rank's.
        rows = chunk_rows(adj, self.bounds)
        self.executors = [StageExecutor(work, b, b + 1, adj, self.bounds, Techniques(), seed,
                                        input_grad=b > 0, rows=rows) for b in range(start, stop)]
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

    def target(self, c: int, k: int) -> tuple[Tensor, Tensor, int] | None:
        if self.out_grads is not None or k < len(self.executors) - 1:
            return None
        lo, hi = self.bounds[c], self.bounds[c + 1]
        return self.data.y[lo:hi], self.data.train_mask[lo:hi], self.num_train

    # An EpochProgram (gnnpipe.engine.driver) whose epochs record, in ``took``, the seconds per
    # block of its forwards, backwards and of its step + resets.
    def begin_epoch(self, epoch: int) -> None:
        n = len(self.executors)
        self.took = took = {kind: [0.0] * n for kind in
                            ("forward", "backward", "step", "forward_tiny", "backward_tiny")}
        for k, ex in enumerate(self.executors):
            start = time.perf_counter()
            ex.begin_epoch(epoch)
            took["step"][k] += time.perf_counter() - start

    def run_chunks(self, epoch: int) -> None:
        n, took = len(self.executors), self.took
        order = chunk_order(len(self.bounds) - 1, self.seed, epoch, random_order=True)
        for c in order:
            tensors = self.inputs[c]
            forward = "forward_tiny" if c == self.tiny else "forward"
            for k, ex in enumerate(self.executors):
                start = time.perf_counter()
                tensors = ex.forward(c, tensors, self.target(c, k))
                took[forward][k] += time.perf_counter() - start
        for c in reversed(order):
            grads: Sequence[Tensor | None] | None = (
                None if self.out_grads is None else self.out_grads[c])
            backward = "backward_tiny" if c == self.tiny else "backward"
            for k in range(n - 1, -1, -1):
                start = time.perf_counter()
                grads = self.executors[k].backward(c, grads)
                took[backward][k] += time.perf_counter() - start

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
        lo, hi = self.bounds[0], self.bounds[1]
        tensors, out = self.inputs[0], []
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
                tensors = ex.forward(0, tensors, self.target(0, k))
            ex.saved.clear()
            out.append(sum(kept.values()) / (hi - lo))
        return out

    def buffer_bytes(self) -> list[float]:
        n = self.data.num_nodes
        return [sum(t.numel() * t.element_size() for buf in ex.buffers.values()
                    for t in buf.tensors().values()) / n
                for ex in self.executors]


def _medians(bench: _SliceBench, warmup: int, repeats: int) -> dict[str, list[float]]:
    took: list[dict[str, list[float]]] = []
    total = warmup + repeats

    def keep(record: dict[str, Any]) -> bool:
        took.append(bench.took)
        return False  # never stops the run

    drive(bench, total, eval_every=total, callbacks=[keep])
    epochs = took[warmup:]
    return {kind: [statistics.median(e[kind][k] for e in epochs)
                   for k in range(len(bench.executors))] for kind in epochs[0]}


def profile_model(model: LayerStack, data: Data, chunks: int = 8, *,
                  blocks: tuple[int, int] | None = None, repeats: int = 2, warmup: int = 1,
                  seed: int = 0, threads: int | None = 1) -> Profile:
    """Measure the blocks' costs inside GNNPipe's chunked epoch on the real graph.

    A copy of ``model`` (its weights stay untouched) trains ``warmup + repeats`` epochs in this
    process with each block a stage of its own, over ``chunks`` chunks (at most a quarter of the
    nodes) and one more chunk of :data:`TINY_ROWS` rows carved off the last. Per block, the
    medians of its per-epoch forward and backward seconds over the chunks, and of its ops on the
    small chunk, give seconds per row and per chunk op (``t = rows·a + b``); its Adam step and
    buffer resets give the per-epoch seconds. Times are wall-clock seconds, like the epochs they
    predict: on a machine busy with other work, profile under that same load.

    Args:
        blocks: profile only blocks ``start:stop`` (default: all); the profile then holds those.
        threads: torch threads while profiling (the Dask ranks use one).
    """
    model = as_stack(model, data)
    data = check_inputs(model, data)
    n = data.num_nodes
    if n < 4:
        raise ValueError(f"data: profiling needs at least 4 nodes, got {n}")
    for name, value in (("repeats", repeats), ("chunks", chunks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    start, stop = blocks or (0, len(model))
    if not 0 <= start < stop <= len(model):
        raise ValueError(f"blocks: expected a range within 0-{len(model)}, got {blocks!r}")
    count, reach = profile_counts(chunks, n)
    began = time.perf_counter()
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    work = copy.deepcopy(model).train()
    try:
        bench = _SliceBench(work, data, count, start, stop, seed)
        took = _medians(bench, warmup, repeats)
        kept, buffers = bench.kept_bytes(), bench.buffer_bytes()
    finally:
        torch.set_num_threads(before)
    costs = []
    for k, b in enumerate(range(start, stop)):
        block = model.blocks[b]
        (fwd, fwd_fixed), (bwd, bwd_fixed) = (
            _per_row_and_chunk(took[kind][k], took[f"{kind}_tiny"][k], count, n)
            for kind in ("forward", "backward"))
        params = sum(p.numel() * p.element_size() for p in block.parameters())
        costs.append(BlockCost(
            index=b, name=type(block).__name__, aggregates=block.aggregates,
            out_dim=block.out_dim, forward_s=fwd, backward_s=bwd, forward_fixed_s=fwd_fixed,
            backward_fixed_s=bwd_fixed, step_s=took["step"][k],
            activation_bytes=kept[k], buffer_bytes=buffers[k], param_bytes=params,
            optimizer_bytes=2 * params))
    cuts = tuple(sum(model.boundary_widths(j)) * BYTES_PER_VALUE for j in range(1, len(model)))
    return Profile(tuple(costs), n, (count, reach), cuts, time.perf_counter() - began)


def tiny_rows(num_nodes: int) -> int:
    """Rows of the profile's small chunk: :data:`TINY_ROWS`, at most a sixteenth of the graph."""
    return max(1, min(TINY_ROWS, num_nodes // 16))


def profile_counts(chunks: int, num_nodes: int) -> tuple[int, int]:
    """The chunk count :func:`profile_model` measures at (``chunks``, at most a quarter of the
    nodes) and the most chunks its costs reach (chunks of :func:`tiny_rows` rows or more, at
    most 16 × ``chunks``)."""
    count = max(1, min(chunks, num_nodes // 4))
    return count, max(count, min(16 * count, num_nodes // tiny_rows(num_nodes)))


def _with_tiny(bounds: list[int], tiny: int) -> list[int]:
    """``bounds`` with the last ``tiny`` rows of the last chunk a chunk of their own."""
    return [*bounds[:-1], bounds[-1] - tiny, bounds[-1]]


def _per_row_and_chunk(total: float, tiny: float, chunks: int,
                       num_nodes: int) -> tuple[float, float]:
    """Solve ``t = rows·a + b`` from ``chunks`` ops over all rows but the small chunk's taking
    ``total`` seconds and the small chunk's op taking ``tiny`` (``b`` clipped to ``[0, tiny]``:
    noise)."""
    small = tiny_rows(num_nodes)
    rows = num_nodes - small
    per_row = max(total - chunks * tiny, 1e-12 * rows) / max(rows - chunks * small, 1)
    per_chunk = min(max(tiny - small * per_row, 0.0), tiny)
    return per_row, per_chunk


def _shared_cores(client: Any, addresses: Sequence[str]) -> int:
    """The cores of the one host all ``addresses`` run on (0 if they run on several)."""
    hosts = client.run(lambda: (socket.gethostname(), os.cpu_count() or 1), workers=addresses)
    found = set(hosts.values())
    return next(iter(found))[1] if len(found) == 1 else 0


def check_inputs(model: LayerStack, data: Data) -> Data:
    """The graph ready (a Dataset's graph, masks from a stored ``split_idx``) and fitting the
    model, with float32 features: :func:`gnnpipe.datasets.fit.model_graph`."""
    return model_graph(check_stack(model), data)


def profile_on_workers(cluster: Any, workers: int, model: LayerStack, data: Data,
                       chunks: int = 8, **kwargs: Any) -> Profile:
    """:func:`profile_model` on ``workers`` Dask workers at once, each timing the blocks of one
    stage of the uniform split: every op is timed while the workers share the machine (memory
    bandwidth, caches) and each holds a stage's share of buffers, as in the pipeline. Workers
    run :data:`WORKER_WARMUP` untimed epochs first unless ``warmup`` is given."""
    from gnnpipe.engine.local import stage_ranges
    from gnnpipe.runtime.cluster import resolve

    data = check_inputs(model, data)
    kwargs.setdefault("warmup", WORKER_WARMUP)
    handle, owned = resolve(cluster, workers)
    try:
        addresses = handle.ready(workers)
        if len(addresses) < workers:
            raise ValueError(f"cluster: profiling on {workers} workers, the cluster has "
                             f"{len(addresses)}")
        client = handle.client
        shipped = client.scatter([model, data], broadcast=True, hash=False)
        futures = [client.submit(profile_model, *shipped, chunks, blocks=blocks,
                                 threads=handle.threads_per_worker, workers=[w],
                                 allow_other_workers=False, pure=False, **kwargs)
                   for w, blocks in zip(addresses, stage_ranges(len(model), workers))]
        joined = Profile.join(client.gather(futures))
        return dataclasses.replace(joined, concurrent=workers,
                                   cores=_shared_cores(client, addresses[:workers]),
                                   threads=handle.threads_per_worker)
    finally:
        if owned:
            handle.close()
