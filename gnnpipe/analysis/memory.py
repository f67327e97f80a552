"""Predicted peak memory of every rank of a job, itemised, with no training and no cluster.

Each rank's peak is the sum of what it holds for the whole run and the larger of what a training
epoch and an evaluation add on top (docs/design.md §5, "Memory per rank"):

- fixed: ``parameters`` (weights where the rank copies them, gradients, Adam's two moments),
  ``features`` (the reordered copy of the graph a one-process chunked run makes), ``adjacency``
  (``Â`` and ``Âᵀ`` as CSR, the chunks' compacted row blocks or a partition's local rows),
  ``history`` (``Hbuf``, its snapshot and ``dZbuf`` of the rank's aggregating blocks) and
  ``recompute_cache`` (the aggregation outputs ``recompute=True`` keeps), and ``runtime`` (what
  the engine's objects and, on a rank, the process group add: a measured constant);
- training: ``stash`` (what every chunk's forward keeps until its backward: fill-drain runs every
  forward first), ``working`` (the temporaries of one chunk's forward and backward, the gathered
  rows of a product) and ``communication`` (receive buffers, halo rows);
- ``evaluation``: a no-grad forward of the rank's blocks on its whole graph.

``peak_bytes = fixed + max(stash + working + communication, evaluation)``. The per-row costs of
the model's blocks are measured on a small graph shaped like the user's
(:func:`~gnnpipe.analysis.footprint.footprint`, live tensors counted, so the allocator does not
enter); the graph's sizes (rows per chunk and rank, edges, halo rows) are the real ones.

What it predicts is what a run **needs**: what a rank holds under a Dask ``memory_limit``,
where it hands its heap's holes back past 80% of the limit
(:class:`~gnnpipe.engine.memory.HeapCeiling`). A process's resident peak (``run.memory()``)
equals it also with no limit where freed tensors go back to the OS: always above glibc's
largest mmap threshold (32 MiB, a 131,072 × 64 float32 tensor), and above 1 MiB under the
``lean`` allocator of capped workers (:mod:`gnnpipe.runtime.workerenv`). Smaller chunk tensors
leave the freed temporaries of every chunk op as holes between the stashed ones, and an
unlimited rank holds up to 1.2-1.6× more (``benchmarks/plan_memory.py``); under glibc's
defaults a one-process run at 50,000-130,000 nodes can hold up to 4× more.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import pandas as pd
from torch_geometric.data import Data

from gnnpipe.analysis.footprint import Footprint, footprint, probe_graph
from gnnpipe.analysis.shapes import ChunkedShape, PartShape, adjacency_bytes
from gnnpipe.core.job import TrainConfig
from gnnpipe.core.kinds import Mode, TrainSchedule
from gnnpipe.engine.buffers import torch_dtype
from gnnpipe.engine.graph import Adjacency, normalized_adjacency
from gnnpipe.engine.probe import AggregationCall, probe_calls
from gnnpipe.nn import LayerStack
from gnnpipe.partition import Partitioning, chunk, partition

__all__ = ["FIXED_ITEMS", "ITEMS", "RUNTIME_BYTES", "MemoryModel", "block_costs", "estimate"]

#: Items held for the whole run.
FIXED_ITEMS = ("parameters", "features", "adjacency", "history", "recompute_cache", "runtime")
#: Every column of :func:`estimate`'s frame before ``peak_bytes``.
ITEMS = (*FIXED_ITEMS, "stash", "working", "communication", "evaluation")
#: Bytes the engine's own objects add besides tensors (Python objects, autograd's graph nodes,
#: tqdm), measured at 2,000-300,000 nodes; a rank adds its process group's buffers.
RUNTIME_BYTES = {"process": 8 << 20, "rank": 24 << 20}


def estimate(model: LayerStack, data: Data, job: TrainConfig) -> pd.DataFrame:
    """One row per rank of ``job`` (a parsed :class:`~gnnpipe.core.job.TrainConfig`) on
    ``data``: the items of the module docstring and ``peak_bytes``, in bytes."""
    return MemoryModel(model, data, job.seed).estimate(job)


def block_costs(model: LayerStack, data: Data, job: TrainConfig) -> tuple[list[int], int]:
    """:meth:`MemoryModel.block_costs` of ``job`` on a fresh model."""
    return MemoryModel(model, data, job.seed).block_costs(job)


class MemoryModel:
    """The memory model of one stack on one graph, with what it measures and partitions kept:
    each distinct stage range is probed once, each chunk count chunked once and each partition
    count partitioned once, so many jobs (a planner's candidates) cost little more than one.

    Args:
        model: the stack.
        data: the graph (ready for the model: :func:`gnnpipe.datasets.fit.model_graph`).
        seed: seeds the probe graph, the chunkings and the partitions, as ``gp.train``'s seed.
    """

    def __init__(self, model: LayerStack, data: Data, seed: int = 0) -> None:
        self.model, self.data, self.seed = model, data, seed
        self._probe: Data | None = None
        self._probe_adj: Adjacency | None = None
        self._footprints: dict[tuple, Footprint] = {}
        self._chunkings: dict[tuple[int, int], Partitioning] = {}
        self._chunked: dict[tuple[int, int], ChunkedShape] = {}
        self._parts: dict[int, list[PartShape]] = {}
        self._calls: list[list[AggregationCall]] | None = None

    def estimate(self, job: TrainConfig) -> pd.DataFrame:
        """One row per rank of ``job``, in order (a ``rank`` column, as in ``run.memory()``): the
        items of the module docstring and ``peak_bytes``."""
        frame = pd.DataFrame(self._rank_rows(job)).fillna(0)
        for item in ITEMS:
            if item not in frame:
                frame[item] = 0
        frame = frame[["rank", "stage", *ITEMS]].astype("int64")
        frame["peak_bytes"] = frame[list(FIXED_ITEMS)].sum(axis=1) + frame[
            ["stash", "working", "communication"]].sum(axis=1).combine(frame["evaluation"], max)
        # ranks in order from 0, so the index is the rank too
        return frame.sort_values("rank", kind="stable").reset_index(drop=True)

    def block_costs(self, job: TrainConfig) -> tuple[list[int], int]:
        """The memory model cut for a stage split of ``job``'s pipeline: per block, the bytes a
        stage holding it adds (its parameters with Adam, history buffers, recompute cache and
        the stash of its chunks, without the inputs it receives from the block before), and the
        bytes any stage holds besides, at their largest over single blocks (adjacency, runtime,
        received inputs, one chunk's working set with the communication buffers, or an
        evaluation). A stage's estimate is then at most its blocks' sum plus that."""
        model = self.model
        one_each = dataclasses.replace(job, mode=Mode.PIPELINE, stages=len(model), ways=1,
                                       ranges=tuple((k, k + 1) for k in range(len(model))))
        rows = self._rank_rows(one_each)
        own = [r["parameters"] + r["history"] + r["recompute_cache"] + r["stash"] - r["received"]
               for r in rows]
        shared = max(r["adjacency"] + r["runtime"] + r["received"]
                     + max(r["working"] + r["communication"], r["evaluation"]) for r in rows)
        return own, shared

    def footprint(self, start: int, stop: int, chunked: bool, job: TrainConfig) -> Footprint:
        """:func:`~gnnpipe.analysis.footprint.footprint` of blocks ``start:stop`` with ``job``'s
        techniques and options, measured once for every range of the same blocks (the 32 layers
        of a GCNII-32 are probed as one)."""
        key = (self._signature(start, stop), chunked, job.techniques, job.recompute,
               job.history_dtype)
        if key not in self._footprints:
            if self._probe is None:
                self._probe = probe_graph(self.data, seed=self.seed)
                self._probe_adj = normalized_adjacency(self._probe.edge_index,
                                                       self._probe.num_nodes, self.model.norm)
            self._footprints[key] = footprint(
                self.model, self._probe, start, stop, chunked=chunked, techniques=job.techniques,
                recompute=job.recompute, history_dtype=torch_dtype(job.history_dtype),
                adj=self._probe_adj)
        return self._footprints[key]

    def _signature(self, start: int, stop: int) -> tuple:
        """What a range's memory depends on: what enters it, each block's structure (type,
        modules, parameter shapes, width, dropout) and whether it ends the model."""
        model = self.model
        blocks = tuple((type(b).__name__, repr(b), tuple(tuple(p.shape) for p in b.parameters()),
                        b.out_dim, bool(b.aggregates), getattr(b, "p", None),
                        getattr(b, "act", None), getattr(b, "sets_h0", None))
                       for b in model.blocks[start:stop])
        entering = tuple(model.boundary_widths(start)) if start > 0 else ("features",)
        return entering, blocks, stop == len(model)

    @property
    def calls(self) -> list[list[AggregationCall]]:
        """Per block, its message-passing calls (probed once)."""
        if self._calls is None:
            self._calls = _passing_calls(self.model)
        return self._calls

    def chunking(self, chunks: int, parts_per_chunk: int) -> Partitioning:
        """The graph chunked as a run with this seed chunks it (``gp.chunk``), chunked once."""
        key = (chunks, parts_per_chunk)
        if key not in self._chunkings:
            self._chunkings[key] = chunk(self.data, chunks, seed=self.seed,
                                         parts_per_chunk=parts_per_chunk)
        return self._chunkings[key]

    def chunk_counts(self) -> list[int]:
        """The chunk counts chunked so far, in the order they were."""
        return [c for c, _ in self._chunkings]

    def chunked(self, chunks: int, parts_per_chunk: int) -> ChunkedShape:
        """:meth:`chunking`, as far as a chunked job's memory depends on it."""
        key = (chunks, parts_per_chunk)
        if key not in self._chunked:
            self._chunked[key] = ChunkedShape.of(self.model, self.data,
                                             self.chunking(chunks, parts_per_chunk),
                                             passing=any(self.calls))
        return self._chunked[key]

    def partitioned(self, parts: int) -> list[PartShape]:
        """Each graph-parallel rank's rows, halo rows and edges for ``parts`` METIS parts."""
        if parts not in self._parts:
            self._parts[parts] = PartShape.all_of(self.model, self.data, partition(
                self.data, parts, method="metis", seed=self.seed))
        return self._parts[parts]

    def _rank_rows(self, job: TrainConfig) -> list[dict[str, int]]:
        """:meth:`estimate`'s rows as dicts (chunked ranks also with ``received``: the inputs in
        their stash)."""
        if job.mode is Mode.SINGLE:
            return [_single(self.model, self.data,
                            self.footprint(0, len(self.model), False, job))]
        if job.mode is Mode.GRAPH:
            return _graph_rows(self, job)
        return _chunked_rows(self, job)


def _param_bytes(model: LayerStack, start: int, stop: int, copies: int) -> int:
    """Weights (``copies``: 1 where the rank has its own copy), gradients and Adam's moments."""
    values = sum(p.numel() * p.element_size() for b in model.blocks[start:stop]
                 for p in b.parameters())
    return values * (3 + copies)


def _single(model: LayerStack, data: Data, fp: Footprint) -> dict[str, int]:
    """``single``: the adjacency, and the whole graph trained as one chunk."""
    adj = normalized_adjacency(data.edge_index, data.num_nodes, model.norm)
    n = data.num_nodes
    return {"rank": 0, "stage": 0, "parameters": _param_bytes(model, 0, len(model), 0),
            "adjacency": adjacency_bytes(adj, None), "runtime": RUNTIME_BYTES["process"],
            "stash": math.ceil(fp.stash * n), "working": math.ceil((fp.chunk_peak - fp.stash) * n),
            "evaluation": math.ceil(fp.eval_peak * n)}


def _graph_rows(memory: MemoryModel, job: TrainConfig) -> list[dict[str, int]]:
    """``graph``: each rank's partition rows trained exactly, its local adjacency over them and
    its halo, the halo rows it receives at every aggregation (and which its message-passing
    layers run on besides its own)."""
    model = memory.model
    width = max(b.out_dim for b in model.blocks)
    fp = memory.footprint(0, len(model), False, job)
    per_block = memory.calls
    calls = [c for block in per_block for c in block]
    passing = memory.footprint(0, len(model), True, job) if calls else fp  # per source row
    # a chunk keeps its gathered Hbuf rows as a leaf (their gradient is its push); the halo
    # rows arrive as a tensor that is freed once joined to the rank's own
    per_halo = max(passing.per_source_stash - sum(c.width * 4 for c in calls), 0.0)
    out = []
    for p, part in enumerate(memory.partitioned(job.parts)):
        rows, halo, nnz = part.rows, part.halo, part.nnz
        graphs, _ = _message_passing(per_block, [halo], nnz, job)
        out.append({"rank": p, "stage": 0, "parameters": _param_bytes(model, 0, len(model), 1),
                    "adjacency": 2 * (nnz * 8 + (rows + halo + 1) * 4) + graphs,
                    "communication": 2 * (halo + rows) * width * 4,
                    "runtime": RUNTIME_BYTES["rank"],
                    "stash": math.ceil(fp.stash * rows + per_halo * halo),
                    "working": math.ceil((fp.chunk_peak - fp.stash) * rows
                                         + (passing.per_source_peak
                                            - passing.per_source_stash) * halo),
                    "evaluation": math.ceil(fp.eval_peak * rows)})
    return out


def _passing_calls(model: LayerStack) -> list[list[AggregationCall]]:
    """Per block, its message-passing calls (probed once per estimate)."""
    return [[c for c in block if c.message_passing]
            for block in probe_calls(model.blocks, model.blocks[0].in_dim)]


def _message_passing(per_block: list[list[AggregationCall]], sources: Sequence[int],
                     edges: int, job: TrainConfig) -> tuple[int, int]:
    """The message-passing state of the blocks whose calls are ``per_block``: the local graphs
    of every chunk (edges and other sources as indices) and, with unbiased gradients off, each
    chunk's last push to its other sources (float32, kept across epochs); ``(0, 0)`` without
    message passing."""
    calls = [c for block in per_block for c in block]
    if not calls:
        return 0, 0
    graphs = 2 * edges * 8 + sum(sources) * 8
    kept = 0 if job.techniques.unbiased_grad else sum(
        c.width * 4 for c in calls if c.needs_grad) * sum(sources)
    return graphs, kept


def _chunked_rows(memory: MemoryModel, job: TrainConfig) -> list[dict[str, int]]:
    """``local`` (one row), ``pipeline`` and ``hybrid`` (a row per rank): full-graph buffers,
    every chunk of the rank's epoch stashed, one chunk's temporaries, boundary receive
    buffers."""
    fps = [memory.footprint(a, b, True, job) for a, b in job.ranges]
    shape = memory.chunked(job.chunks, job.parts_per_chunk)
    stages = [_stage_row(memory, job, s, fp, shape) for s, fp in enumerate(fps)]
    if job.mode is Mode.LOCAL:
        total = {k: sum(st[k] for st in stages) for k in ("parameters", "history",
                                                          "recompute_cache", "stash", "graphs")}
        graphs = total.pop("graphs")
        return [{"rank": 0, "stage": 0, **total, "features": shape.features,
                 "adjacency": shape.adjacency + graphs,
                 "working": max(st["working"] for st in stages),
                 "evaluation": max(st["evaluation"] for st in stages),
                 "runtime": RUNTIME_BYTES["process"]}]
    return [{"rank": w * job.stages + st["stage"], **st,
             "adjacency": shape.adjacency + st["graphs"],
             "communication": 0 if st["stage"] == 0 else st["communication"],
             "runtime": RUNTIME_BYTES["rank"]}
            for w in range(job.ways) for st in stages]


def _stage_row(memory: MemoryModel, job: TrainConfig, stage: int, fp: Footprint,
               shape: ChunkedShape) -> dict[str, int]:
    """Stage ``stage``'s items (and ``graphs``, its message-passing local graphs; ``received``,
    the inputs in its stash) on a rank of its own."""
    model = memory.model
    a, b = job.ranges[stage]
    n, tallest, sources = shape.nodes, shape.sizes[0], shape.sources
    graphs, pushes = _message_passing(memory.calls[a:b], sources, shape.edges, job)
    # the received inputs, kept as the stage's leaves; in one process they are the stage
    # before's outputs, stashed there unless it recomputes
    shared = job.mode is Mode.LOCAL and not job.recompute
    stashed = shape.stashed(job, stage)
    inputs = 0 if shared else fp.inputs * stashed
    return {
        "stage": stage,
        "parameters": _param_bytes(model, a, b, 0 if job.mode is Mode.LOCAL else 1),
        "history": math.ceil(fp.buffers * n) + pushes,
        "recompute_cache": math.ceil(fp.cache * (n if job.schedule is TrainSchedule.GNNPIPE
                                                 else shape.slot_rows(job, stage))),
        "graphs": graphs,
        "received": math.ceil(inputs),
        "stash": math.ceil(fp.stash * stashed + inputs
                           + fp.per_source_stash * sum(sources) * stashed / n),
        "working": math.ceil((fp.chunk_peak - fp.stash) * tallest + shape.gather
                             + (fp.per_source_peak - fp.per_source_stash) * max(sources)),
        # the next chunk's inputs received (in the wire's dtype, then as float32) while this
        # one computes; their gradients sent back
        "communication": math.ceil(fp.inputs * tallest * (2 + job.wire_dtype.itemsize / 4)),
        "evaluation": math.ceil(fp.eval_peak * n)}
