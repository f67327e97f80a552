"""The one training loop every mode runs: begin the epoch, run its chunks, step, evaluate, report.

A mode supplies an :class:`EpochProgram` (the one-process engines in :mod:`gnnpipe.engine`, one
rank's share of the work in :mod:`gnnpipe.runtime`); what happens after each epoch (a progress
bar, a rank's live report and stop flag, a checkpoint) plugs in as :data:`EpochCallback` s. The
driver knows nothing of Dask or of where the program runs.

Epochs run with subnormal floats flushed to zero on the CPU (:func:`flushed_denormals`): a deep
stack's early-layer gradients sink below float32's smallest normal value after some epochs of
training, and x86 arithmetic on subnormals is many times slower (a GCN-32 pipeline's first stage
measured its backward 6× slower from its ~15th epoch on, the epoch 3×).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch
from torch import Tensor

from gnnpipe.engine.single import evaluates

__all__ = [
    "DENORMALS_VAR",
    "Checkpointable",
    "EpochCallback",
    "EpochProgram",
    "denormals_flushed",
    "drive",
    "flushed_denormals",
    "owned",
]

#: Called with each epoch's record once the epoch is done; returning True stops the run there.
EpochCallback = Callable[[dict[str, Any]], bool]


class EpochProgram(Protocol):
    """One participant's share of a training epoch (the whole of it in one-process modes)."""

    def begin_epoch(self, epoch: int) -> None:
        """Reset per-epoch state (gradients, historical buffers, the epoch counters)."""

    def run_chunks(self, epoch: int) -> float | None:
        """Forward and backward of the epoch; the training loss where this participant has it."""

    def step(self, epoch: int) -> None:
        """The epoch's one optimizer step (and the end-of-epoch buffer snapshot)."""

    def evaluate(self) -> dict[str, float]:
        """Exact full-graph metrics where this participant has them (``{}`` elsewhere)."""


class Checkpointable(EpochProgram, Protocol):
    """A program whose state a checkpoint keeps (:mod:`gnnpipe.checkpoint`)."""

    def checkpoint_state(self) -> dict[str, Any]:
        """Its share of the training state as plain tensors, dicts, lists, ints and strings."""

    def restore(self, shards: list[dict[str, Any]]) -> None:
        """Continue from a checkpoint's shards (written by programs of any layout)."""


#: Set to ``keep`` to compute with subnormal floats (IEEE-exact, slower) instead of flushing them.
DENORMALS_VAR = "GNNPIPE_DENORMALS"
_SUBNORMAL = 1e-39  # below float32's smallest normal value, 1.18e-38


def denormals_flushed() -> bool:
    """Whether this thread's CPU arithmetic flushes subnormal floats to zero."""
    return bool((torch.tensor(_SUBNORMAL, dtype=torch.float32) * 1.0).item() == 0.0)


@contextmanager
def flushed_denormals() -> Iterator[None]:
    """This thread's CPU arithmetic flushes subnormals inside the block (unless
    :data:`DENORMALS_VAR` is ``keep``), as it was after. Per thread: torch's intra-op threads
    started before keep their own setting."""
    if os.environ.get(DENORMALS_VAR, "").lower() == "keep":
        yield
        return
    before = denormals_flushed()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)


def drive(program: EpochProgram, epochs: int, eval_every: int = 1, start: int = 0,
          callbacks: Sequence[EpochCallback] = ()) -> list[dict[str, Any]]:
    """Train epochs ``start .. epochs - 1`` of ``program``; returns one record per epoch run:
    ``epoch``, ``epoch_time`` (seconds up to the step, evaluation excluded), ``loss`` where the
    program has it and, on evaluation epochs (:func:`~gnnpipe.engine.single.evaluates`), the
    metrics. Every callback sees every record (in order); the run stops after the epoch at which
    any returned True. Subnormals are flushed meanwhile (:func:`flushed_denormals`)."""
    with flushed_denormals():
        return _epochs(program, epochs, eval_every, start, callbacks)


def _epochs(program: EpochProgram, epochs: int, eval_every: int, start: int,
            callbacks: Sequence[EpochCallback]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for epoch in range(start, epochs):
        began = time.perf_counter()
        program.begin_epoch(epoch)
        loss = program.run_chunks(epoch)
        program.step(epoch)
        record: dict[str, Any] = {"epoch": epoch, "epoch_time": time.perf_counter() - began}
        if loss is not None:
            record["loss"] = loss
        if evaluates(epoch, epochs, eval_every):
            record.update(program.evaluate())
        records.append(record)
        stops = [callback(record) for callback in callbacks]  # every callback, even after a stop
        if any(stops):
            break
    return records


def owned(state: dict[str, Tensor], start: int, stop: int) -> dict[str, Tensor]:
    """The entries of a stack's ``state_dict`` that belong to blocks ``start:stop``."""
    return {k: v for k, v in state.items() if start <= int(k.split(".")[1]) < stop}
