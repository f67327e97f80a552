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
from typing import Any

import dask
from distributed import Nanny

__all__ = ["COSTS", "LEAN_ALLOCATOR", "MALLOC_VAR", "RankNanny", "WorkerEnvironment", "check_workers",
           "inspect_worker", "lean_allocator", "rank_environment", "transparent_huge_pages"]

logger = logging.getLogger(__name__)

MALLOC_VAR = "MALLOC_TRIM_THRESHOLD_"
_DASK_MALLOC_DEFAULT = "65536"  # distributed.nanny.pre-spawn-environ's value
_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: A rank's allocator: tensors above 1 MiB mapped afresh and handed back to the OS when freed
#: (glibc otherwise raises its threshold to 32 MiB as large blocks are freed and keeps them in a
#: heap that fragments: a rank then holds up to 4x what it uses, and what it holds depends on
#: the graph's size), in 2 MiB pages (torch's ``THP_MEM_ALLOC_ENABLE``), so that mapping them
#: costs no more page faults than the heap. Measured in ``benchmarks/allocator.py``.
LEAN_ALLOCATOR = {"MALLOC_MMAP_THRESHOLD_": "1048576", "THP_MEM_ALLOC_ENABLE": "1"}
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


def lean_allocator() -> dict[str, str]:
    """The allocator settings of the ranks gnnpipe starts (:data:`LEAN_ALLOCATOR`), or none
    where the kernel has no transparent huge pages (every tensor's pages would then fault in
    one by one) or ``GNNPIPE_ALLOCATOR=glibc`` asks for glibc's defaults."""
    if os.environ.get("GNNPIPE_ALLOCATOR", "lean") == "glibc" or not transparent_huge_pages():
        return {}
    return dict(LEAN_ALLOCATOR)


def _worker_config(threads: int) -> dict[str, Any]:
    """Dask config for the workers gnnpipe starts: no trim threshold, no statistical profiler,
    ``threads`` OpenMP/MKL/OpenBLAS threads (torch's intra-op pool) per rank, and
    :func:`lean_allocator`'s settings."""
    env = "distributed.nanny.pre-spawn-environ"
    return {f"{env}.{MALLOC_VAR}": None, "distributed.worker.profile.enabled": False,
            **{f"{env}.{var}": threads for var in _THREAD_VARS},
            **{f"{env}.{var}": value for var, value in lean_allocator().items()}}


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
    and :data:`LEAN_ALLOCATOR`; a value the user set when starting the process is left alone."""
    initial = _initial_environ()
    if initial is None:
        return
    for var, value in ((MALLOC_VAR, _DASK_MALLOC_DEFAULT), *LEAN_ALLOCATOR.items()):
        if os.environ.get(var) == value and var not in initial:
            del os.environ[var]
            logger.debug("removed %s=%s left in os.environ by a Dask nanny", var, value)


@contextlib.contextmanager
def rank_environment(threads: int) -> Iterator[None]:
    """Within this block, Dask nannies created here start workers in :func:`_worker_config`'s
    environment (a nanny keeps it for the restarts of its worker). A nanny prefers this
    process's own variables to its config, so the thread counts are set here for the block
    and restored afterwards."""
    _drop_leaked_malloc_setting()
    saved = {k: os.environ.get(k) for k in _THREAD_VARS}
    os.environ.update({k: str(threads) for k in _THREAD_VARS})
    try:
        with dask.config.set(_worker_config(threads)):
            yield
    finally:
        _drop_leaked_malloc_setting()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class RankNanny(Nanny):
    """A nanny that keeps the rank environment for every restart of its worker.

    ``Nanny`` keeps a shallow copy of Dask's config, whose nested settings are the global
    config's own dicts: the values :func:`rank_environment` sets there revert when its block
    ends, and a worker the nanny restarts after a failure would come back with the
    statistical profiler on. This one holds a deep copy, taken inside the block."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.config = copy.deepcopy(self.config)


@dataclass(frozen=True)
class WorkerEnvironment:
    """What slows torch in one worker (its trim threshold, profiler and thread counts) and
    whether its allocator hands freed tensors back."""

    malloc_trim_threshold: str | None
    profiler: bool
    #: the worker holds what it uses: :data:`LEAN_ALLOCATOR`'s settings are in its environment
    lean_allocator: bool
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
            "lean_allocator": all(os.environ.get(k) == v for k, v in LEAN_ALLOCATOR.items()),
            "torch_threads": torch.get_num_threads(),
            "omp_threads": os.environ.get("OMP_NUM_THREADS")}


def check_workers(client: Any, workers: list[str], threads: int) -> dict[str, list[str]]:
    """Inspect ``workers`` and log one warning per worker whose environment slows torch;
    returns the problems by worker address (empty when all is well)."""
    found = {}
    for address, env in client.run(inspect_worker, workers=workers).items():
        problems = WorkerEnvironment(**env).problems(threads)
        if problems:
            found[address] = problems
            logger.warning("worker %s is set up in a way that slows torch: %s", address,
                           "; ".join(problems))
    return found
