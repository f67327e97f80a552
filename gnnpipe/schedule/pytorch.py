"""PyTorch's own pipeline schedules as gnnpipe :class:`~gnnpipe.schedule.ops.Schedule`\\ s.

``torch.distributed.pipelining`` lists any of its schedules' per-rank actions without a
process group (``_schedule_visualizer.get_schedule_ops``): ``0F3`` is the forward of
micro-batch 3 at stage 0, ``B`` a full backward, ``I`` and ``W`` the input- and weight-gradient
halves of a split backward, ``(0F3;3B1)OVERLAP_F_B`` DualPipeV's forward and backward run
together, ``REDUCE_GRAD`` the data-parallel gradient reduction. :func:`from_torch` keeps every
rank's order and places each stage on the rank that lists it (looped and V-shaped schedules
hold several), and adds the dependencies the simulator needs: a forward waits for the previous
stage's forward of its chunk, a backward for the next stage's backward (the last stage's for its
own forward), a weight gradient for its own backward.

Where it departs from PyTorch's lists, and why:

- ``REDUCE_GRAD`` is left out: a schedule here is one pipeline's ops, not its data-parallel
  reduction.
- An overlapped pair becomes its forward, then its backward, on the same rank: the simulator
  runs one op at a time per rank, so the pair costs their sum (an upper bound of its time).
- A stage's forwards are numbered in the order the rank lists them (every PyTorch schedule runs
  them in micro-batch order). PyTorch 2.13's ``Schedule1F1B`` lists its last rank's forwards as
  micro-batches ``1..C`` (its ``_get_pipeline_order`` increments the index before the first
  forward when a rank has no warm-up); its runtime runs them as ``0..C−1``, as here.
"""

from __future__ import annotations

import csv
import os
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from gnnpipe.schedule.ops import Op, Schedule, backward_op, check_positive, forward_op, weight_op

__all__ = ["TORCH_SCHEDULES", "from_torch", "parse_action"]

#: PyTorch's schedules (``get_schedule_class`` names) and whether each holds several stages per
#: rank (``virtual`` ≥ 2) or one.
TORCH_SCHEDULES: dict[str, bool] = {
    "GPipe": False, "1F1B": False, "Interleaved1F1B": True, "LoopedBFS": True,
    "InterleavedZeroBubble": True, "ZBVZeroBubble": True, "DualPipeV": True,
}
_KINDS = {"F": "forward", "B": "backward", "I": "backward", "W": "weight"}
_ACTION = re.compile(r"^(\d+)(F|B|I|W|REDUCE_GRAD)(\d*)$")
_OVERLAP = re.compile(r"^\((.+);(.+)\)OVERLAP_F_B$")


def parse_action(text: str) -> list[tuple[str, int, int]]:
    """``(kind, stage, micro-batch)`` of one PyTorch action string (``"0F3"``, ``"2W1"``,
    ``"(0F3;3B1)OVERLAP_F_B"``: two); ``[]`` for an empty cell or ``REDUCE_GRAD``.

    Raises:
        ValueError: a string that is no compute action (communication actions included: list a
            schedule without them).
    """
    text = text.strip()
    if not text:
        return []
    if pair := _OVERLAP.match(text):
        return parse_action(pair.group(1)) + parse_action(pair.group(2))
    found = _ACTION.match(text)
    if found is None or (found.group(2) != "REDUCE_GRAD" and not found.group(3)):
        raise ValueError(f"schedule: {text!r} is not a PyTorch compute action such as '0F3', "
                         "'1B0', '2I1', '2W1' or '(0F3;3B1)OVERLAP_F_B'")
    if found.group(2) == "REDUCE_GRAD":
        return []
    return [(_KINDS[found.group(2)], int(found.group(1)), int(found.group(3)))]


def _torch_actions(schedule: Any, stages: int, chunks: int,
                   virtual: int) -> tuple[str, list[list[str]]]:
    """The schedule's name and PyTorch's action strings per rank (``""`` where a rank idles)."""
    import torch

    try:
        from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
        from torch.distributed.pipelining.schedules import (
            PipelineScheduleMulti,
            get_schedule_class,
        )
    except ImportError:
        raise RuntimeError(f"schedule: torch {torch.__version__} has no "
                           "torch.distributed.pipelining._schedule_visualizer.get_schedule_ops; "
                           "from_torch needs torch 2.6 or newer (or give a CSV file)") from None
    try:
        cls = get_schedule_class(schedule) if isinstance(schedule, str) else schedule
    except ValueError:
        raise ValueError(f"schedule: unknown PyTorch schedule {schedule!r}; expected one of "
                         f"{sorted(TORCH_SCHEDULES)}, a schedule class or a CSV file") from None
    name = getattr(cls, "__name__", repr(cls)).removeprefix("Schedule")
    multi = isinstance(cls, type) and issubclass(cls, PipelineScheduleMulti)
    if multi == (virtual < 2):
        expected = "virtual >= 2" if multi else "virtual=1"
        raise ValueError(f"virtual: {name} holds {'several stages' if multi else 'one stage'} "
                         f"per rank: expected {expected}, got {virtual}")
    try:
        ops = get_schedule_ops(cls, stages, chunks, num_stages_per_rank=virtual)
    except (AssertionError, ValueError, TypeError) as err:
        raise ValueError(f"chunks: PyTorch's {name} refuses {stages} ranks x {chunks} chunks "
                         f"x {virtual} stages per rank: {err}") from None
    return name, [[str(a) if a is not None else "" for a in rank] for rank in ops]


def _read_csv(path: Path) -> list[list[str]]:
    """A schedule in PyTorch's CSV form: one row per rank, one action per cell."""
    with path.open(newline="", encoding="utf-8") as f:
        return [row for row in csv.reader(f) if any(cell.strip() for cell in row)]


def _ops(actions: Sequence[Iterable[str]], num_stages: int,
         chunks: int) -> tuple[tuple[Op, ...], ...]:
    made: dict[str, Any] = {"forward": forward_op, "weight": weight_op,
                            "backward": lambda s, c: backward_op(s, c, num_stages)}
    forwards: dict[int, int] = defaultdict(int)  # forwards seen per stage: the next one's chunk
    ranks = []
    for rank in actions:
        ops = []
        for kind, stage, chunk in (a for cell in rank for a in parse_action(cell)):
            if kind == "forward":
                chunk, forwards[stage] = forwards[stage], forwards[stage] + 1
            if not (0 <= stage < num_stages and 0 <= chunk < chunks):
                raise ValueError(f"schedule: action {kind} of chunk {chunk} at stage {stage} lies "
                                 f"outside {num_stages} stages x {chunks} chunks")
            ops.append(made[kind](stage, chunk))
        ranks.append(tuple(ops))
    return tuple(ranks)


def from_torch(schedule: Any, stages: int, chunks: int, virtual: int = 1) -> Schedule:
    """A PyTorch pipeline schedule as a gnnpipe :class:`~gnnpipe.schedule.ops.Schedule`, built
    from PyTorch's own per-rank action lists (the module docstring says where it departs).

    Args:
        schedule: a schedule class of ``torch.distributed.pipelining``
            (``ScheduleInterleaved1F1B``), its name as ``get_schedule_class`` takes it
            (``"Interleaved1F1B"``, one of :data:`TORCH_SCHEDULES`), or the path of a CSV file
            in PyTorch's form (one row per rank, one action per cell, such as ``0F0``).
        stages: ranks (``pp_degree``).
        chunks: chunks (PyTorch's micro-batches) per epoch.
        virtual: stages per rank: 1 for ``GPipe`` and ``1F1B``, 2 or more for the others;
            the schedule has ``stages × virtual`` stages.

    Raises:
        ValueError: an unknown schedule, a ``virtual`` the class does not take, a layout
            PyTorch refuses, or an action list that is not a schedule.
        RuntimeError: a torch without ``get_schedule_ops`` (and no CSV file given).
    """
    ranks, chunks = check_positive("stages", stages), check_positive("chunks", chunks)
    virtual = check_positive("virtual", virtual)
    path = Path(os.fspath(schedule)) if isinstance(schedule, (str, os.PathLike)) else None
    if path is not None and (path.suffix == ".csv" or path.is_file()):
        if not path.is_file():
            raise ValueError(f"schedule: no CSV file at {path}")
        actions, name = _read_csv(path), path.stem
        if len(actions) != ranks:
            raise ValueError(f"stages: {path} has {len(actions)} rows (ranks), expected {ranks}")
    else:
        name, actions = _torch_actions(schedule, ranks, chunks, virtual)
    return Schedule(f"torch:{name}", ranks * virtual, chunks, _ops(actions, ranks * virtual,
                                                                     chunks))
