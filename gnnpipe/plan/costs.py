"""Predicted epoch time of a layout from profiled block costs: the schedule simulated for the
staged modes, compute plus halo exchange plus all-reduce for graph parallelism.

Every mode reads the same per-block costs (:class:`~gnnpipe.plan.profile.Profile`): a block's
forward and backward seconds per chunk row and per chunk op, measured inside the chunked epoch on
the ranks' workers. What differs is how the rows are spread and what crosses the network:

- ``single``: every row through every block as one chunk, nothing sent;
- ``pipeline`` and ``hybrid``: the fill-drain or 1F1B schedule simulated over ``S`` stages and a
  way's ``C / W`` chunks (``n / C`` rows each), a chunk's boundary tensors crossing each cut at
  ``bandwidth``; ``recompute`` runs a chunk's forward again in its backward; a hybrid stage also
  exchanges its chunk's boundary rows with the other ways at every aggregation (forward and
  backward) and all-reduces its weight gradients once per epoch;
- ``graph``: each rank its partition's rows through every block, its halo rows received and its
  boundary rows sent at every aggregation (forward, and their gradients backward), the ranks in
  step layer by layer (the slowest sets the pace), one all-reduce of every weight gradient.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gnnpipe.core.kinds import Mode, TrainSchedule
from gnnpipe.core.timeline import Timeline
from gnnpipe.plan.layout import Layout
from gnnpipe.plan.profile import BlockCost, Profile
from gnnpipe.schedule import gnnpipe as fill_drain
from gnnpipe.schedule import one_f_one_b
from gnnpipe.schedule.simulator import simulate

__all__ = ["DEFAULT_LATENCY", "Network", "Shard", "epoch_of", "graph_epoch", "single_epoch",
           "stage_busy", "staged_timeline", "swaps_per_epoch"]

#: Seconds each point-to-point message costs besides its bytes (gloo latency, Python).
DEFAULT_LATENCY = 1e-4


@dataclass(frozen=True)
class Network:
    """What a message costs: ``latency`` seconds plus its bytes at ``bandwidth`` bytes/s."""

    bandwidth: float
    latency: float = DEFAULT_LATENCY

    def seconds(self, nbytes: float, messages: int = 1) -> float:
        return nbytes / self.bandwidth + messages * self.latency


@dataclass(frozen=True)
class Shard:
    """One graph-parallel rank's share of the graph: its rows and the values (over all its
    aggregations, forward and backward) it sends and receives per epoch."""

    rows: int
    sent_bytes: float


def _forward(blocks: Sequence[BlockCost], rows: float) -> float:
    return sum(rows * c.forward_s + c.forward_fixed_s for c in blocks)


def _backward(blocks: Sequence[BlockCost], rows: float, recompute: bool) -> float:
    again = _forward(blocks, rows) if recompute else 0.0
    return again + sum(rows * c.backward_s + c.backward_fixed_s for c in blocks)


def _param_bytes(blocks: Sequence[BlockCost]) -> int:
    return sum(c.param_bytes for c in blocks)


def single_epoch(profile: Profile) -> float:
    """Seconds of a ``single`` epoch: every row through every block as one chunk, one step (in
    one process with a worker's threads, alone on its host)."""
    n = profile.num_nodes
    return profile.slowdown(1, exact=True) * sum(c.exact_seconds(n) + c.step_s
                                                 for c in profile.blocks)


def _staged_costs(profile: Profile, layout: Layout, ranges: Sequence[tuple[int, int]],
                  net: Network, exchange: Sequence[float] | None) -> tuple[dict, float]:
    """Simulator costs per (kind, stage) and the per-chunk transfer delay of a staged layout;
    ``exchange``: bytes per chunk step each hybrid stage sends the other ways (None: none)."""
    rows = profile.num_nodes / layout.chunks
    wire = layout.wire_dtype.itemsize / 4
    slow = profile.slowdown(layout.workers)
    costs: dict[tuple[str, int], float] = {}
    for s, (a, b) in enumerate(ranges):
        blocks = profile.blocks[a:b]
        costs["forward", s] = slow * _forward(blocks, rows)
        costs["backward", s] = slow * _backward(blocks, rows, layout.recompute)
        costs["step", s] = slow * sum(c.step_s for c in blocks)
        if exchange is not None and layout.ways > 1:
            calls = sum(c.aggregates for c in blocks)
            swap = net.seconds(exchange[s] / 2, 2 * (layout.ways - 1) * calls)
            costs["forward", s] += swap
            costs["backward", s] += swap
            costs["step", s] += net.seconds(2 * 2 * _param_bytes(blocks))  # ring all-reduce
    cuts = [profile.boundary_bytes[a - 1] for a, _ in ranges[1:]]
    delay = max((net.seconds(rows * w * wire) for w in cuts), default=0.0)
    return costs, delay


def staged_timeline(profile: Profile, layout: Layout, ranges: Sequence[tuple[int, int]],
                    net: Network, exchange: Sequence[float] | None = None) -> Timeline:
    """One simulated epoch of a ``pipeline`` or ``hybrid`` layout with these stage ranges (one
    way: the ways run in step)."""
    costs, delay = _staged_costs(profile, layout, ranges, net, exchange)
    per_way = max(layout.chunks // layout.ways, 1)
    build = one_f_one_b if layout.schedule is TrainSchedule.ONE_F_ONE_B else fill_drain
    return simulate(build(len(ranges), per_way, step=True), costs, comm=delay)


def stage_busy(profile: Profile, layout: Layout, ranges: Sequence[tuple[int, int]],
               net: Network, exchange: Sequence[float] | None = None) -> list[float]:
    """Each stage's busy seconds per epoch: its ops plus the transfers at its cuts."""
    costs, delay = _staged_costs(profile, layout, ranges, net, exchange)
    per_way = max(layout.chunks // layout.ways, 1)
    busy = [per_way * (costs["forward", s] + costs["backward", s]) + costs["step", s]
            for s in range(len(ranges))]
    for s in range(len(ranges) - 1):
        busy[s] += 2 * per_way * delay
        busy[s + 1] += 2 * per_way * delay
    return busy


def swaps_per_epoch(profile: Profile, parts: int) -> int:
    """Halo swaps a ``graph`` rank makes per epoch: one per aggregation each way (0 alone)."""
    return 2 * sum(c.aggregates for c in profile.blocks) if parts > 1 else 0


def graph_epoch(profile: Profile, shards: Sequence[Shard], net: Network) -> float:
    """Seconds of a ``graph`` epoch: the slowest rank's compute and halo traffic (its sends at
    ``bandwidth``, a message to each peer per aggregation and direction), what its swaps wait
    beyond that (the profile's measured ``swap_wait``, where measured; a negative one takes off
    what the profile over-counts, down to no less than the rank's sends), then the all-reduce of
    every weight gradient."""
    blocks = profile.blocks
    swaps = swaps_per_epoch(profile, len(shards))
    peers = len(shards) - 1
    slow = profile.slowdown(len(shards), exact=True)
    sends = [net.seconds(s.sent_bytes, swaps * peers) for s in shards]
    slowest = max(slow * sum(c.exact_seconds(s.rows) for c in blocks) + sent
                  for s, sent in zip(shards, sends))
    step = slow * sum(c.step_s for c in blocks)
    waits = swaps * (profile.swap_wait or 0.0)
    reduce = net.seconds(2 * _param_bytes(blocks) * peers / max(len(shards), 1))
    return max(slowest + step + waits, max(sends)) + reduce


def epoch_of(profile: Profile, layout: Layout, net: Network, *,
             shards: Sequence[Shard] = (), exchange: Sequence[float] | None = None) -> float:
    """Predicted seconds of one training epoch of ``layout`` (its ranges chosen)."""
    if layout.mode is Mode.SINGLE:
        return single_epoch(profile)
    if layout.mode is Mode.GRAPH:
        return graph_epoch(profile, shards, net)
    return staged_timeline(profile, layout, layout.ranges, net, exchange).makespan()
