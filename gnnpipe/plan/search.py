"""The planner's search: each candidate layout given its best split and chunk count, its
predicted epoch, per-rank memory and bytes per epoch, and whether it fits the memory limit."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch_geometric.data import Data

from gnnpipe.analysis.memory import MemoryModel
from gnnpipe.analysis.volume import boundary_row_totals, exchange_bytes, graph_bytes, pipeline_bytes
from gnnpipe.core.job import PARTS_PER_CHUNK, TrainConfig
from gnnpipe.core.kinds import Mode
from gnnpipe.core.timeline import Timeline
from gnnpipe.engine.local import stage_ranges
from gnnpipe.engine.probe import probe_calls
from gnnpipe.nn import LayerStack
from gnnpipe.plan.costs import (
    Network,
    Shard,
    graph_epoch,
    single_epoch,
    stage_busy,
    staged_timeline,
)
from gnnpipe.plan.layout import Layout
from gnnpipe.plan.profile import Profile
from gnnpipe.plan.stages import Fits, split_stages
from gnnpipe.pyg import default_techniques

__all__ = ["Candidate", "Search", "chunk_candidates"]

#: Chunk counts the planner weighs per stage: these multiples of a pipeline's ``S`` (``W × S``
#: chunks per hybrid), up to the largest count the profile measured at.
CHUNK_MULTIPLES = (1, 2, 4, 8, 16)


def chunk_candidates(stages: int, num_nodes: int, limit: int) -> list[int]:
    """Chunk counts worth simulating: :data:`CHUNK_MULTIPLES` of ``stages`` in ``[stages,
    limit]`` (at most one chunk per node)."""
    top = min(max(limit, stages), num_nodes)
    return sorted({stages * k for k in CHUNK_MULTIPLES if stages * k <= top}) or [
        min(stages, num_nodes)]


@dataclass
class Candidate:
    """A layout with its split and chunks chosen, and what it should cost."""

    layout: Layout
    epoch_time: float
    peak_bytes: tuple[int, ...]
    comm_bytes: int
    stage_times: tuple[float, ...] = ()
    timeline: Timeline = field(default_factory=Timeline)
    fits: bool = True
    reason: str = ""


class Search:
    """Evaluates candidate layouts of one model on one graph against one profile.

    Args:
        model, data: the stack and its graph (ready: :func:`~gnnpipe.plan.profile.check_inputs`).
        profile: the measured block costs.
        memory: the memory model (its chunkings and probes are shared by every candidate).
        net: the network between workers.
        limit: bytes a rank may hold (None: no limit).
        max_chunks: the most chunks a candidate may have (where the profile's line holds).
    """

    def __init__(self, model: LayerStack, data: Data, profile: Profile, memory: MemoryModel,
                 net: Network, limit: int | None, max_chunks: int) -> None:
        self.model, self.data, self.profile, self.memory = model, data, profile, memory
        self.net, self.limit, self.max_chunks = net, limit, max_chunks
        if profile.num_nodes not in (0, data.num_nodes):
            raise ValueError("profile: it was measured for another graph")
        self._calls = probe_calls(model.blocks, model.blocks[0].in_dim)
        self._totals: dict[int, tuple[int, int, int]] = {}

    def with_profile(self, profile: Profile) -> Search:
        """This search with another profile of the same model and graph (its memory model and
        chunkings kept)."""
        return Search(self.model, self.data, profile, self.memory, self.net, self.limit,
                      self.max_chunks)

    # ------------------------------------------------------------------ jobs
    def job(self, layout: Layout) -> TrainConfig:
        """The job ``gp.train`` would run for ``layout`` (its memory is estimated for it)."""
        ranges = layout.ranges or tuple(stage_ranges(self.model, layout.stages))
        return TrainConfig(
            mode=layout.mode, model=self.model.name, layers=self.model.num_layers, epochs=1,
            lr=0.01, weight_decay=0.0, gnn_weight_decay=None, seed=self.memory.seed,
            stages=layout.stages, ranges=ranges, chunks=layout.chunks,
            parts_per_chunk=PARTS_PER_CHUNK, ways=layout.ways, parts=layout.parts,
            techniques=default_techniques(self.model), recompute=layout.recompute, dataset=None,
            history_dtype=layout.history_dtype, wire_dtype=layout.wire_dtype,
            schedule=layout.schedule)

    def peaks(self, layout: Layout) -> tuple[int, ...]:
        """Each rank's estimated peak bytes."""
        return tuple(int(b) for b in self.memory.estimate(self.job(layout))["peak_bytes"])

    def _fits(self, peaks: Sequence[int]) -> bool:
        return self.limit is None or max(peaks) <= self.limit

    # ------------------------------------------------------------------ one layout
    def evaluate(self, layout: Layout) -> Candidate:
        """``layout`` at its best split and chunk count (staged modes), with its costs."""
        if layout.mode is Mode.SINGLE:
            peaks = self.peaks(layout)
            return Candidate(layout, single_epoch(self.profile), peaks, 0, fits=self._fits(peaks))
        if layout.mode is Mode.GRAPH:
            return self._graph(layout)
        return self._staged(layout)

    def _graph(self, layout: Layout) -> Candidate:
        parts = self.memory.partitioned(layout.parts)
        shards = [Shard(p.rows, graph_bytes(self.model, p.halo, layout.wire_dtype))
                  for p in parts]
        peaks = self.peaks(layout)
        comm = graph_bytes(self.model, sum(p.halo for p in parts), layout.wire_dtype)
        return Candidate(layout, graph_epoch(self.profile, shards, self.net), peaks, comm,
                         fits=self._fits(peaks))

    def _exchange(self, layout: Layout, ranges: Sequence[tuple[int, int]]) -> list[float] | None:
        """Bytes per chunk step each hybrid stage sends the other ways (None for a pipeline)."""
        if layout.ways == 1:
            return None
        if layout.chunks not in self._totals:
            self._totals[layout.chunks] = boundary_row_totals(
                self.model, self.data, self.memory.chunking(layout.chunks, PARTS_PER_CHUNK))
        totals = self._totals[layout.chunks]
        return [exchange_bytes([c for blk in self._calls[a:b] for c in blk], totals, layout.ways,
                               layout.history_dtype) / layout.chunks for a, b in ranges]

    def _comm(self, layout: Layout) -> int:
        sent = pipeline_bytes(self.model, self.profile.num_nodes, list(layout.ranges),
                              layout.wire_dtype)
        exchange = self._exchange(layout, layout.ranges)
        if exchange is not None:  # per rank and chunk step, back to every rank's epoch
            sent += round(sum(exchange) * layout.chunks)
        return sent

    def _block_seconds(self, layout: Layout) -> list[float]:
        """Each block's seconds per epoch on one way (recompute runs its forward twice)."""
        rows, ops = self.profile.num_nodes / layout.ways, layout.chunks / layout.ways
        again = 2 if layout.recompute else 1
        return [rows * (again * c.forward_s + c.backward_s)
                + ops * (again * c.forward_fixed_s + c.backward_fixed_s) + c.step_s
                for c in self.profile.blocks]

    def _cut_seconds(self, layout: Layout) -> list[float]:
        """Seconds per epoch each possible cut costs both stages beside it (forward and
        backward transfers of a way's rows)."""
        rows, ops = self.profile.num_nodes / layout.ways, layout.chunks / layout.ways
        wire = layout.wire_dtype.itemsize / 4
        return [2 * self.net.seconds(rows * w * wire, round(ops))
                for w in self.profile.boundary_bytes]

    def _staged(self, layout: Layout) -> Candidate:
        """The best (split, chunks) of a pipeline or hybrid layout that fits, else the fastest."""
        own, shared = [0] * len(self.model), 0  # without a limit every split fits
        if self.limit is not None:
            own, shared = self.bounds(layout)
        prefix = [0, *itertools.accumulate(own)]

        def fits(a: int, b: int) -> bool:
            return self.limit is None or prefix[b] - prefix[a] + shared <= self.limit

        tried = []
        even = tuple(stage_ranges(self.model, layout.stages))
        for chunks in self.counts(layout):
            trial = dataclasses.replace(layout, chunks=chunks)
            try:
                ranges = split_stages(self._block_seconds(trial), own, self._cut_seconds(trial),
                                      layout.stages, self.limit, stage_memory=shared)
            except ValueError:  # no split fits by the per-block bound: the least one may
                ranges = least_split(own, layout.stages)
            # the even split too: the per-block bound may refuse it where its estimate fits
            for split in dict.fromkeys([tuple(ranges), even]):
                trial = dataclasses.replace(trial, ranges=split)
                tried.append((self._timeline(trial).makespan(), trial))
        tried.sort(key=lambda t: (t[0], t[1].chunks))
        refined = sorted((self._refine(trial, seconds, fits) for seconds, trial in tried[:3]),
                         key=lambda t: (t[0], t[1].chunks))
        first = None
        for _, trial in refined + tried[3:]:  # the fastest whose estimate fits the limit
            candidate = self._costed(trial)
            if candidate.fits:
                return candidate
            first = first or candidate
            if self.limit is None:
                break
        assert first is not None, "every staged layout has at least one chunk count"
        return first

    def _costed(self, layout: Layout) -> Candidate:
        peaks = self.peaks(layout)
        timeline = self._timeline(layout)
        busy = stage_busy(self.profile, layout, layout.ranges, self.net,
                          self._exchange(layout, layout.ranges))
        return Candidate(layout, timeline.makespan(), peaks, self._comm(layout), tuple(busy),
                         timeline, fits=self._fits(peaks))

    def _timeline(self, layout: Layout) -> Timeline:
        return staged_timeline(self.profile, layout, layout.ranges, self.net,
                               self._exchange(layout, layout.ranges))

    def counts(self, layout: Layout) -> list[int]:
        """The chunk counts a staged layout is weighed at."""
        per = layout.stages * layout.ways
        return [c for c in chunk_candidates(per, self.data.num_nodes, self.max_chunks)
                if c % layout.ways == 0]

    def bounds(self, layout: Layout) -> tuple[list[int], int]:
        """Per block and per stage, the memory bound a split is priced by
        (:meth:`~gnnpipe.analysis.memory.MemoryModel.block_costs`), at the layout's fewest
        chunks: the largest chunks hold the most, so it bounds every count weighed."""
        fewest = dataclasses.replace(layout, chunks=self.counts(layout)[0])
        return self.memory.block_costs(self.job(fewest))

    def least(self, layout: Layout) -> int:
        """The least a rank of ``layout`` can need: its estimate (``single``, ``graph``), or the
        smallest estimate over the counts weighed of the split whose largest stage is least by
        the per-block bound (the split a limit leaves when no other fits)."""
        if not layout.mode.staged:
            return max(self.peaks(layout))
        split = tuple(least_split(self.bounds(layout)[0], layout.stages))
        return min(max(self.peaks(dataclasses.replace(layout, chunks=c, ranges=split)))
                   for c in self.counts(layout))

    def _refine(self, layout: Layout, seconds: float, fits: Fits) -> tuple[float, Layout]:
        """Move single boundaries one block at a time while the simulated epoch gets shorter
        (the DP's bottleneck objective only approximates the schedule's makespan)."""
        improved = True
        while improved:
            improved = False
            for k, step in itertools.product(range(1, layout.stages), (-1, 1)):
                edges = [0, *(a for a, _ in layout.ranges[1:]), layout.ranges[-1][1]]
                edges[k] += step
                moved = list(itertools.pairwise(edges))
                if all(a < b and fits(a, b) for a, b in moved):
                    trial = dataclasses.replace(layout, ranges=tuple(moved))
                    t = self._timeline(trial).makespan()
                    if t < seconds * (1 - 1e-9):
                        seconds, layout, improved = t, trial, True
        return seconds, layout


def least_split(own: Sequence[int], stages: int) -> list[tuple[int, int]]:
    """The split whose largest stage (by ``own``, per block) is least."""
    return split_stages(own, [0] * len(own), [0.0] * (len(own) - 1), stages)
