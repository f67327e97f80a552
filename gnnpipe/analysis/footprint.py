"""What a range of blocks holds per graph row, measured on a small graph by counting live tensors.

:class:`LiveBytes` is a ``TorchDispatchMode`` that sees every tensor torch allocates while it is
active (forward, autograd's backward and optimizer steps alike), keeps a weak reference to each
new storage and so knows, after every op, how many bytes are live and their highest so far.
Unlike a process's resident size it does not depend on the allocator (glibc keeps freed blocks
below its mmap threshold in the heap), so it measures what a run *needs*.

:func:`footprint` runs blocks ``start:stop`` of a stack as a chunked stage (a
:class:`~gnnpipe.engine.chunked.StageExecutor`) or on the full graph (``single``) over a small
random graph shaped like the user's (same feature width and average degree), and reports per row:
what one chunk's forward leaves stashed for its backward, the highest a chunk's forward plus
backward reaches, and the highest a no-grad evaluation of the range reaches, besides each block's
full-graph buffers. :mod:`gnnpipe.analysis.memory` scales these to the real graph.
"""

from __future__ import annotations

import contextlib
import copy
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch_geometric.data import Data

from gnnpipe.core.techniques import Techniques
from gnnpipe.datasets import synthetic
from gnnpipe.engine.chunked import StageExecutor
from gnnpipe.engine.graph import Adjacency, normalized_adjacency
from gnnpipe.engine.single import FullGraphContext, chunk_loss
from gnnpipe.nn import LayerStack

__all__ = ["PROBE_NODES", "Footprint", "LiveBytes", "footprint", "probe_graph", "torch_threads"]

#: Nodes of the probe graph: enough rows that per-row costs dominate fixed ones.
PROBE_NODES = 4096


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensors allocated while active that are still alive (:attr:`now`) and the
    most at once (:attr:`peak`, after :meth:`reset_peak`). Views and in-place results share a
    storage already counted (or one allocated before: not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, tuple[weakref.ref, int]] = {}
        self.now = self.peak = 0

    def _sweep(self) -> None:
        dead = [k for k, (ref, _) in self._live.items() if ref() is None]
        for k in dead:
            self.now -= self._live.pop(k)[1]

    def _track(self, t: Tensor) -> None:
        if t.layout != torch.strided or t.device.type == "meta":
            return
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self._live or storage.nbytes() == 0:
            return
        try:
            ref = weakref.ref(storage)
        except TypeError:  # a storage that takes no weak reference: counted while we hold it
            return
        self._live[key] = (ref, storage.nbytes())
        self.now += storage.nbytes()

    def current(self) -> int:
        """Bytes live now (freed tensors swept first)."""
        self._sweep()
        return self.now

    def reset_peak(self) -> None:
        """Forget the peak: it restarts from what is live now."""
        self._sweep()
        self.peak = self.now

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self._sweep()
        if not any(r.alias_info is not None for r in func._schema.returns):
            for t in tree_leaves(out):
                if isinstance(t, Tensor):
                    self._track(t)
        self.peak = max(self.peak, self.now)
        return out


@dataclass(frozen=True)
class Footprint:
    """Bytes per graph row of blocks ``start:stop`` (:func:`footprint`).

    ``stash``: what one chunk's forward leaves for its backward (autograd's saved tensors, the
    outputs handed on, with ``recompute`` only the inputs); ``chunk_peak``: the most a chunk's
    forward plus backward holds at once, its stash included; ``eval_peak``: the most a no-grad
    full-graph forward of the range holds (a later stage's received inputs included);
    ``buffers``: the full-graph historical buffers of the range's aggregating blocks
    (``Hbuf``, snapshot, ``dZbuf``, the recompute cache), per graph row; ``cache``: the
    aggregation outputs ``recompute=True`` keeps, per graph row;
    ``inputs``: the tensors entering the range (kept as the stage's leaves);
    ``per_source_stash``/``per_source_peak``: what a chunk adds per distinct source row outside
    it that its message-passing blocks read (0 for blocks that aggregate with ``Â``)."""

    stash: float
    chunk_peak: float
    eval_peak: float
    buffers: float
    cache: float
    inputs: float
    per_source_stash: float = 0.0
    per_source_peak: float = 0.0


def probe_graph(data: Data, nodes: int = PROBE_NODES, seed: int = 0) -> Data:
    """A random graph like ``data`` for probing: ``nodes`` nodes (at most ``data``'s), its
    feature width, classes and average degree, every node in the training set."""
    n = min(nodes, data.num_nodes)
    degree = max(1, round(data.edge_index.size(1) / max(data.num_nodes, 1)))
    classes = int(data.y.max()) + 1 if data.y.numel() else 2
    probe = synthetic(num_nodes=n, avg_degree=min(degree, n - 1), num_classes=max(classes, 2),
                      num_features=data.num_features, seed=seed)
    probe.train_mask = torch.ones(n, dtype=torch.bool)
    return probe


def _inputs(model: LayerStack, data: Data, start: int) -> list[Tensor]:
    """The tensors entering block ``start`` on the probe graph: the features, or random rows
    of the widths crossing that boundary."""
    if start == 0:
        return [data.x]
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(data.num_nodes, w, generator=gen) for w in model.boundary_widths(start)]


def footprint(model: LayerStack, data: Data, start: int, stop: int, *, chunked: bool = True,
              techniques: Techniques | None = None, recompute: bool = False,
              history_dtype: torch.dtype = torch.float32,
              adj: Adjacency | None = None) -> Footprint:
    """Measure blocks ``start:stop`` of (a copy of) ``model`` on the probe graph ``data``
    (:func:`probe_graph`), as a chunked stage or (``chunked=False``) exactly on the full graph;
    per row, see :class:`Footprint`.

    A chunked stage is measured on one chunk of every row, and, where its blocks pass messages
    (PyG layers run on a chunk's rows *and* its sources in other chunks), again on the first of
    two halves: the difference, per source row outside the chunk, is ``per_source``. ``adj``:
    the probe graph's normalised adjacency for the model's norm, if already built.

    It runs on one torch thread (restored afterwards): a probe's ops are small, and on a host
    whose cores are busy threads mostly wait on each other (planning a GCNII-32 on Cora beside
    two busy processes on 2 cores: its memory check took 27.1 s on 2 threads, 7.7 s on one)."""
    with torch_threads(1):
        return _measured(model, data, start, stop, chunked,
                         (techniques or Techniques(), recompute, history_dtype), adj)


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Within this block torch computes on ``threads`` threads (None: as many as now); the
    count before it is restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _measured(model: LayerStack, data: Data, start: int, stop: int, chunked: bool,
              options: tuple[Techniques, bool, torch.dtype], adj: Adjacency | None) -> Footprint:
    """:func:`footprint`'s measurement, with ``options`` (techniques, recompute, history
    dtype)."""
    work = copy.deepcopy(model).train()
    n = data.num_nodes
    inputs = _inputs(work, data, start)
    target = (data.y, data.train_mask, n) if stop == len(work) else None
    if adj is None:
        adj = normalized_adjacency(data.edge_index, n, work.norm)
    buffers = cache = 0.0
    per_source = (0.0, 0.0)
    if chunked:
        ex, (stash, chunk_peak) = _chunk_costs(work, adj, [0, n], inputs, target, start, stop,
                                               options)
        buffers = sum(t.numel() * t.element_size() for b in ex.buffers.values()
                      for t in b.tensors().values()) / n
        cache = sum(b.kept_z.numel() * b.kept_z.element_size() for b in ex.buffers.values()
                    if b.kept_z is not None) / n
        if ex.message_graphs is not None and ex.message_graphs._local:
            per_source = _per_source(work, adj, inputs, target, start, stop, options,
                                     (stash / n, chunk_peak / n))
    else:
        stash, chunk_peak = _full_costs(work, adj, inputs, start, stop, target)
    width = sum(t.numel() * t.element_size() for t in inputs) if start > 0 else 0
    return Footprint(stash / n, chunk_peak / n, _eval_peak(work, adj, inputs, start, stop) / n,
                     buffers, cache, width / n, *per_source)


def _eval_peak(work: LayerStack, adj: Adjacency, inputs: list[Tensor], start: int,
               stop: int) -> int:
    """The most a stage's no-grad full-graph forward holds, its received inputs counted (a
    stage hands its first input over and keeps ``h0``, as the pipeline's evaluation does); the
    first stage reads the graph's features, which the graph keeps."""
    with LiveBytes() as live, torch.no_grad():
        work.eval()
        received = [t.clone() for t in inputs] if start > 0 else [inputs[0]]
        h0 = received[1] if len(received) > 1 else None
        work.run(received.pop(0), FullGraphContext(adj), start, stop, h0)
    return live.peak


def _per_source(work: LayerStack, adj: Any, inputs: list[Tensor], target: Any, start: int,
                stop: int, options: tuple, whole: tuple[float, float]) -> tuple[float, float]:
    """Stash and peak bytes per source row outside a chunk: the first of two halves measured
    against ``whole`` (per row, no sources outside)."""
    n = adj.num_nodes
    half = n // 2
    ex, (stash, peak) = _chunk_costs(work, adj, [0, half, n], inputs, target, start, stop,
                                     options)
    assert ex.message_graphs is not None
    sources = max(g.others.numel() for (_, c), g in ex.message_graphs._local.items() if c == 0)
    if sources == 0:
        return 0.0, 0.0
    return (max(stash - whole[0] * half, 0.0) / sources,
            max(peak - whole[1] * half, 0.0) / sources)


def _chunk_costs(work: LayerStack, adj: Any, bounds: list[int], inputs: list[Tensor],
                 target: Any, start: int, stop: int,
                 options: tuple) -> tuple[StageExecutor, tuple[int, int]]:
    """A stage executor over ``bounds`` after one warm-up epoch (buffers, gather space, local
    graphs and gradients allocated): the bytes chunk 0's forward stashes and the most its
    forward and backward hold."""
    techniques, recompute, history_dtype = options
    ex = StageExecutor(work, start, stop, adj, bounds, techniques, 0, recompute,
                       input_grad=start > 0, history_dtype=history_dtype)

    def rows(c: int) -> tuple[list[Tensor], Any]:
        lo, hi = bounds[c], bounds[c + 1]
        part = None if target is None else (target[0][lo:hi], target[1][lo:hi], target[2])
        return [t[lo:hi] for t in inputs], part

    def run(chunks: range, live: LiveBytes | None) -> tuple[int, int]:
        ex.begin_epoch(ex.epoch + 1)
        outs = {c: ex.forward(c, *rows(c)) for c in chunks}
        like = {c: [(o.shape, o.dtype) for o in out] for c, out in outs.items()}
        if recompute:  # sent on and dropped: only the executor's own references remain
            outs.clear()
        stash = live.current() if live else 0
        for c in reversed(chunks):
            ex.backward(c, None if target is not None
                        else [torch.ones(*shape, dtype=d) for shape, d in like[c]])
        ex.end_epoch()
        return stash, live.peak if live else 0

    run(range(len(bounds) - 1), None)
    _grads_in_place(work)
    with LiveBytes() as live:
        return ex, run(range(1), live)


def _full_costs(model: LayerStack, adj: Any, inputs: list[Tensor], start: int, stop: int,
                target: Any) -> tuple[int, int]:
    """Exact full-graph training of blocks ``start:stop``: what its forward stashes and the
    most its forward and backward hold (after a warm-up epoch)."""
    leaves = [t.detach().requires_grad_(start > 0) for t in inputs]

    def epoch(e: int, live: LiveBytes | None) -> tuple[int, int]:
        ctx = FullGraphContext(adj, 0, e, training=True)
        h, _ = model.run(leaves[0], ctx, start, stop, *leaves[1:2])
        out = chunk_loss(h, *target) if target is not None else h
        stash = live.current() if live else 0
        out.backward(None if target is not None else torch.ones_like(out))
        return stash, live.peak if live else 0

    epoch(0, None)
    _grads_in_place(model)
    with LiveBytes() as live:
        return epoch(1, live)


def _grads_in_place(model: LayerStack) -> None:
    """Every parameter's gradient allocated, so a measured backward accumulates into it."""
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
