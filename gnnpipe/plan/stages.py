"""Contiguous stage boundaries by dynamic programming: the smallest bottleneck under a memory limit."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

from gnnpipe.core.units import format_bytes

__all__ = ["Fits", "least_memory", "split_stages", "too_small"]

Fits = Callable[[int, int], bool]


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
                 stages: int, memory_limit: float | None = None,
                 stage_memory: float = 0.0) -> list[tuple[int, int]]:
    """Contiguous stage ranges minimising the slowest stage's time, each stage's memory fitting.

    Args:
        costs: seconds of each block.
        memory: bytes of each block (a stage holds the sum of its blocks').
        boundary_costs: ``len(costs) - 1`` seconds; ``boundary_costs[j]`` is paid by both stages
            beside a cut between blocks ``j`` and ``j + 1``.
        stages: number of (non-empty) stages.
        memory_limit: bytes a stage may hold; ``None`` for no limit.
        stage_memory: bytes every stage holds besides its blocks' (the adjacency, buffers of
            one chunk at a time: :func:`gnnpipe.analysis.memory.block_costs`).

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
        return memory_limit is None or mem[j] - mem[i] + stage_memory <= memory_limit

    neck, _ = _dp(costs, boundary_costs, stages, fits)
    if neck == math.inf:
        assert memory_limit is not None, "only a memory limit can rule out every split"
        raise too_small(memory_limit, stages, least_memory(memory, stages, stage_memory))
    return _dp(costs, boundary_costs, stages, fits, bound=neck * (1 + 1e-9))[1]


def least_memory(memory: Sequence[float], stages: int, stage_memory: float = 0.0) -> int:
    """The smallest memory limit some split of the blocks into ``stages`` stages fits: the
    split whose largest stage (its blocks' bytes plus ``stage_memory``) is smallest."""
    return math.ceil(_dp(memory, [0.0] * (len(memory) - 1), stages, lambda i, j: True)[0]
                     + stage_memory)


def too_small(memory_limit: float, stages: int, least: int) -> ValueError:
    """The error for a ``memory_limit`` below :func:`least_memory`'s ``least``."""
    return ValueError(f"memory_limit: {format_bytes(memory_limit)} ({int(memory_limit):,} bytes) "
                      f"is too small for {stages} stages; the smallest memory limit that fits is "
                      f"{format_bytes(least)} ({least:,} bytes)")
