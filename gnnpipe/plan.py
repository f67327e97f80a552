"""Automatic stage partitioning (RaNNC-style): profile blocks, split stages by DP, pick chunks."""

from __future__ import annotations

import copy
import itertools
import math
import numbers
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe import datasets
from gnnpipe.engine.chunked import StageExecutor, Techniques
from gnnpipe.engine.graph import Adjacency, normalized_adjacency
from gnnpipe.events import Timeline
from gnnpipe.models import LayerStack
from gnnpipe.partition import chunk as make_chunks
from gnnpipe.schedule import gnnpipe as gnnpipe_schedule
from gnnpipe.simulate import simulate

BYTES_PER_VALUE = 4  # fp32
#: Stage-to-stage bandwidth assumed when none is given (bytes/s; gloo over loopback TCP).
DEFAULT_BANDWIDTH = 1e9
#: Seconds each point-to-point message costs besides its bytes (gloo latency, Python).
DEFAULT_LATENCY = 1e-4
MAX_CHUNKS = 64
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}
Fits = Callable[[int, int], bool]


# --------------------------------------------------------------------------- units
def parse_bytes(value: float | str, name: str = "memory_limit") -> int:
    """Bytes from an int, a float or a string such as ``"8GB"`` (10⁹) or ``"512MiB"`` (2²⁰)."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if unit not in _UNITS:
            raise ValueError(f"{name}: expected a size such as '8GB', '512MiB' or 1000000, "
                             f"got {value!r}")
        value = float(match.group(1)) * _UNITS[unit]
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected bytes as a number or a string such as '8GB', "
                        f"got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a positive size, got {value!r}")
    return int(value)


def format_bytes(nbytes: float) -> str:
    """``1234567`` → ``'1.23 MB'`` (decimal units, as :func:`parse_bytes` reads them)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{int(nbytes)} B"


def _bandwidth(value: float | str | None) -> float:
    if value is None:
        return DEFAULT_BANDWIDTH
    if isinstance(value, str):
        value = value.strip().removesuffix("/s")
    return float(parse_bytes(value, "bandwidth"))


# --------------------------------------------------------------------------- profiler
@dataclass(frozen=True)
class BlockCost:
    """Measured costs of one block.

    ``forward_s``/``backward_s`` are seconds per chunk row, ``*_fixed_s`` seconds per chunk op
    whatever its rows (a one-row chunk), ``step_s`` one Adam step; ``activation_bytes`` are kept
    per row from a chunk's forward to its backward, ``buffer_bytes`` held per graph row (``Hbuf``,
    snapshot, ``dZbuf``); Adam's state (``optimizer_bytes``) is twice ``param_bytes``.
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
    (``boundary_bytes[j]``: between blocks ``j`` and ``j + 1``, one direction)."""

    blocks: tuple[BlockCost, ...]
    num_nodes: int
    sample_rows: int
    boundary_bytes: tuple[int, ...]

    @property
    def chunk_overhead(self) -> float:
        """Seconds a near-empty chunk costs forward plus backward through the whole model."""
        return sum(b.forward_fixed_s + b.backward_fixed_s for b in self.blocks)

    def to_frame(self) -> pd.DataFrame:
        """One row per block, with per-epoch seconds (one chunk) and bytes at this graph's size."""
        frame = pd.DataFrame([b.__dict__ for b in self.blocks]).set_index("index")
        frame["epoch_s"] = [b.seconds(self.num_nodes, 1) for b in self.blocks]
        frame["memory"] = [b.memory(self.num_nodes) for b in self.blocks]
        return frame


def _nbytes(tensors: dict[tuple, int], t: Tensor) -> Tensor:
    tensors[(t.data_ptr(), tuple(t.shape))] = t.numel() * t.element_size()
    return t


class _BlockBench:
    """One block alone in its own executor, fed a sample chunk (0) and a one-row chunk (1)."""

    def __init__(self, model: LayerStack, b: int, ordered: Data, adj: Adjacency,
                 bounds: list[int]) -> None:
        self.b, self.bounds, self.block = b, bounds, model.blocks[b]
        self.ex = ex = StageExecutor(model, b, b + 1, adj, bounds, Techniques(), seed=0,
                                     input_grad=b > 0)
        ex.begin_epoch(0)
        widths = model.boundary_widths(b) if b > 0 else []
        num_train = max(int(ordered.train_mask.sum()), 1)
        gen = torch.Generator().manual_seed(b)
        self.feeds = []
        for lo, hi in itertools.pairwise(bounds[:3]):
            inputs = [torch.randn(hi - lo, w, generator=gen) for w in widths] or [ordered.x[lo:hi]]
            last = (ordered.y[lo:hi], ordered.train_mask[lo:hi], num_train)
            self.feeds.append((inputs, last if ex.is_last else None))
        params = list(self.block.parameters())
        self.opt = torch.optim.Adam(params, lr=1e-3) if params else None

    def sample(self) -> tuple[float, ...]:
        """CPU seconds (of this thread, or of the process when torch runs several): forward and
        backward of the sample chunk, of the one-row chunk, and an Adam step."""
        clock = time.thread_time if torch.get_num_threads() == 1 else time.process_time
        times = []
        for c, (inputs, target) in enumerate(self.feeds):
            t0 = clock()
            outs = self.ex.forward(c, inputs, target)
            t1 = clock()
            grads = None if self.ex.is_last else [torch.ones_like(o) for o in outs]
            t2 = clock()
            self.ex.backward(c, grads)
            times += [t1 - t0, clock() - t2]
        t0 = clock()
        if self.opt is not None:
            self.opt.step()
        return (*times, clock() - t0)

    def cost(self, samples: list[tuple[float, ...]], num_nodes: int) -> BlockCost:
        """Medians of ``samples``; bytes kept by a sample chunk (what autograd saves, plus the
        received inputs the executor holds), buffers and parameters."""
        fwd, bwd, fwd_one, bwd_one, step = (statistics.median(col) for col in zip(*samples))
        kept: dict[tuple, int] = {}
        with torch.autograd.graph.saved_tensors_hooks(lambda t: _nbytes(kept, t), lambda t: t):
            self.ex.forward(0, *self.feeds[0])
        self.ex.saved.clear()
        for t in self.feeds[0][0] if self.b > 0 else []:
            _nbytes(kept, t)
        rows, floor = self.bounds[1], 1e-12
        params = sum(p.numel() * p.element_size() for p in self.block.parameters())
        buffers = sum(t.numel() * t.element_size() for buf in self.ex.buffers.values()
                      for t in (buf.H, buf.dZ, buf.snap) if t is not None)
        return BlockCost(
            index=self.b, name=type(self.block).__name__, aggregates=self.block.aggregates,
            out_dim=self.block.out_dim, forward_s=max(fwd - fwd_one, floor * rows) / (rows - 1),
            backward_s=max(bwd - bwd_one, floor * rows) / (rows - 1),
            forward_fixed_s=max(fwd_one, floor), backward_fixed_s=max(bwd_one, floor),
            step_s=step, activation_bytes=sum(kept.values()) / rows,
            buffer_bytes=buffers / num_nodes, param_bytes=params, optimizer_bytes=2 * params)


def profile_model(model: LayerStack, data: Data, chunks: int = 8, *, warmup: int = 1,
                  repeats: int = 6, passes: int = 3, seed: int = 0,
                  threads: int | None = 1) -> Profile:
    """Time every block alone on one sample chunk of the real graph, forward and backward apart.

    Each block runs in its own :class:`~gnnpipe.engine.chunked.StageExecutor` (on a copy of the
    model, so its weights stay untouched) on chunk 0 of ``gp.chunk(data, chunks)`` and on a
    one-row chunk; the difference gives seconds per row, the one-row chunk the per-op overhead.
    Times are CPU seconds (what an op costs on a core of its own, however busy the machine), each
    the median of ``repeats`` runs taken in ``passes`` rounds over all blocks (so a burst of load
    does not land on one block only), each round after ``warmup`` runs. ``threads`` torch
    threads are used while profiling (the Dask ranks use one).
    """
    _check(model, data)
    n = data.num_nodes
    if n < 3:
        raise ValueError(f"data: profiling needs at least 3 nodes, got {n}")
    for name, value in (("repeats", repeats), ("passes", passes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    parts = make_chunks(data, max(1, min(chunks, n // 2)), seed=seed)
    ordered = parts.apply(data)
    adj = normalized_adjacency(ordered.edge_index, n, model.norm)
    rows = min(max(int(parts.bounds[1]), 2), n - 1)
    bounds = [0, rows, rows + 1] + ([n] if rows + 1 < n else [])
    work = copy.deepcopy(model).train()
    passes = min(passes, repeats)
    samples: list[list[tuple[float, ...]]] = [[] for _ in work.blocks]
    costs: list[BlockCost] = []
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        for p in range(passes):
            for b in range(len(work)):
                bench = _BlockBench(work, b, ordered, adj, bounds)
                for _ in range(warmup):
                    bench.sample()
                samples[b] += [bench.sample() for _ in range(math.ceil(repeats / passes))]
                if p == passes - 1:
                    costs.append(bench.cost(samples[b], n))
    finally:
        torch.set_num_threads(before)
    cuts = tuple(sum(model.boundary_widths(j)) * BYTES_PER_VALUE for j in range(1, len(model)))
    return Profile(tuple(costs), n, rows, cuts)


def _check(model: LayerStack, data: Data) -> None:
    datasets.validate(data)
    if not isinstance(model, LayerStack):
        raise TypeError(f"model: expected a gnnpipe LayerStack, got {type(model).__name__}")
    if data.x.size(1) != model.in_dim:
        raise ValueError(f"model: its input width {model.in_dim} does not match data.x's "
                         f"{data.x.size(1)} features")


# --------------------------------------------------------------------------- stage DP
def _stage_time(prefix: list[float], boundary: Sequence[float], i: int, j: int) -> float:
    """Seconds of stage ``[i, j)``: its blocks plus the transfers at both of its cuts."""
    t = prefix[j] - prefix[i]
    if i > 0:
        t += boundary[i - 1]
    if j < len(prefix) - 1:
        t += boundary[j - 1]
    return t


def _dp(costs: Sequence[float], boundary: Sequence[float], stages: int, fits: Fits,
        bound: float | None = None) -> tuple[float, list[tuple[int, int]]]:
    """The split with the smallest bottleneck or, given ``bound``, the smallest total time among
    splits whose stages all take at most ``bound``; ``(inf, [])`` when no split fits."""
    n = len(costs)
    prefix = [0.0, *itertools.accumulate(float(c) for c in costs)]
    value = [[math.inf] * (n + 1) for _ in range(stages + 1)]
    back = [[-1] * (n + 1) for _ in range(stages + 1)]
    value[0][0] = 0.0
    for k, j in itertools.product(range(1, stages + 1), range(1, n + 1)):
        for i in range(k - 1, j):
            t = _stage_time(prefix, boundary, i, j)
            if value[k - 1][i] == math.inf or not fits(i, j) or (bound is not None and t > bound):
                continue
            v = value[k - 1][i] + t if bound is not None else max(value[k - 1][i], t)
            if v < value[k][j]:
                value[k][j], back[k][j] = v, i
    if value[stages][n] == math.inf:
        return math.inf, []
    ranges, j = [], n
    for k in range(stages, 0, -1):
        ranges.append((back[k][j], j))
        j = back[k][j]
    return value[stages][n], ranges[::-1]


def split_stages(costs: Sequence[float], memory: Sequence[float], boundary_costs: Sequence[float],
                 stages: int, memory_limit: float | None = None) -> list[tuple[int, int]]:
    """Contiguous stage ranges minimising the slowest stage's time, each stage's memory fitting.

    Args:
        costs: seconds of each block.
        memory: bytes of each block (a stage holds the sum of its blocks').
        boundary_costs: ``len(costs) - 1`` seconds; ``boundary_costs[j]`` is paid by both stages
            beside a cut between blocks ``j`` and ``j + 1``.
        stages: number of (non-empty) stages.
        memory_limit: bytes a stage may hold; ``None`` for no limit.

    Among splits with the smallest bottleneck, the one with the smallest total time is returned.

    Raises:
        ValueError: on mismatched lengths, an impossible stage count, or when no split fits
            ``memory_limit`` (the message names the smallest limit that would fit).
    """
    n = len(costs)
    if len(memory) != n or len(boundary_costs) != max(n - 1, 0):
        raise ValueError(f"memory, boundary_costs: expected {n} and {max(n - 1, 0)} values for "
                         f"{n} blocks, got {len(memory)} and {len(boundary_costs)}")
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= n:
        raise ValueError(f"stages: expected 1 to {n} (at least one block per stage), "
                         f"got {stages!r}")
    mem = [0.0, *itertools.accumulate(float(m) for m in memory)]

    def fits(i: int, j: int) -> bool:
        return memory_limit is None or mem[j] - mem[i] <= memory_limit

    neck, _ = _dp(costs, boundary_costs, stages, fits)
    if neck == math.inf:
        least = math.ceil(_dp(memory, [0.0] * (n - 1), stages, lambda i, j: True)[0])
        raise ValueError(f"memory_limit: {format_bytes(memory_limit)} "
                         f"({int(memory_limit):,} bytes) is too small for {stages} stages; the "
                         f"smallest memory limit that fits is {format_bytes(least)} "
                         f"({least:,} bytes)")
    return _dp(costs, boundary_costs, stages, fits, bound=neck * (1 + 1e-9))[1]


# --------------------------------------------------------------------------- plans
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
    costs, delay, _ = _stage_costs(profile, ranges, chunks, _bandwidth(bandwidth), latency)
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
        memory: predicted bytes each stage holds.
        layers: GNN (aggregating) layers in each stage.
        timeline: the simulated epoch.
        profile: the measured block costs the plan came from.
        candidates: every chunk count tried, with its DP split and that split's predicted epoch
            (before the boundaries were nudged).
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

    def __repr__(self) -> str:
        limit = "none" if self.memory_limit is None else format_bytes(self.memory_limit)
        head = (f"Plan: {len(self.ranges)} stages, {self.chunks} chunks, predicted epoch "
                f"{self.epoch_time:.4g} s (memory limit {limit})")
        return head + "\n" + self.table().to_string(float_format=lambda v: f"{v:.4g}")


def plan(model: LayerStack, data: Data, workers: int, memory_limit: float | str | None = None,
         bandwidth: float | str | None = None, *, chunks: int | Sequence[int] | None = None,
         profile: Profile | None = None, latency: float = DEFAULT_LATENCY, seed: int = 0,
         repeats: int = 6) -> Plan:
    """Choose stage boundaries and the chunk count for a ``workers``-stage pipeline.

    Profiles ``model`` on ``data`` (unless ``profile`` is given), then for every candidate chunk
    count splits the blocks by :func:`split_stages` (compute plus boundary transfer at
    ``bandwidth`` bytes/s, memory under ``memory_limit``) and simulates GNNPipe's schedule. For
    the three fastest counts, boundaries are then nudged one block at a time while the simulated
    epoch shortens; the fastest predicted epoch wins.

    Args:
        model: the stack to split.
        data: the graph it trains on.
        workers: pipeline stages (one Dask worker each).
        memory_limit: bytes per stage, as a number or a string (``"8GB"``, ``"512MiB"``).
        bandwidth: stage-to-stage bytes/s (a number or ``"1GB/s"``); default
            :data:`DEFAULT_BANDWIDTH`.
        chunks: a chunk count or counts to consider; default :func:`chunk_candidates`.
        profile: reuse a :func:`profile_model` result.
        latency: seconds per message besides its bytes.
        seed: seeds the sample chunking.
        repeats: timed runs per block (their median is used).
    """
    _check(model, data)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= len(model):
        raise ValueError(f"workers: expected 1 to {len(model)} (the model's blocks), "
                         f"got {workers!r}")
    limit = None if memory_limit is None else parse_bytes(memory_limit, "memory_limit")
    bw, n = _bandwidth(bandwidth), data.num_nodes
    counts = (chunk_candidates(workers, n) if chunks is None
              else [chunks] if isinstance(chunks, int) else list(chunks))
    if not counts or any(isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= n
                         for c in counts):
        raise ValueError(f"chunks: expected counts from 1 to {n} (the graph's nodes), "
                         f"got {chunks!r}")
    if profile is None:
        profile = profile_model(model, data, 4 * workers, repeats=repeats, seed=seed)
    elif len(profile.blocks) != len(model) or profile.num_nodes != n:
        raise ValueError("profile: it was measured for another model or graph")
    memory = [b.memory(n) for b in profile.blocks]
    prefix = [0, *itertools.accumulate(memory)]

    def fits(a: int, b: int) -> bool:
        return limit is None or prefix[b] - prefix[a] <= limit

    tried = []
    for c in counts:
        seconds = [b.seconds(n, c) for b in profile.blocks]
        ranges = split_stages(seconds, memory, _transfers(profile, c, bw, latency), workers, limit)
        tried.append((predict(profile, ranges, c, bw, latency).makespan(), c, ranges))
    refined = [(*_refine(profile, r, c, bw, latency, fits), c)  # the three best counts
               for _, c, r in sorted(tried)[:3]]
    epoch, ranges, timeline, best = min(refined, key=lambda t: (t[0], t[3]))
    _, _, busy = _stage_costs(profile, ranges, best, bw, latency)
    return Plan(
        ranges=tuple(ranges), chunks=best, epoch_time=epoch, stage_times=tuple(busy),
        memory=tuple(sum(memory[a:b]) for a, b in ranges),
        layers=tuple(sum(c.aggregates for c in profile.blocks[a:b]) for a, b in ranges),
        timeline=timeline, profile=profile, memory_limit=limit, bandwidth=bw, latency=latency,
        candidates=pd.DataFrame([{"chunks": c, "epoch_time": t, "ranges": r}
                                 for t, c, r in tried]))
