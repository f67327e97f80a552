"""How much memory a run adds to its process at its highest, measured the same way in every mode.

Every participant of a run — the caller's process in ``single`` and ``local``, each rank's Dask
worker in the distributed modes — starts a :class:`MemoryMeter` before it builds anything for the
run (its copy of the model and graph, the adjacency, the historical buffers) and reads it after
every epoch. The meter counts the **resident set** (what the process holds in RAM) from the
run's start:

1. at the start it hands freed heap memory back to the OS (``malloc_trim(0)``: glibc keeps freed
   blocks below its mmap threshold — 128 KiB, rising to 32 MiB as large blocks are freed — in the
   heap, so an earlier run's tensors would otherwise count), resets the kernel's high-water mark
   (``/proc/self/clear_refs``) and notes the resident size then (``baseline_bytes``);
2. after each epoch it reads the high-water mark (``VmHWM``): ``peak_bytes`` is that minus the
   baseline, the most the run has added so far. What the process held before (the interpreter,
   torch, Dask, the caller's own objects, a worker's copy of the graph as it arrived) is not
   counted; everything the run allocates is, whether torch still uses it or the allocator keeps
   it.

On a CUDA device ``device_peak_bytes`` is torch's ``max_memory_allocated`` over the same span
(0 on the CPU). Where ``/proc`` is missing (not Linux) the peak falls back to ``ru_maxrss``, the
process's lifetime peak, and the baseline to 0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource
import sys
from typing import Any

import torch

__all__ = ["HeapCeiling", "MemoryMeter", "release_freed_memory", "resident_bytes"]


@functools.cache
def _malloc_trim() -> Any:
    """glibc's ``malloc_trim``, looked up once: among the symbols the process has loaded, else
    in the C library ``find_library`` names (it runs ``ldconfig``, which minimal images lack);
    None elsewhere (musl, macOS, Windows)."""
    for name in (None, ctypes.util.find_library("c")):
        try:
            return ctypes.CDLL(name).malloc_trim
        except (OSError, AttributeError, TypeError):
            continue
    return None


def release_freed_memory() -> bool:
    """Hand the memory glibc keeps from freed tensors back to the OS (``malloc_trim(0)``);
    whether it could. Not glibc: nothing to do."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def _status(field: str) -> int | None:
    """A ``/proc/self/status`` size field (``VmRSS``, ``VmHWM``) in bytes, None without it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def resident_bytes() -> int:
    """This process's resident set size now, in bytes (0 where ``/proc`` is missing)."""
    return _status("VmRSS") or 0


class HeapCeiling:
    """Hands freed heap memory back to the OS whenever the process holds more than ``ceiling``
    bytes: call it after each chunk op (a pipeline or hybrid rank) or halo swap (a
    ``graph`` rank, whose partition's rows under 1 MiB leave the same holes).

    Chunk-sized tensors (below glibc's mmap threshold) live in the heap, and a chunk's stashed
    activations interleave there with the freed temporaries of its ops: the holes stay resident.
    Under the ``lean`` allocator a 2-stage GCN-16 rank (50,000 nodes, 16 chunks of 800 KB
    tensors) held 1.2-1.6× what it used, while ``gp.estimate_memory`` counts what it uses.
    Trimming costs time (every freed page faults in anew), so it happens only above the
    ceiling, and again only once the process has grown by ``slack`` bytes past what the last
    trim left (a process that really holds more than the ceiling is not trimmed every op);
    once it is back under the ceiling, the next op above it trims again.
    """

    def __init__(self, ceiling: int, slack: int = 8 << 20) -> None:
        if ceiling <= 0:
            raise ValueError(f"ceiling: expected a positive number of bytes, got {ceiling}")
        if slack < 0:
            raise ValueError(f"slack: expected a non-negative number of bytes, got {slack}")
        self.ceiling, self.slack = ceiling, slack
        self.trims = 0
        self._left = 0  # what the process held after the last trim (0: under the ceiling since)

    def __call__(self) -> None:
        held = resident_bytes()
        if held <= self.ceiling:
            self._left = 0
        elif held > self._left + self.slack and release_freed_memory():
            self.trims += 1
            self._left = resident_bytes()


class MemoryMeter:
    """This process's peak memory since :meth:`begin`, added to every epoch record.

    Use it as the first epoch callback of :func:`gnnpipe.engine.driver.drive`: it sets the
    record's ``peak_bytes``, ``baseline_bytes``, ``device_peak_bytes`` and ``heap_trims`` (how
    often ``ceiling``, the process's :class:`HeapCeiling` if it has one, trimmed so far) and
    never stops the run.
    """

    def __init__(self, device: torch.device | str = "cpu",
                 ceiling: HeapCeiling | None = None) -> None:
        self.device = torch.device(device)
        self.ceiling = ceiling
        self.baseline = 0

    def begin(self) -> MemoryMeter:
        """Start counting from now (module docstring, step 1)."""
        release_freed_memory()
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the resident size now
        except OSError:  # not Linux, or not permitted: the peak covers the process's lifetime
            pass
        self.baseline = resident_bytes()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        return self

    def peak(self) -> int:
        """The most resident memory the run has added since :meth:`begin`, in bytes."""
        hwm = _status("VmHWM")
        if hwm is None:
            scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
        return max(hwm - self.baseline, 0)

    def device_peak(self) -> int:
        """Torch's peak allocated bytes on the CUDA device since :meth:`begin` (0 on the CPU)."""
        if self.device.type != "cuda":
            return 0
        return int(torch.cuda.max_memory_allocated(self.device))

    def __call__(self, record: dict[str, Any]) -> bool:
        record.update(peak_bytes=self.peak(), baseline_bytes=self.baseline,
                      device_peak_bytes=self.device_peak(),
                      heap_trims=0 if self.ceiling is None else self.ceiling.trims)
        return False
