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

import contextlib
import copy
import dataclasses
import math
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd
from torch_geometric.data import Data

from gnnpipe.analysis.footprint import torch_threads
from gnnpipe.datasets.fit import model_graph
from gnnpipe.nn import LayerStack, check_stack
from gnnpipe.plan.bench import SliceBench, medians, tiny_rows
from gnnpipe.pyg import as_stack

if TYPE_CHECKING:
    from gnnpipe.runtime.shipping import Cargo
    from gnnpipe.runtime.together import Together

__all__ = [
    "BYTES_PER_VALUE",
    "EXACT_SHARED_BANDWIDTH",
    "SHARED_BANDWIDTH",
    "WORKER_WARMUP",
    "BlockCost",
    "Profile",
    "check_inputs",
    "profile_counts",
    "profile_model",
    "profile_on_workers",
]

BYTES_PER_VALUE = 4  # fp32
#: Unmeasured epochs before the timed ones on Dask workers: a worker's first chunked epoch runs
#: slower than its steady ones (measured 3×: its heap and allocator thresholds still growing),
#: and a fresh one would otherwise predict a slower pipeline than it is.
WORKER_WARMUP = 1
#: How much slower an op runs when every core of its host is busy than alone, from sharing the
#: memory bandwidth and caches (measured on this project's 2-core machine: two busy processes
#: each run about 1.2x slower than one alone; a many-core host shares less per core busy).
SHARED_BANDWIDTH = 0.2
#: The same for an op over a whole graph or half of one at once (``single``'s, a ``graph``
#: rank's): measured on the same machine, GCNII-32 on 50,000 nodes, the profile's whole-graph
#: ops took 1.05x as long on two workers at once as in one process alone (its chunk ops 1.12-
#: 1.18x); with 0.2 ``single`` was predicted 17% fast (median, 10 layouts of the planner grid).
EXACT_SHARED_BANDWIDTH = 0.05
@dataclass(frozen=True)
class BlockCost:
    """Measured costs of one block.

    ``forward_s``/``backward_s`` are seconds per chunk row, ``*_fixed_s`` seconds per chunk op
    whatever its rows, ``step_s`` seconds per epoch (its Adam step and buffer resets);
    ``activation_bytes`` are kept per row from a chunk's forward to its backward,
    ``buffer_bytes`` held per graph row with the default techniques (``Hbuf``, its snapshot and
    ``dZbuf``; with every technique on ``dZbuf`` lives in ``Hbuf``, a third less);
    (``optimizer_bytes``) is twice ``param_bytes``. ``exact_forward_s``/``exact_backward_s``
    are seconds per row when half the graph goes at once (the work of ``single`` and of a
    graph-parallel rank, slower per row than a chunk's once the rows outgrow the caches); 0
    where not measured.
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
    exact_forward_s: float = 0.0
    exact_backward_s: float = 0.0

    def exact_seconds(self, rows: float) -> float:
        """Seconds per epoch with ``rows`` rows in one op each way (``single``, a graph rank)."""
        forward = self.exact_forward_s or self.forward_s
        backward = self.exact_backward_s or self.backward_s
        return rows * (forward + backward) + self.forward_fixed_s + self.backward_fixed_s

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
    line (from :data:`~gnnpipe.plan.bench.TINY_ROWS` rows to that count's chunks) reaches."""

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
    #: Measured between two of the workers (:func:`gnnpipe.runtime.link.measure_link`): seconds
    #: of a swap of one value, and bytes/s of a large one (0: not measured).
    latency: float = 0.0
    bandwidth: float = 0.0
    #: Seconds each lockstep halo swap of a ``graph`` rank waits beyond its bytes' transfer,
    #: measured in a short run on the cluster (:mod:`gnnpipe.plan.calibrate`; None: not yet;
    #: below 0 where that run was faster than predicted).
    swap_wait: float | None = None

    def slowdown(self, workers: int, exact: bool = False) -> float:
        """How much slower (or, below 1, faster) an op runs on one of ``workers`` ranks on the
        profile's host than it ran profiled: ranks share its cores (``workers × threads /
        cores`` when above 1) and its memory bandwidth (:data:`SHARED_BANDWIDTH` more per op
        when every core is busy, :data:`EXACT_SHARED_BANDWIDTH` for an ``exact`` op over many
        rows at once), as the profiled workers did."""
        if not self.cores:
            return 1.0
        bandwidth = EXACT_SHARED_BANDWIDTH if exact else SHARED_BANDWIDTH

        def load(k: int) -> float:
            busy = min(k * self.threads, self.cores)
            shared = 1.0 + bandwidth * (busy - 1) / max(self.cores - 1, 1)
            return max(1.0, k * self.threads / self.cores) * shared

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


def profile_model(model: LayerStack, data: Data, chunks: int = 8, *,
                  blocks: tuple[int, int] | None = None, repeats: int = 2, warmup: int = 1,
                  seed: int = 0, threads: int | None = 1, lean: bool = False,
                  until: Callable[[], bool] | None = None) -> Profile:
    """Measure the blocks' costs inside GNNPipe's chunked epoch on the real graph.

    A copy of ``model`` (its weights stay untouched) trains ``warmup`` epochs (more while their
    times still settle, at most :data:`~gnnpipe.plan.bench.MAX_WARMUP`), then ``repeats`` timed
    ones in this process with each block a stage of its own (:class:`~gnnpipe.plan.bench.
    SliceBench`), over ``chunks`` METIS chunks (at most a quarter of the nodes) of which the
    first half are merged into one and :data:`~gnnpipe.plan.bench.TINY_ROWS` rows are carved
    off the last. Per block, the medians of its per-epoch seconds over the normal chunks and of
    its op on the small chunk give seconds per row and per chunk op (``t = rows·a + b``), its op
    on the merged chunk the seconds per row of work done half the graph at once (``exact_*``),
    its Adam step and buffer resets the per-epoch seconds. Times are wall-clock seconds, like
    the epochs they predict: on a machine busy with other work, profile under that same load.

    Args:
        blocks: profile only blocks ``start:stop`` (default: all); the profile then holds those.
        threads: torch threads while profiling (the Dask ranks use one).
        lean: run each chunk's backward right after its forward, so one chunk's tensors are
            held at a time, with 16-bit historical buffers and no merged chunk (a profile under
            a memory limit: fill-drain holds every chunk's, float32 buffers twice as much, the
            merged chunk half the graph's). ``buffer_bytes`` are then those of the 16-bit
            buffers; without the merged chunk ``exact_*`` are 0 and whole-graph ops are
            predicted from the chunks' seconds per row.
        until: after the timed epochs, run untimed ones until it returns True (default: stop;
            :func:`profile_on_workers` keeps every worker busy until all are done timing).
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
    work = copy.deepcopy(model).train()
    with torch_threads(threads):
        bench = SliceBench(work, data, count, start, stop, seed, lean=lean)
        took = medians(bench, warmup, repeats, until)
        kept, buffers = bench.kept_bytes(), bench.buffer_bytes()
    rows = n - bench.big_rows - tiny_rows(n)  # of the normal chunks
    costs = []
    for k, b in enumerate(range(start, stop)):
        block = model.blocks[b]
        (fwd, fwd_fixed), (bwd, bwd_fixed) = (
            _per_row_and_chunk(took[kind][k], took[f"{kind}_tiny"][k], bench.normal_chunks,
                               rows, tiny_rows(n))
            for kind in ("forward", "backward"))
        exact = [max(took[f"{kind}_big"][k] - fixed, 0.0) / bench.big_rows if bench.big_rows
                 else 0.0 for kind, fixed in (("forward", fwd_fixed), ("backward", bwd_fixed))]
        params = sum(p.numel() * p.element_size() for p in block.parameters())
        costs.append(BlockCost(
            index=b, name=type(block).__name__, aggregates=block.aggregates,
            out_dim=block.out_dim, forward_s=fwd, backward_s=bwd, forward_fixed_s=fwd_fixed,
            backward_fixed_s=bwd_fixed, step_s=took["step"][k],
            activation_bytes=kept[k], buffer_bytes=buffers[k], param_bytes=params,
            optimizer_bytes=2 * params, exact_forward_s=exact[0], exact_backward_s=exact[1]))
    cuts = tuple(sum(model.boundary_widths(j)) * BYTES_PER_VALUE for j in range(1, len(model)))
    return Profile(tuple(costs), n, (count, reach), cuts, time.perf_counter() - began)


def profile_counts(chunks: int, num_nodes: int) -> tuple[int, int]:
    """The chunk count :func:`profile_model` measures at (``chunks``, at most a quarter of the
    nodes) and the most chunks its costs reach (chunks of :func:`tiny_rows` rows or more, at
    most 16 × ``chunks``)."""
    count = max(1, min(chunks, num_nodes // 4))
    return count, max(count, min(16 * count, num_nodes // tiny_rows(num_nodes)))


def _per_row_and_chunk(total: float, tiny: float, chunks: int, rows: int,
                       small: int) -> tuple[float, float]:
    """Solve ``t = rows·a + b`` from ``chunks`` ops over ``rows`` rows taking ``total`` seconds
    and one op over ``small`` rows taking ``tiny`` (``b`` clipped to ``[0, tiny]``: noise)."""
    per_row = max(total - chunks * tiny, 1e-12 * rows) / max(rows - chunks * small, 1)
    per_chunk = min(max(tiny - small * per_row, 0.0), tiny)
    return per_row, per_chunk


def _host_cores() -> tuple[str, int]:
    """This host's name and the cores this process may use (Dask's count: its CPU affinity and
    cgroup quota, not the machine's cores)."""
    from dask.system import CPU_COUNT

    return socket.gethostname(), CPU_COUNT


def _shared_cores(client: Any, addresses: Sequence[str]) -> int:
    """The cores of the one host all ``addresses`` run on (0 if they run on several)."""
    from gnnpipe.runtime.asking import ANSWER_S, ask

    hosts = ask(client, _host_cores, list(addresses), timeout=ANSWER_S, what="its cores")
    found = set(hosts.values())
    return next(iter(found))[1] if len(found) == 1 else 0


def _at_once(workers: int, cores: int, threads: int) -> int:
    """How many of ``workers`` profile at once: on one host of ``cores`` cores no more than its
    cores hold (``threads`` each), or all of them where the cores are unknown (0). Ranks taking
    turns on a core time whatever share of it the OS gave them: a GCNII-16 Facebook plan for 4
    workers profiled on all 4 of this 2-core machine's workers predicted every layout about 2×
    too fast (single 1.34 s, measured 2.74 s). :meth:`Profile.slowdown` scales the costs
    measured on fewer ranks to more ranks than cores instead."""
    return min(workers, max(cores // max(threads, 1), 1)) if cores else workers


def check_inputs(model: LayerStack, data: Data) -> Data:
    """The graph ready (a Dataset's graph, masks from a stored ``split_idx``) and fitting the
    model, with float32 features: :func:`gnnpipe.datasets.fit.model_graph`."""
    return model_graph(check_stack(model), data)


@contextlib.contextmanager
def _naming_dead_workers(cluster: Any, addresses: list[str]) -> Iterator[None]:
    """Turn a worker dying while profiling (killed for memory, most often) into an error naming
    it and its Dask ``memory_limit``, instead of Dask's cancellation."""
    from concurrent.futures import CancelledError

    from dask.utils import format_bytes
    from distributed import KilledWorker

    from gnnpipe.runtime.cluster import WorkerLost

    limits = cluster.memory_limits(addresses)
    try:
        yield
    except (CancelledError, KilledWorker, WorkerLost) as exc:
        alive = set(cluster.workers())
        dead = ([exc.address] if isinstance(exc, WorkerLost)
                else [a for a in addresses if a not in alive] or addresses)
        said = ", ".join(f"{a} (memory_limit {format_bytes(limits[a])})" if limits.get(a)
                         else a for a in dead)
        raise RuntimeError(
            f"plan: a worker died while profiling: {said}. A profile holds one stage's share "
            f"of the model's buffers and a chunk's tensors; give the workers more memory, pass "
            f"a profile made elsewhere (profile=) or leave out cluster=") from exc


@contextlib.contextmanager
def _together(owners: list[str], client: Any) -> Iterator[list[Together]]:
    """A :class:`~gnnpipe.runtime.together.Together` per piece (``owners[i]`` runs piece
    ``i``); if profiling fails every lingering worker is released (it would run on to its
    limit), once every piece has returned their events are dropped."""
    from gnnpipe.runtime.together import together

    company = together(owners)
    try:
        yield company
    except BaseException:
        company[0].release(client)
        raise
    company[0].forget(client)


def _profile_cargo(cargo: Cargo, chunks: int, **kwargs: Any) -> Profile:
    """:func:`profile_model` of what a worker was sent."""
    return profile_model(cargo.model, cargo.data, chunks, **kwargs)


def profile_on_workers(cluster: Any, workers: int, model: LayerStack, data: Data,
                       chunks: int = 8, pieces: int | None = None, **kwargs: Any) -> Profile:
    """:func:`profile_model` on ``workers`` Dask workers, the blocks of each stage of the
    uniform split timed by one of them, at once: every op is timed while the workers share the
    machine (memory bandwidth, caches) and each holds a stage's share of buffers, as in the
    pipeline. On one host with fewer cores than the workers' threads, only as many workers as
    its cores hold profile (:func:`_at_once`), each its share of the stages one after another.
    With ``pieces`` (more than ``workers``) the blocks are profiled in that many consecutive
    ranges, a worker's share one range after another, so a worker holds only a range's buffers
    (under a memory limit). Workers run :data:`WORKER_WARMUP` untimed epochs first unless ``warmup``
    is given, and one done timing runs untimed epochs until the others are done too
    (:mod:`gnnpipe.runtime.together`: a slower slice's last ops are not timed alone). Then two of
    them measure what a message between them costs (the profile's
    ``latency`` and ``bandwidth``)."""
    from gnnpipe.engine.local import stage_ranges
    from gnnpipe.runtime.asking import ANSWER_S, graph_bytes, scatter_within
    from gnnpipe.runtime.cluster import resolve
    from gnnpipe.runtime.link import measure_link
    from gnnpipe.runtime.shipping import Cargo

    data = check_inputs(model, data)
    kwargs.setdefault("warmup", WORKER_WARMUP)
    handle, owned = resolve(cluster, workers)
    try:
        addresses = handle.ready(workers)
        if len(addresses) < workers:
            raise ValueError(f"cluster: profiling on {workers} workers, the cluster has "
                             f"{len(addresses)}")
        client, threads = handle.client, handle.threads_per_worker
        cores = _shared_cores(client, addresses[:workers])
        busy = addresses[:_at_once(workers, cores, threads)]
        handle.keep_running(busy, ANSWER_S)
        shipped = scatter_within(client, Cargo(model, data), busy, graph_bytes(data), ANSWER_S,
                                 "the model and graph to profile")
        ranges = stage_ranges(model, min(max(pieces or 0, workers), len(model)))
        owners = [busy[i * len(busy) // len(ranges)] for i in range(len(ranges))]
        with _naming_dead_workers(handle, busy):
            with _together(owners, client) as company:
                futures = [client.submit(_profile_cargo, shipped, chunks, blocks=blocks,
                                         threads=threads, until=mate, workers=[owner],
                                         allow_other_workers=False, pure=False, **kwargs)
                           for owner, blocks, mate in zip(owners, ranges, company)]
                joined = Profile.join(handle.gather_pinned(futures, busy))
            link = measure_link(handle) or (0.0, 0.0)
        return dataclasses.replace(joined, concurrent=len(set(owners)), cores=cores, threads=threads,
                                   latency=link[0], bandwidth=link[1])
    finally:
        if owned:
            handle.close()
