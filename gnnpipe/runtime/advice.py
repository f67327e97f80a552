"""What a run that ran out of memory could change, with the memory model's estimate of each."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from torch_geometric.data import Data

from gnnpipe.analysis.memory import estimate
from gnnpipe.core.job import TrainConfig
from gnnpipe.core.kinds import Mode, Precision, TrainSchedule
from gnnpipe.core.units import format_bytes
from gnnpipe.engine.local import stage_ranges
from gnnpipe.nn import LayerStack
from gnnpipe.runtime.workerenv import Allocator

__all__ = ["leaner_options", "memory_advice", "not_memory"]

logger = logging.getLogger(__name__)


def leaner_options(job: TrainConfig, model: LayerStack) -> list[tuple[str, dict[str, Any]]]:
    """What ``job`` could change to need less memory per rank: ``gp.train`` arguments as text,
    and the :class:`~gnnpipe.core.job.TrainConfig` fields they change (``model``: its blocks
    bound the stages and split them)."""
    if job.mode is Mode.GRAPH:
        return [(f"parts={job.parts + 1}", {"parts": job.parts + 1})]
    options: list[tuple[str, dict[str, Any]]] = []
    if (job.mode in (Mode.LOCAL, Mode.PIPELINE) and job.schedule is TrainSchedule.GNNPIPE
            and not job.techniques.grad_in_h):  # S - s chunks in flight instead of C
        options.append(("schedule='1f1b'", {"schedule": TrainSchedule.ONE_F_ONE_B}))
    if not job.recompute:
        options.append(("recompute=True", {"recompute": True}))
    if job.history_dtype is Precision.FLOAT32:
        options.append(("history_dtype=torch.bfloat16", {"history_dtype": Precision.BFLOAT16}))
    options.append((f"chunks={2 * job.chunks}", {"chunks": 2 * job.chunks}))
    if job.stages < len(model):
        stages = job.stages + 1
        options.append((f"stages={stages}", {"stages": stages,
                                             "ranges": tuple(stage_ranges(model, stages))}))
    return options


def memory_advice(model: LayerStack, data: Data, job: TrainConfig, rank: int,
                  room: int | None, allocator: Allocator | None = None) -> str:
    """For a rank that died: ``gp.estimate_memory``'s need for it and the most any rank needs,
    and each leaner option with the most any rank needs with it, marked where it fits in
    ``room`` (bytes the rank may add to its process; None: unknown). Any option estimated
    larger than the limit is still named; and the ``lean`` allocator, unless the ranks'
    ``allocator`` (None: unknown, taken as ``GNNPIPE_ALLOCATOR`` says) is already it."""
    try:
        table = estimate(model, data, job)
        need, most = int(table.loc[rank, "peak_bytes"]), int(table["peak_bytes"].max())
        rows = []
        for text, changes in leaner_options(job, model):
            changed = dataclasses.replace(job, **changes)
            peak = int(estimate(model, data, changed)["peak_bytes"].max())
            fits = "" if room is None else (", fits" if peak <= room else ", does not fit")
            rows.append(f"{text} ({format_bytes(peak)}{fits})")
    except Exception:  # the advice must never hide the failure it explains
        logger.exception("estimating memory for the failure message")
        return "these need less per rank: " + ", ".join(
            text for text, _ in leaner_options(job, model))
    where = "" if room is None else f" of the {format_bytes(room)} it had"
    lines = [(f"gp.estimate_memory puts rank {rank}'s need at {format_bytes(need)}{where} "
              f"(the most any rank needs: {format_bytes(most)})"),
             "the most any rank needs with one of these: " + ", ".join(rows)]
    if (allocator or Allocator.chosen()) is not Allocator.LEAN:
        lines.append("gp.Cluster(allocator='lean') or GNNPIPE_ALLOCATOR=lean makes a rank hold "
                     "only what it uses")
    return "; ".join(lines)


def not_memory(model: LayerStack, data: Data, job: TrainConfig, rank: int, held: int | None,
               limit: int, room: int | None) -> str | None:
    """Why memory did not kill a dead rank, most likely (None: it may have): its worker had a
    Dask memory ``limit`` (bytes; 0: none), its process last ``held`` under half of it, and
    ``gp.estimate_memory`` puts the rank's need under half the ``room`` it had."""
    if not limit or held is None or held >= limit / 2:
        return None
    try:
        need = int(estimate(model, data, job).loc[rank, "peak_bytes"])
    except Exception:  # the advice must never hide the failure it explains
        logger.exception("estimating memory for the failure message")
        return None
    if room is not None and need >= room / 2:
        return None
    return (f"gp.estimate_memory puts its need at {format_bytes(need)}: it was far from its "
            "memory_limit, so something else ended its process (a signal or a crash: the "
            "worker's log says which)")
