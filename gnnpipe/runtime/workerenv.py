"""The environment ranks compute in: what gnnpipe gives the Dask workers it starts, and the check
that warns when a user's workers are set up in a way that slows torch.

Dask's nanny starts every worker with ``MALLOC_TRIM_THRESHOLD_=65536`` (to hand freed memory back
to the OS sooner) and runs a statistical profiler in it every 10 ms. For torch on the CPU both
cost: an explicit trim threshold switches off glibc's dynamic mmap threshold, so every tensor
above 128 KiB becomes a fresh ``mmap`` whose pages fault in again on each chunk, and the profiler
interrupts the compute thread. Measured on a 2-core machine (50K nodes, GCN-32, the chunked
epoch): 1.85 s/epoch in a plain process, 3.36 s with that variable alone (1.8x), 3.8 s inside a
default Dask worker (2.1x), 1.97 s with both settings off.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import dask
from distributed import Nanny

from gnnpipe.runtime.asking import ask

if TYPE_CHECKING:
    from gnnpipe.engine.memory import HeapCeiling

__all__ = ["COSTS", "HEAP_CEILING", "MALLOC_VAR", "SPAWN_ENVIRON", "Allocator",
           "RankNanny", "WorkerEnvironment", "check_workers", "heap_ceiling", "inspect_worker",
           "rank_environment", "transparent_huge_pages", "worker_environ"]

logger = logging.getLogger(__name__)

MALLOC_VAR = "MALLOC_TRIM_THRESHOLD_"
_DASK_MALLOC_DEFAULT = "65536"  # distributed.nanny.pre-spawn-environ's value
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: Measured slow-down of torch's CPU compute in a rank, per setting (see the module docstring).
COSTS = {
    MALLOC_VAR: "measured 1.8x slower torch compute (glibc then mmaps every tensor above 128 KiB)",
    "profiler": "measured about 1.1x slower torch compute (Dask samples the stack every 10 ms)",
    "threads": "ranks use fewer cores than the worker was given",
}


def transparent_huge_pages() -> bool:
    """Whether this kernel gives huge pages to memory that asks for them
    (``/sys/kernel/mm/transparent_hugepage/enabled`` is ``always`` or ``madvise``)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


class Allocator(str, Enum):
    """How the ranks gnnpipe starts allocate CPU memory, chosen by ``GNNPIPE_ALLOCATOR``
    (default: ``huge``; ``lean`` for workers given a Dask ``memory_limit``). Measured in
    ``benchmarks/memory_estimate.py --allocator`` (GCNII-8, 100,000 nodes, pipeline 2 × 8, 2
    ranks on 2 cores: epoch time, peak per rank):

    - ``glibc``: glibc's defaults (1.47 s, 0.93-1.08 GiB): its mmap threshold rises to 32 MiB
      as large blocks are freed, so chunk- and graph-sized tensors live in a heap that fragments;
    - ``huge``: torch's 2 MiB pages for tensors above 2 MiB (``THP_MEM_ALLOC_ENABLE=1``; 1.32 s,
      0.74-0.77 GiB): fewer page faults and TLB misses, and a heap that holds less;
    - ``lean``: also every block above 1 MiB mapped afresh and unmapped when freed
      (``MALLOC_MMAP_THRESHOLD_=1048576``; 2.17 s, 0.55 GiB): a rank holds what it uses, as
      ``gp.estimate_memory`` predicts it, at 1.5× the epoch time (its pages fault in anew).

    Chunk tensors under ``lean``'s 1 MiB still live in the heap; a lower threshold costs more
    than trimming the heap under a limit does (:data:`HEAP_CEILING`). Measured on
    ``benchmarks/heap_ceiling.py``'s cases (GCN-16, 50,000 nodes, pipeline 2 × 16, 800 KB
    chunk tensors): at 256 KiB the ranks held 0.99-1.06× their estimate with no limit but their
    epochs took 1.24-1.43 s against 0.95-1.01 s at 1 MiB (+25-51%); at 1 MiB under a limit
    they held 1.03-1.11× at 1.13-1.18 s (+16-21%).

    Huge pages are asked for only where the kernel has them (:func:`transparent_huge_pages`).
    """

    GLIBC = "glibc"
    HUGE = "huge"
    LEAN = "lean"

    @classmethod
    def chosen(cls, capped: bool = False) -> Allocator:
        """The allocator ``GNNPIPE_ALLOCATOR`` names; when unset, ``lean`` for ``capped``
        workers (a Dask ``memory_limit`` given: under the default a rank planned to fit it held
        up to 1.6× its estimate and was killed) and ``huge`` otherwise."""
        value = os.environ.get("GNNPIPE_ALLOCATOR", (cls.LEAN if capped else cls.HUGE).value)
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"GNNPIPE_ALLOCATOR: expected one of "
                             f"{[a.value for a in cls]}, got {value!r}") from None

    def environ(self) -> dict[str, str]:
        """The environment variables that select it in a new process."""
        env = {}
        if self is Allocator.LEAN:
            env["MALLOC_MMAP_THRESHOLD_"] = "1048576"
        if self is not Allocator.GLIBC and transparent_huge_pages():
            env["THP_MEM_ALLOC_ENABLE"] = "1"
        return env


#: The share of its Dask ``memory_limit`` above which a rank trims its heap after each chunk op
#: (Dask's own pause threshold; the nanny kills a worker past 95%, and at 90% a 1F1B rank's
#: ops outgrew the 5% between: ``benchmarks/heap_ceiling.py``). A lower
#: ``distributed.worker.memory.terminate`` lowers it by as much. The same share of a plan's
#: ``memory_limit``, above what the rank held when the graph arrived, where it trains one.
HEAP_CEILING = 0.8
_TERMINATE = 0.95  # Dask's default distributed.worker.memory.terminate


def heap_ceiling(limit: int | None = None, baseline: int = 0) -> HeapCeiling | None:
    """A rank's :class:`~gnnpipe.engine.memory.HeapCeiling`, so that a rank whose live tensors
    fit is not killed (or measured over its plan) for the holes freed chunk tensors leave in its
    heap: in a Dask worker with a ``memory_limit``, at :data:`HEAP_CEILING` of it; with
    ``limit`` (the bytes a plan lets the rank add to the ``baseline`` it holds once the graph
    has arrived), at :data:`HEAP_CEILING` of that above ``baseline``; the lower of the two, and
    None with neither. Measured on a plan under 400 MB (GCNII-16, 50,000 nodes, pipeline 2 × 8,
    ``huge`` allocator): ranks peaked at 481 and 391 MiB, and at 367 and 342 MiB trimming past
    80% of it (``lean``: 256 and 243 MiB at twice the epoch time)."""
    ceilings = [max(baseline + int(HEAP_CEILING * limit), 1)] if limit else []
    try:
        from distributed import get_worker

        worker_limit = get_worker().memory_manager.memory_limit
    except (ValueError, AttributeError):  # not in a Dask worker
        worker_limit = None
    if worker_limit:
        terminate = (dask.config.get("distributed.worker.memory.terminate", _TERMINATE)
                     or _TERMINATE)
        share = max(min(HEAP_CEILING, float(terminate) - (_TERMINATE - HEAP_CEILING)), 0.05)
        ceilings.append(int(share * worker_limit))
    if not ceilings:
        return None
    from gnnpipe.engine.memory import HeapCeiling

    return HeapCeiling(min(ceilings))


#: Every variable an :class:`Allocator` sets, with its value.
_ALLOCATOR_VARS = {"MALLOC_MMAP_THRESHOLD_": "1048576", "THP_MEM_ALLOC_ENABLE": "1"}


#: The pre-spawn environment: a nanny sets it in its own process before it spawns a worker
SPAWN_ENVIRON = "distributed.nanny.pre-spawn-environ"


def worker_environ(threads: int, allocator: Allocator | None = None) -> dict[str, str | None]:
    """The environment of the workers gnnpipe starts (None: unset): no trim threshold,
    ``threads`` OpenMP/MKL/OpenBLAS threads (torch's intra-op pool) per rank, and
    ``allocator`` (default: :meth:`Allocator.chosen`)."""
    return {MALLOC_VAR: None, **{var: str(threads) for var in _THREAD_VARS},
            **(allocator or Allocator.chosen()).environ()}


def _worker_config(threads: int, allocator: Allocator | None = None) -> dict[str, Any]:
    """Dask config for the workers gnnpipe starts: :func:`worker_environ` as the nanny's
    pre-spawn environment and no statistical profiler."""
    return {"distributed.worker.profile.enabled": False,
            **{f"{SPAWN_ENVIRON}.{var}": value
               for var, value in worker_environ(threads, allocator).items()}}


def _initial_environ() -> dict[str, str] | None:
    """This process's environment as it was at exec (Linux), or None where unknown."""
    try:
        with open("/proc/self/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _drop_leaked_malloc_setting() -> None:
    """Remove the allocator settings that an earlier Dask nanny in this process put into
    ``os.environ`` (it does so before spawning, and children inherit it): Dask's trim threshold
    and an :class:`Allocator`'s; a value the user set when starting the process is left alone."""
    initial = _initial_environ()
    if initial is None:
        return
    for var, value in ((MALLOC_VAR, _DASK_MALLOC_DEFAULT), *_ALLOCATOR_VARS.items()):
        if os.environ.get(var) == value and var not in initial:
            del os.environ[var]
            logger.debug("removed %s=%s left in os.environ by a Dask nanny", var, value)


@contextlib.contextmanager
def rank_environment(threads: int, allocator: Allocator | None = None) -> Iterator[None]:
    """Within this block, Dask nannies created here start workers in :func:`_worker_config`'s
    environment (a nanny keeps it for the restarts of its worker). A nanny prefers this
    process's own variables to its config, so the thread counts are set here for the block
    and restored afterwards."""
    _drop_leaked_malloc_setting()
    saved = {k: os.environ.get(k) for k in _THREAD_VARS}
    os.environ.update({k: str(threads) for k in _THREAD_VARS})
    try:
        with dask.config.set(_worker_config(threads, allocator)):
            yield
    finally:
        _drop_leaked_malloc_setting()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class RankNanny(Nanny):
    """A nanny whose worker computes in the rank environment, for every start and restart.

    ``Nanny`` reads its environment and config from Dask's global config when it is created, and
    keeps a shallow copy of the config, whose nested settings are the global config's own dicts.
    A nanny a local cluster creates later (scaling back up after a worker was lost: created on
    the event loop once :func:`rank_environment`'s block has ended) would see Dask's defaults,
    and a restarted worker would come back with the values the block set reverted. This one
    takes its environment as an argument and holds a deep copy of its config with the
    statistical profiler off.

    Args:
        rank_environ: the workers' environment (:func:`worker_environ`; None: unset); none
            given, Dask's as configured.
    """

    def __init__(self, *args: Any, rank_environ: dict[str, str | None] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config = copy.deepcopy(self.config)
        if rank_environ is None:
            return
        self.config.setdefault("distributed", {}).setdefault("worker", {}).setdefault(
            "profile", {})["enabled"] = False
        for var, value in rank_environ.items():
            for env in (self.pre_spawn_env, self.env):
                if value is None:
                    env.pop(var, None)
                else:
                    env[var] = value


@dataclass(frozen=True)
class WorkerEnvironment:
    """What slows torch in one worker (its trim threshold, profiler and thread counts) and
    whether its allocator hands freed tensors back."""

    malloc_trim_threshold: str | None
    profiler: bool
    #: the :class:`Allocator` its environment selects (None: settings of its own)
    allocator: str | None
    torch_threads: int
    omp_threads: str | None

    def problems(self, threads: int) -> list[str]:
        """One line per setting that slows a rank asked to use ``threads`` torch threads."""
        found = []
        if self.malloc_trim_threshold is not None:
            found.append(f"{MALLOC_VAR}={self.malloc_trim_threshold} ({COSTS[MALLOC_VAR]}; start "
                         "the workers with distributed.nanny.pre-spawn-environ."
                         f"{MALLOC_VAR}: null)")
        if self.profiler:
            found.append("the statistical profiler is on (" + COSTS["profiler"] +
                         "; set distributed.worker.profile.enabled: false)")
        if self.omp_threads is not None and self.omp_threads.isdigit() \
                and int(self.omp_threads) < threads:
            found.append(f"OMP_NUM_THREADS={self.omp_threads} below threads_per_worker={threads} "
                         f"({COSTS['threads']})")
        return found


def inspect_worker() -> dict[str, Any]:
    """Run on a worker: its :class:`WorkerEnvironment` as a plain dict."""
    import torch

    return {"malloc_trim_threshold": os.environ.get(MALLOC_VAR),
            "profiler": bool(dask.config.get("distributed.worker.profile.enabled", True)),
            "allocator": next((a.value for a in Allocator if all(
                os.environ.get(k) == a.environ().get(k) for k in _ALLOCATOR_VARS)), None),
            "torch_threads": torch.get_num_threads(),
            "omp_threads": os.environ.get("OMP_NUM_THREADS")}


def check_workers(client: Any, workers: list[str], threads: int,
                  timeout: float) -> dict[str, list[str]]:
    """Inspect ``workers`` (each answering within ``timeout`` s) and log one warning per worker
    whose environment slows torch; returns the problems by worker address (empty when all is
    well)."""
    found = {}
    for address, env in ask(client, inspect_worker, workers, timeout=timeout,
                            what="its environment").items():
        problems = WorkerEnvironment(**env).problems(threads)
        if problems:
            found[address] = problems
            logger.warning("worker %s is set up in a way that slows torch: %s", address,
                           "; ".join(problems))
    return found
