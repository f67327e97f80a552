"""``gp.plan``: one search over every layout (mode, shape, split, chunks, memory options) of a
job on ``N`` workers, from one profile, under a memory limit."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any

import pandas as pd
from torch import nn
from torch_geometric.data import Data

from gnnpipe.analysis.memory import MemoryModel
from gnnpipe.core import checks as check
from gnnpipe.core.kinds import Mode, TrainSchedule
from gnnpipe.core.prediction import CANDIDATE_COLUMNS
from gnnpipe.core.units import format_bytes, parse_bandwidth, parse_bytes
from gnnpipe.nn import LayerStack
from gnnpipe.plan.calibrate import CONTENDS, measure_swap_wait
from gnnpipe.plan.costs import DEFAULT_LATENCY, Network
from gnnpipe.plan.layout import PLANNED_MODES, Layout, layouts
from gnnpipe.plan.profile import Profile, check_inputs, profile_counts, profile_on_workers
from gnnpipe.plan.result import Plan
from gnnpipe.plan.search import Candidate, Search
from gnnpipe.pyg import check_mode, for_training
from gnnpipe.runtime.cluster import resolve

__all__ = ["DEFAULT_SCHEDULES", "HEADROOM", "LIMITED_PIECES", "MAX_CHUNKS", "TIE", "memory_costs",
           "plan"]

logger = logging.getLogger(__name__)

#: The most chunks a plan weighs when the profile allows more.
MAX_CHUNKS = 64
#: The pipeline schedules a plan weighs by default.
DEFAULT_SCHEDULES = (TrainSchedule.GNNPIPE, TrainSchedule.ONE_F_ONE_B)
#: Predicted epochs within this share of the fastest one tie, and a tie goes to the layout whose
#: largest rank needs the least memory. Measured on the planner's grid (``benchmarks/
#: plan_choice.py``), fill-drain and 1F1B layouts of the same shape are predicted within 1% of
#: each other while 1F1B, holding a few chunks' tensors instead of all, measured 1-14% faster in
#: five of ten pairs (and 0.3-5% slower in five): the simulation of mean op costs does not see
#: what a smaller working set saves, and a tie broken by memory takes it.
TIE = 0.02
#: Share of ``memory_limit`` a plan keeps free by default: a layout fits when every rank's
#: estimate is at most ``(1 - headroom) × memory_limit``. Measured, ranks whose chunk tensors are
#: under 1 MiB hold 1.2-1.6× their estimate (glibc's heap keeps holes between them) unless a Dask
#: ``memory_limit`` or the plan's makes them trim (1.02-1.13×: ``benchmarks/heap_ceiling.py``;
#: 1.08× for the capped GCN-16 case of ``benchmarks/plan_choice.py``): 15% covers the 1.13× measured, 10% did not.
HEADROOM = 0.15
#: Under a memory limit a worker profiles its share of the blocks in this many ranges, one after
#: another (a 100,000-node GCNII-32's half, 17 blocks with their buffers, overran workers capped
#: at 0.75x single's need).
LIMITED_PIECES = 4


def memory_costs(model: LayerStack, data: Data, workers: int, chunks: int | None = None,
                 seed: int = 0) -> tuple[list[int], int]:
    """What a pipeline's split is priced by: per block, the bytes a stage holding it adds, and
    the bytes every stage holds besides (:meth:`gnnpipe.analysis.memory.MemoryModel.block_costs`,
    the model of ``gp.estimate_memory``), for a ``workers``-stage pipeline of ``chunks`` chunks
    (default ``4 × workers``). A split fits ``memory_limit`` when each stage's blocks' sum plus
    the second number does."""
    model = for_training(model, Mode.SINGLE.value, data)
    data = check_inputs(model, data)
    memory = MemoryModel(model, data, seed)
    layout = Layout(Mode.PIPELINE, stages=workers, chunks=chunks or 4 * workers)
    return memory.block_costs(Search(model, data, _NO_PROFILE, memory, Network(1.0), None,
                                     0).job(layout))


_NO_PROFILE = Profile((), 0, (1, 1), ())  # jobs and memory need no costs


def _modes(modes: Any) -> tuple[Mode, ...]:
    if modes is None:
        return PLANNED_MODES
    values = [modes] if isinstance(modes, str) else list(modes)
    names = tuple(m.value for m in PLANNED_MODES)
    if not values or any(str(v) not in names for v in values):
        raise ValueError(f"modes: expected some of {names}, got {modes!r}")
    return tuple(Mode(str(v)) for v in values)


def _schedules(schedules: Any) -> tuple[TrainSchedule, ...]:
    if schedules is None:
        return DEFAULT_SCHEDULES
    values = [schedules] if isinstance(schedules, str) else list(schedules)
    if not values:
        raise ValueError("schedules: expected at least one of ('gnnpipe', '1f1b'), got none")
    return tuple(TrainSchedule.parse("schedules", v) for v in values)


def _runnable(model: Any, stack: Any, modes: tuple[Mode, ...]) -> tuple[Mode, ...]:
    """Those of ``modes`` ``gp.train`` runs ``model`` (converted: ``stack``) in (its checks,
    before any worker starts: a layer's own dropout in ``graph``, a message flow in
    ``hybrid``), the others left out with a warning; ``ValueError`` with the reasons where none
    is left."""
    named = model if isinstance(model, nn.Module) else stack
    kept, refused = [], []
    for mode in modes:
        try:
            check_mode(named, mode.value)
        except ValueError as exc:
            refused.append(f"{mode.value} ({exc})")
        else:
            kept.append(mode)
    if not kept:
        raise ValueError("modes: gp.train runs the model in none of them: " + "; ".join(refused))
    for reason in refused:
        logger.warning("plan: mode %s is left out", reason)
    return tuple(kept)


def _check(model: LayerStack, data: Data, workers: Any, chunks: Any, latency: Any, seed: Any,
           repeats: Any, profile: Any, compact: Any) -> int | None:
    """The arguments checked before anything runs; the largest chunk count allowed."""
    check.positive_int("workers", workers)
    n = data.num_nodes
    top = None
    if chunks is not None:
        top = check.positive_int("chunks", chunks)
        if top > n:
            raise ValueError(f"chunks: expected at most {n} (the graph's nodes), got {chunks!r}")
    if latency is not None:
        check.nonnegative_float("latency", latency)
    check.integer("seed", seed, 0)
    check.positive_int("repeats", repeats)
    if compact not in (None, True, False):
        raise TypeError(f"compact: expected None, True or False, got {compact!r}")
    if profile is not None and not isinstance(profile, Profile):
        raise TypeError(f"profile: expected a Profile from gnnpipe.plan.profile_model or "
                        f"plan.profile, got {type(profile).__name__}")
    if profile is not None and (len(profile.blocks) != len(model) or profile.num_nodes != n):
        raise ValueError("profile: it was measured for another model or graph")
    return top


def _refuse(search: Search, candidates: list[Layout], limit: int, headroom: float) -> None:
    """``ValueError`` naming the smallest need when no layout fits ``limit`` less its
    ``headroom`` (before any profiling: the memory model alone decides)."""
    needs = [(search.least(layout), layout) for layout in candidates]
    least, layout = min(needs, key=lambda t: t[0])
    if search.limit is not None and least > search.limit:
        kept = (f" (with headroom={headroom:g}: {format_bytes(search.limit)} of it may be "
                f"planned)" if headroom else "")
        raise ValueError(f"memory_limit: {format_bytes(limit)} ({limit:,} bytes) is too small for "
                         f"every layout on {_workers(candidates)} worker(s){kept}; the least any "
                         f"rank can need is {format_bytes(least)} ({least:,} bytes), with "
                         f"{layout.describe()}")


def _budget(limit: int | None, headroom: float) -> int | None:
    """What a rank may be planned to hold: ``limit`` less ``headroom`` of it."""
    if not isinstance(headroom, (int, float)) or isinstance(headroom, bool) \
            or not 0 <= headroom < 1:
        raise ValueError(f"headroom: expected a share of memory_limit in [0, 1), got "
                         f"{headroom!r}")
    return None if limit is None else int(limit * (1 - headroom))


def _workers(candidates: Sequence[Layout]) -> int:
    return max((c.workers for c in candidates), default=1)


def plan(model: LayerStack, data: Data, workers: int, memory_limit: float | str | None = None,
         bandwidth: float | str | None = None, *, modes: Any = None, chunks: int | None = None,
         compact: bool | None = None, schedules: Any = None, profile: Profile | None = None,
         cluster: Any = None, latency: float | None = None, seed: int = 0,
         repeats: int = 1, headroom: float = HEADROOM) -> Plan:
    """How to run ``model`` on ``data`` with ``workers`` Dask workers: the fastest predicted
    layout that fits ``memory_limit``, among every mode, shape, split, chunk count and memory
    option.

    The model is profiled once (per-block costs inside the chunked epoch, on the workers); then
    every layout of ``modes`` is weighed (:func:`gnnpipe.plan.layout.layouts`): ``single``;
    ``pipeline`` with 2 to ``workers`` stages, its split by dynamic programming and nudged by
    simulation, for chunk counts of 1 to 16 × its stages; ``graph`` with 2 to ``workers``
    parts; ``hybrid`` with ``ways × stages <= workers``; staged layouts in each of
    ``schedules``, with and without ``recompute``, and with 16-bit histories and wire. Each gets
    a predicted epoch (:mod:`gnnpipe.plan.costs`), every rank's peak memory
    (``gp.estimate_memory``'s model) and its bytes per epoch (``gp.comm_volume``). Without a
    ``memory_limit`` the layouts that only save memory (``recompute``, and 16-bit ones unless
    ``compact=True``) cannot be chosen and are not weighed. Where a ``graph`` layout contends
    for the pick and the profile has no ``swap_wait`` yet, that layout runs 2 epochs on the
    cluster to measure what its lockstep halo swaps wait (:mod:`gnnpipe.plan.calibrate`; the
    run's epoch beyond its prediction, or short of it, per swap), and every ``graph`` layout
    is weighed again with it.

    Args:
        model: the stack (or a PyG ``BasicGNN`` / ``Sequential``, as ``gp.train`` takes it).
        data: the graph it trains on.
        workers: the Dask workers available (a layout may use fewer).
        memory_limit: bytes a rank may hold (``"8GB"``, ``"512MiB"``); every rank's estimate
            must fit it less ``headroom``; a limit no layout meets is refused from the memory
            model before anything is profiled. (default: none)
        bandwidth: bytes/s between workers (``"1GB/s"``). (default: what the profile measured
            between two workers, else 1 GB/s)
        modes: the modes to weigh, some of ``single``, ``pipeline``, ``graph``, ``hybrid``.
            (default: all)
        chunks: the most chunks a staged layout may have. (default: what the profile measured,
            at most :data:`MAX_CHUNKS`)
        compact: 16-bit histories and wire (they change what is computed, by less than half a
            point of accuracy where measured): ``None`` weighs them but chooses one only when no
            float32 layout fits; ``True`` chooses them on speed alone; ``False`` leaves them out.
            (default: ``None``)
        schedules: the pipeline schedules to weigh. (default: :data:`DEFAULT_SCHEDULES`)
        profile: a profile to reuse (``plan.profile`` of another plan, or
            ``gnnpipe.plan.profile_model``): nothing is profiled again.
        cluster: profile on this cluster's workers (a ``gp.Cluster``, ``distributed.Client``
            or scheduler address), each timing one stage's share of the blocks at once, as the
            ranks will run. (default: workers started for the profile as ``gp.train`` starts
            its ranks, closed afterwards)
        latency: seconds a message costs besides its bytes. (default: what the profile measured,
            else :data:`~gnnpipe.plan.costs.DEFAULT_LATENCY`)
        seed: seeds chunkings and partitions (as ``gp.train``'s ``seed``).
        repeats: timed profile epochs (medians), after the untimed warm-up (two epochs on a
            fresh worker). (default: ``1``: each epoch already times every block over every
            chunk)
        headroom: share of ``memory_limit`` kept free for what the estimate does not see
            (allocator slack; see :data:`HEADROOM`); ``0`` plans up to the limit itself.
            (default: ``0.15``)

    Returns:
        The :class:`~gnnpipe.plan.result.Plan`; ``plan.table()`` ranks every candidate and
        says why each lost; ``gp.train(model, data, plan=plan)`` runs it.
    """
    stack = for_training(model, Mode.SINGLE.value, data)
    wanted = _runnable(model, stack, _modes(modes))
    model = stack
    data = check_inputs(model, data)
    top = _check(model, data, workers, chunks, latency, seed, repeats, profile, compact)
    limit = None if memory_limit is None else parse_bytes(memory_limit, "memory_limit")
    budget = _budget(limit, headroom)
    given = Network(parse_bandwidth(bandwidth), DEFAULT_LATENCY if latency is None else latency)
    candidates = [c for c in layouts(workers, len(model), wanted, compact, _schedules(schedules))
                  if limit is not None or compact or not (c.recompute or c.compact)]
    if not candidates:
        raise ValueError(f"modes: {', '.join(m.value for m in wanted)} has no layout on {workers} "
                         "worker(s) (pipeline and graph need 2 or more, hybrid 4); give more "
                         "workers or other modes")
    slices = min(workers, len(model))
    high = max(profile.chunk_counts) if profile else profile_counts(4 * slices,
                                                                   data.num_nodes)[1]
    max_chunks = min(top or MAX_CHUNKS, high)
    memory = MemoryModel(model, data, seed)
    clock = _Clock()
    if limit is not None:
        _refuse(Search(model, data, _NO_PROFILE, memory, given, budget, max_chunks), candidates,
                limit, headroom)
    clock.lap("memory_check")
    # workers to profile and measure on: the cluster given, else our own (not needed to reuse
    # a profile without one)
    handle, owned = (None, False) if profile is not None and cluster is None else resolve(
        cluster, workers)
    try:
        if profile is None:
            # under a limit, one chunk at a time, 16-bit buffers and a quarter of a worker's
            # blocks at a time: a slice may not fit otherwise
            profile = profile_on_workers(handle, slices, model, data, 4 * slices,
                                         repeats=repeats, seed=seed, lean=limit is not None,
                                         pieces=None if limit is None else LIMITED_PIECES * slices)
        clock.lap("profile")
        net = _network(given, profile, bandwidth is not None, latency is not None)
        search = Search(model, data, profile, memory, net, budget, max_chunks)
        weighed = [search.evaluate(layout) for layout in candidates]
        clock.lap("search")
        if handle is not None:
            measured, weighed = _measure_swaps(handle, search, weighed, compact)
            if measured is not search:
                search = measured
                clock.lap("swap_wait")
    finally:
        if owned and handle is not None:
            handle.close()
    profile = search.profile
    chosen, table = _rank(weighed, compact)
    logger.info("planned in %s", ", ".join(f"{k} {v:.1f} s" for k, v in clock.laps.items()))
    return Plan(layout=chosen.layout, epoch_time=chosen.epoch_time, peak_bytes=chosen.peak_bytes,
                comm_bytes=chosen.comm_bytes, profile=profile, stage_times=chosen.stage_times,
                timeline=chosen.timeline, candidates=table, workers=workers, memory_limit=limit,
                headroom=headroom if limit is not None else 0.0, bandwidth=net.bandwidth,
                latency=net.latency, seconds=clock.laps)


def _measure_swaps(cluster: Any, search: Search, weighed: list[Candidate],
                   compact: bool | None) -> tuple[Search, list[Candidate]]:
    """Where the best ``graph`` layout that may be chosen contends for the pick (within
    :data:`~gnnpipe.plan.calibrate.CONTENDS` of the chosen one) and the profile has no
    ``swap_wait`` yet: run it briefly on ``cluster`` for the wait, and weigh every ``graph``
    layout again with it (without it, where that run fails)."""
    if search.profile.swap_wait is not None:
        return search, weighed
    float32_fits = _float32_fits(weighed)
    chosen = _ranked(weighed, compact)[0][0]
    best = min((c for c in weighed if c.layout.mode is Mode.GRAPH and c.fits
                and not _deferred(c, float32_fits, compact)),
               key=lambda c: c.epoch_time, default=None)
    if best is None or best.epoch_time > CONTENDS * chosen.epoch_time:
        return search, weighed
    try:
        measured = measure_swap_wait(cluster, search.model, search.data,
                                     search.job(best.layout), search.profile, best.epoch_time)
    except RuntimeError as exc:  # a rank failed (killed for memory, most often): plan without
        logger.warning("plan: the swap-wait run of %s failed, its waits are not counted: %s",
                       best.layout.describe(), exc)
        return search, weighed
    again = search.with_profile(measured)
    return again, [again.evaluate(c.layout) if c.layout.mode is Mode.GRAPH else c
                   for c in weighed]


class _Clock:
    """Seconds of each phase, each lap timed from the one before."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name], self._last = now - self._last, now


def _network(given: Network, profile: Profile, bandwidth: bool, latency: bool) -> Network:
    """The bandwidth and latency given, else what the profile measured (where it did)."""
    return Network(given.bandwidth if bandwidth or not profile.bandwidth else profile.bandwidth,
                   given.latency if latency or not profile.latency else profile.latency)


def _order(c: Candidate, float32_fits: bool, compact: bool | None) -> tuple:
    """Fitting first; 16-bit layouts after float32 ones while a float32 one fits (unless
    ``compact``); then the fastest."""
    return (not c.fits, _deferred(c, float32_fits, compact), c.epoch_time)


def _ranked(weighed: Sequence[Candidate],
            compact: bool | None) -> tuple[list[Candidate], list[Candidate]]:
    """``weighed`` by :func:`_order` with the chosen one first, and the candidates tied with
    the first by :func:`_order`: of its class (fitting, deferred) and within :data:`TIE` of its
    predicted epoch. The chosen one is the tied one needing the least memory on its largest
    rank."""
    float32_fits = _float32_fits(weighed)
    ranked = sorted(weighed, key=lambda c: _order(c, float32_fits, compact))
    first = ranked[0]
    bound = (*_order(first, float32_fits, compact)[:2], first.epoch_time * (1 + TIE))
    tied = list(itertools.takewhile(lambda c: _order(c, float32_fits, compact) <= bound, ranked))
    chosen = min(tied, key=lambda c: (max(c.peak_bytes), c.epoch_time))
    return [chosen, *(c for c in ranked if c is not chosen)], tied


def _float32_fits(weighed: Sequence[Candidate]) -> bool:
    """Whether a layout storing and sending float32 fits."""
    return any(c.fits and not c.layout.compact for c in weighed)


def _deferred(c: Candidate, float32_fits: bool, compact: bool | None) -> bool:
    """A 16-bit layout while a float32 one fits, under ``compact=None``: chosen only after."""
    return compact is None and float32_fits and c.layout.compact


def _rank(weighed: list[Candidate], compact: bool | None) -> tuple[Candidate, pd.DataFrame]:
    """The chosen candidate and the table of all, best first, each with why it lost."""
    float32_fits = _float32_fits(weighed)
    ranked, tied = _ranked(weighed, compact)
    chosen = ranked[0]
    rows = []
    for c in ranked:
        lay = c.layout
        rows.append({
            "layout": lay.describe(), "mode": lay.mode.value, "stages": lay.stages,
            "ways": lay.ways, "parts": lay.parts, "chunks": lay.chunks,
            "ranges": [list(r) for r in lay.ranges],
            "schedule": lay.schedule.value, "recompute": lay.recompute,
            "history_dtype": lay.history_dtype.value, "wire_dtype": lay.wire_dtype.value,
            "workers": lay.workers, "epoch_time": c.epoch_time, "peak_bytes": max(c.peak_bytes),
            "rank_peak_bytes": list(c.peak_bytes),
            "comm_bytes": c.comm_bytes, "fits": c.fits, "chosen": c is chosen,
            "reason": _reason(c, chosen, any(c is t for t in tied), float32_fits,
                              compact)})
    return chosen, pd.DataFrame(rows, columns=list(CANDIDATE_COLUMNS))


def _reason(c: Candidate, chosen: Candidate, tied: bool, float32_fits: bool,
            compact: bool | None) -> str:
    if c is chosen:
        fit = "fits the memory limit" if c.fits else "no layout fits the memory limit"
        return f"chosen: the fastest predicted epoch among the layouts that {fit}" if c.fits \
            else f"chosen: {fit}; this one needs the least"
    if not c.fits:
        return (f"needs {format_bytes(max(c.peak_bytes))} on a rank, over the memory limit "
                f"(less its headroom)")
    if _deferred(c, float32_fits, compact):
        return "stores or sends 16-bit values, not needed: a float32 layout fits"
    ratio = c.epoch_time / chosen.epoch_time if chosen.epoch_time > 0 else float("inf")
    if tied:
        return (f"ties: predicted epoch {ratio:.2f}x the chosen one's (within {TIE:.0%}), "
                f"needs more memory on a rank ({format_bytes(max(c.peak_bytes))} against "
                f"{format_bytes(max(chosen.peak_bytes))})")
    return f"slower: predicted epoch {ratio:.2f}x the chosen one's"

