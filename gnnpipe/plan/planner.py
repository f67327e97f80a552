"""Plans: stage ranges and a chunk count chosen by DP and simulation, with what they should cost."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from torch_geometric.data import Data

from gnnpipe.analysis.memory import block_costs, estimate
from gnnpipe.core import checks as check
from gnnpipe.core.job import PARTS_PER_CHUNK, TrainConfig
from gnnpipe.core.kinds import Mode
from gnnpipe.core.timeline import Timeline
from gnnpipe.core.units import DEFAULT_BANDWIDTH, format_bytes, parse_bandwidth, parse_bytes
from gnnpipe.engine.local import stage_ranges
from gnnpipe.nn import LayerStack
from gnnpipe.plan.profile import (
    BlockCost,
    Profile,
    check_inputs,
    profile_counts,
    profile_on_workers,
)
from gnnpipe.plan.stages import Fits, least_memory, split_stages, too_small
from gnnpipe.pyg import as_stack, default_techniques
from gnnpipe.schedule import gnnpipe as gnnpipe_schedule
from gnnpipe.schedule.simulator import simulate

__all__ = ["DEFAULT_LATENCY", "MAX_CHUNKS", "PLAN_FORMAT", "Plan", "chunk_candidates", "plan",
           "predict"]

#: Seconds each point-to-point message costs besides its bytes (gloo latency, Python).
DEFAULT_LATENCY = 1e-4
MAX_CHUNKS = 64
#: The ``format`` of a plan written by :meth:`Plan.to_json`.
PLAN_FORMAT = "gnnpipe.plan/1"


def chunk_candidates(stages: int, num_nodes: int, limit: int = MAX_CHUNKS) -> list[int]:
    """Chunk counts worth simulating: powers of two and multiples of ``stages`` in
    ``[stages, limit]`` (at most one chunk per node)."""
    top = min(max(limit, stages), num_nodes)
    found = {2**k for k in range(top.bit_length()) if stages <= 2**k <= top}
    found |= set(range(stages, top + 1, stages))
    return sorted(found) or [min(stages, num_nodes)]


def _transfers(profile: Profile, chunks: int, bandwidth: float, latency: float) -> list[float]:
    """Seconds per epoch to move every row across each possible cut, forward and backward."""
    n = profile.num_nodes
    return [2 * (n * w / bandwidth + chunks * latency) for w in profile.boundary_bytes]


def _stage_costs(profile: Profile, ranges: Sequence[tuple[int, int]], chunks: int,
                 bandwidth: float, latency: float) -> tuple[dict, float, list[float]]:
    """Simulator costs per (kind, stage), the per-chunk transfer delay and epoch busy seconds
    (compute, plus the transfers at a stage's cuts)."""
    n, costs, busy = profile.num_nodes, {}, []
    for s, (a, b) in enumerate(ranges):
        blocks = profile.blocks[a:b]
        costs["forward", s] = sum(n * c.forward_s / chunks + c.forward_fixed_s for c in blocks)
        costs["backward", s] = sum(n * c.backward_s / chunks + c.backward_fixed_s for c in blocks)
        costs["step", s] = sum(c.step_s for c in blocks)
        busy.append(sum(c.seconds(n, chunks) for c in blocks))
    transfers = _transfers(profile, chunks, bandwidth, latency)
    for s, (a, _) in enumerate(ranges[1:]):
        busy[s] += transfers[a - 1]
        busy[s + 1] += transfers[a - 1]
    cuts = [profile.boundary_bytes[a - 1] for a, _ in ranges[1:]]
    delay = max((n / chunks * w / bandwidth + latency for w in cuts), default=0.0)
    return costs, delay, busy


def predict(profile: Profile, ranges: Sequence[tuple[int, int]], chunks: int,
            bandwidth: float | str | None = None, latency: float = DEFAULT_LATENCY) -> Timeline:
    """Simulate one epoch of GNNPipe's schedule for these stage ranges and chunk count."""
    costs, delay, _ = _stage_costs(profile, ranges, chunks, parse_bandwidth(bandwidth), latency)
    return simulate(gnnpipe_schedule(len(ranges), chunks, step=True), costs, comm=delay)


def _refine(profile: Profile, ranges: list[tuple[int, int]], chunks: int, bandwidth: float,
            latency: float, fits: Fits) -> tuple[float, list[tuple[int, int]], Timeline]:
    """Move single boundaries one block at a time while the simulated epoch gets shorter (the
    DP's bottleneck objective only approximates the schedule's makespan)."""
    timeline = predict(profile, ranges, chunks, bandwidth, latency)
    best, improved = timeline.makespan(), True
    while improved:
        improved = False
        for k, step in itertools.product(range(1, len(ranges)), (-1, 1)):
            edges = [0, *(a for a, _ in ranges[1:]), ranges[-1][1]]
            edges[k] += step
            moved = list(itertools.pairwise(edges))
            if all(a < b and fits(a, b) for a, b in moved):
                trial = predict(profile, moved, chunks, bandwidth, latency)
                if trial.makespan() < best * (1 - 1e-9):
                    best, ranges, timeline, improved = trial.makespan(), moved, trial, True
    return best, ranges, timeline


@dataclass(frozen=True, repr=False)
class Plan:
    """Stage ranges and chunk count for ``gp.train(plan=...)``, with what they should cost.

    Attributes:
        ranges: each stage's block range ``(start, stop)``.
        chunks: chunks per epoch ``C``.
        epoch_time: predicted seconds per training epoch (the simulated makespan).
        stage_times: predicted busy seconds per epoch of each stage (compute plus transfers).
        memory: each stage's peak bytes, from :func:`gnnpipe.analysis.memory.estimate` (as
            ``gp.estimate_memory`` gives it for this layout).
        layers: GNN (aggregating) layers in each stage.
        timeline: the simulated epoch.
        profile: the measured block costs the plan came from.
        candidates: every chunk count tried, with its DP split and that split's predicted epoch
            (before the boundaries were nudged).
        made_for: what the plan was made for, as its maker records it (the command line keeps
            ``model``, ``layers``, ``hidden`` and ``dataset`` here); saved with :meth:`to_json`.
    """

    ranges: tuple[tuple[int, int], ...]
    chunks: int
    epoch_time: float
    stage_times: tuple[float, ...]
    memory: tuple[int, ...]
    layers: tuple[int, ...]
    timeline: Timeline
    profile: Profile
    memory_limit: int | None = None
    bandwidth: float = DEFAULT_BANDWIDTH
    latency: float = DEFAULT_LATENCY
    candidates: pd.DataFrame = field(default_factory=pd.DataFrame)
    made_for: dict[str, Any] = field(default_factory=dict)

    def predict(self, ranges: Sequence[tuple[int, int]] | None = None,
                chunks: int | None = None) -> Timeline:
        """Simulated epoch of another split (e.g. the uniform one) with this plan's costs."""
        return predict(self.profile, ranges or self.ranges, chunks or self.chunks,
                       self.bandwidth, self.latency)

    def table(self) -> pd.DataFrame:
        """One row per stage: blocks, GNN layers, predicted busy seconds, memory."""
        return pd.DataFrame({
            "stage": range(len(self.ranges)),
            "blocks": [f"{a}-{b - 1}" for a, b in self.ranges],
            "layers": self.layers,
            "predicted_s": self.stage_times,
            "memory": [format_bytes(m) for m in self.memory],
        }).set_index("stage")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values: everything but the simulated timeline, which
        :meth:`from_dict` simulates again from the profile."""
        return {
            "format": PLAN_FORMAT, "made_for": dict(self.made_for),
            "ranges": [list(r) for r in self.ranges], "chunks": self.chunks,
            "epoch_time": self.epoch_time, "stage_times": list(self.stage_times),
            "memory": list(self.memory), "layers": list(self.layers),
            "memory_limit": self.memory_limit, "bandwidth": self.bandwidth,
            "latency": self.latency, "profile": {
                **dataclasses.asdict(self.profile),
                "blocks": [dataclasses.asdict(b) for b in self.profile.blocks],
                "chunk_counts": list(self.profile.chunk_counts),
                "boundary_bytes": list(self.profile.boundary_bytes)},
            "candidates": [{"chunks": int(r["chunks"]), "epoch_time": float(r["epoch_time"]),
                            "ranges": [list(x) for x in r["ranges"]]}
                           for r in self.candidates.to_dict("records")],
        }

    @classmethod
    def from_dict(cls, values: Any) -> Plan:
        """The plan :meth:`to_dict` described; ``ValueError`` if ``values`` is not one."""
        if not isinstance(values, dict) or values.get("format") != PLAN_FORMAT:
            raise ValueError(f"plan: expected a gnnpipe plan (written by Plan.to_json or "
                             f"'gnnpipe plan --out'), got {type(values).__name__} without "
                             f"format {PLAN_FORMAT!r}")
        try:
            raw = values["profile"]
            profile = Profile(blocks=tuple(BlockCost(**b) for b in raw["blocks"]),
                              num_nodes=raw["num_nodes"], chunk_counts=tuple(raw["chunk_counts"]),
                              boundary_bytes=tuple(raw["boundary_bytes"]), seconds=raw["seconds"])
            ranges = tuple((int(a), int(b)) for a, b in values["ranges"])
            chunks, bandwidth, latency = int(values["chunks"]), values["bandwidth"], values["latency"]
            return cls(
                ranges=ranges, chunks=chunks, epoch_time=float(values["epoch_time"]),
                stage_times=tuple(values["stage_times"]), memory=tuple(values["memory"]),
                layers=tuple(values["layers"]),
                timeline=predict(profile, ranges, chunks, bandwidth, latency), profile=profile,
                memory_limit=values["memory_limit"], bandwidth=bandwidth, latency=latency,
                candidates=pd.DataFrame([{**c, "ranges": [tuple(x) for x in c["ranges"]]}
                                         for c in values["candidates"]]),
                made_for=dict(values["made_for"]))
        except (KeyError, TypeError, ValueError) as err:
            raise ValueError(f"plan: a damaged gnnpipe plan ({type(err).__name__}: {err})") from None

    def to_json(self, path: str | Path) -> Path:
        """Write :meth:`to_dict` as JSON to ``path``; returns the path."""
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def from_json(cls, path: str | Path) -> Plan:
        """Read a plan written by :meth:`to_json`; ``ValueError`` naming the file otherwise."""
        try:
            values = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"plan: cannot read a plan from {path} ({err})") from None
        return cls.from_dict(values)

    def __repr__(self) -> str:
        limit = "none" if self.memory_limit is None else format_bytes(self.memory_limit)
        head = (f"Plan: {len(self.ranges)} stages, {self.chunks} chunks, predicted epoch "
                f"{self.epoch_time:.4g} s (memory limit {limit})")
        return head + "\n" + self.table().to_string(float_format=lambda v: f"{v:.4g}")


def memory_costs(model: LayerStack, data: Data, workers: int, chunks: int | None = None,
                 seed: int = 0) -> tuple[list[int], int]:
    """What :func:`plan` splits by: per block, the bytes a stage holding it adds, and the bytes
    every stage holds besides (:func:`gnnpipe.analysis.memory.block_costs`, the model of
    ``gp.estimate_memory``), for a ``workers``-stage pipeline of ``chunks`` chunks (default
    ``4 × workers``). A split fits ``memory_limit`` when each stage's blocks' sum plus the
    second number does."""
    model = as_stack(model, data)
    data = check_inputs(model, data)
    return block_costs(model, data, _memory_job(model, workers, chunks or 4 * workers, seed))


def _memory_job(model: LayerStack, workers: int, chunks: int, seed: int) -> TrainConfig:
    """The pipeline job a plan's memory is estimated for: ``gp.train``'s defaults, ``workers``
    stages of the uniform split (the split changes what the estimate sums, not how)."""
    return TrainConfig(
        mode=Mode.PIPELINE, model=model.name, layers=model.num_layers, epochs=1, lr=0.01,
        weight_decay=0.0, gnn_weight_decay=None, seed=seed, stages=workers,
        ranges=tuple(stage_ranges(len(model), workers)), chunks=chunks,
        parts_per_chunk=PARTS_PER_CHUNK, ways=1, parts=1, techniques=default_techniques(model),
        recompute=False, dataset=None)


def plan(model: LayerStack, data: Data, workers: int, memory_limit: float | str | None = None,
         bandwidth: float | str | None = None, *, chunks: int | Sequence[int] | None = None,
         profile: Profile | None = None, cluster: Any = None, latency: float = DEFAULT_LATENCY,
         seed: int = 0, repeats: int = 3) -> Plan:
    """Choose stage boundaries and the chunk count for a ``workers``-stage pipeline.

    Profiles ``model`` on ``data`` (unless ``profile`` is given), then for every candidate chunk
    count splits the blocks by :func:`split_stages` (compute plus boundary transfer at
    ``bandwidth`` bytes/s, memory under ``memory_limit``) and simulates GNNPipe's schedule. For
    the three fastest counts, boundaries are then nudged one block at a time while the simulated
    epoch shortens; the fastest predicted epoch wins.

    Args:
        model: the stack to split.
        data: the graph it trains on (float64 or float16 features are profiled as float32).
        workers: pipeline stages (one Dask worker each).
        memory_limit: bytes per stage, as a number or a string (``"8GB"``, ``"512MiB"``).
        bandwidth: stage-to-stage bytes/s (a number or ``"1GB/s"``); default
            :data:`DEFAULT_BANDWIDTH`.
        chunks: a chunk count or counts to consider; default :func:`chunk_candidates` up to
            the larger of the profile's two chunk counts: its costs per row and per chunk are a
            line through those two, and past them the line missed (a GCN-32 planned at 64
            chunks measured 28% slower than predicted).
        profile: reuse a :func:`profile_model` result.
        cluster: profile on this cluster's workers (a ``gp.Cluster``, ``distributed.Client``
            or scheduler address), ``workers`` of them at once, each the blocks of one stage of
            the uniform split: the ops then pay for the workers sharing memory bandwidth and
            caches, in the workers' environment and threads, as the stages will; the slices'
            profiles are joined. Default (None): the same on a local cluster of ``workers``
            workers started for the profile as ``gp.train`` starts its own (one torch thread
            per rank, gnnpipe's worker environment), closed afterwards. To profile in this
            process instead, pass ``profile=profile_model(model, data)`` (``from gnnpipe.plan
            import profile_model``).
        latency: seconds per message besides its bytes.
        seed: seeds the sample chunking.
        repeats: profiled epochs at each of the profiler's two chunk counts (medians are used).
    """
    model = as_stack(model, data)  # a PyG BasicGNN or Sequential, as gp.train takes it
    data = check_inputs(model, data)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= len(model):
        raise ValueError(f"workers: expected 1 to {len(model)} (the model's blocks), "
                         f"got {workers!r}")
    limit = None if memory_limit is None else parse_bytes(memory_limit, "memory_limit")
    bw, n = parse_bandwidth(bandwidth), data.num_nodes
    counts = None if chunks is None else [chunks] if isinstance(chunks, int) else list(chunks)
    if counts is not None and (not counts or any(
            isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= n for c in counts)):
        raise ValueError(f"chunks: expected counts from 1 to {n} (the graph's nodes), "
                         f"got {chunks!r}")
    check.nonnegative_float("latency", latency)
    check.integer("seed", seed, 0)
    check.positive_int("repeats", repeats)
    if profile is not None and not isinstance(profile, Profile):
        raise TypeError(f"profile: expected a Profile from gnnpipe.plan.profile_model, "
                        f"got {type(profile).__name__}")
    if profile is not None and (len(profile.blocks) != len(model) or profile.num_nodes != n):
        raise ValueError("profile: it was measured for another model or graph")
    # memory first, from the memory model: a limit no split meets is refused before profiling
    top = max(profile.chunk_counts) if profile else profile_counts(4 * workers, n)[1]
    job = _memory_job(model, workers, top, seed)
    memory, shared = block_costs(model, data, job)
    if limit is not None and (least := least_memory(memory, workers, shared)) > limit:
        raise too_small(limit, workers, least)
    if profile is None:  # on the ranks' workers, or on ones started like gp.train starts them
        profile = profile_on_workers(cluster, workers, model, data, 4 * workers,
                                     repeats=repeats, seed=seed)
    if counts is None:  # where the per-row and per-chunk costs were measured, not beyond
        counts = chunk_candidates(workers, n, limit=max(profile.chunk_counts))
    prefix = [0, *itertools.accumulate(memory)]

    def fits(a: int, b: int) -> bool:
        return limit is None or prefix[b] - prefix[a] + shared <= limit

    tried = []
    for c in counts:
        seconds = [b.seconds(n, c) for b in profile.blocks]
        ranges = split_stages(seconds, memory, _transfers(profile, c, bw, latency), workers, limit,
                              stage_memory=shared)
        tried.append((predict(profile, ranges, c, bw, latency).makespan(), c, ranges))
    refined = [(*_refine(profile, r, c, bw, latency, fits), c)  # the three best counts
               for _, c, r in sorted(tried)[:3]]
    epoch, ranges, timeline, best = min(refined, key=lambda t: (t[0], t[3]))
    _, _, busy = _stage_costs(profile, ranges, best, bw, latency)
    chosen = dataclasses.replace(job, ranges=tuple(ranges), chunks=best)
    return Plan(
        ranges=tuple(ranges), chunks=best, epoch_time=epoch, stage_times=tuple(busy),
        memory=tuple(int(m) for m in estimate(model, data, chosen)["peak_bytes"]),
        layers=tuple(sum(c.aggregates for c in profile.blocks[a:b]) for a, b in ranges),
        timeline=timeline, profile=profile, memory_limit=limit, bandwidth=bw, latency=latency,
        candidates=pd.DataFrame([{"chunks": c, "epoch_time": t, "ranges": r}
                                 for t, c, r in tried]))
