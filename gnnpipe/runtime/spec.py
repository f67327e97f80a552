"""What a rank is handed: the job (`JobSpec`), one launch of it (`Attempt`), and what it hands
back (`RankResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch_geometric.data import Data

from gnnpipe.core.job import Launch, TrainConfig
from gnnpipe.nn import LayerStack
from gnnpipe.runtime.shipping import ship_by_frames

__all__ = ["Attempt", "JobSpec", "RankResult", "backend_for"]


@ship_by_frames
@dataclass(frozen=True)
class JobSpec:
    """Everything a rank needs, a frozen description of the job; sent to each rank by Dask (the
    graph's tensors as frames of their own, :mod:`~gnnpipe.runtime.shipping`).
    Ranks train a copy of ``model``; what changes from one launch to the next (threads,
    rendezvous, the checkpoint resumed after a restart) is an :class:`Attempt`.

    ``data`` is already reordered so that chunks (pipeline) or partitions (graph) are contiguous
    row ranges given by ``bounds``; ``node_order`` digests that order
    (:func:`gnnpipe.checkpoint.node_order`).
    """

    job: TrainConfig
    launch: Launch
    model: LayerStack
    data: Data
    bounds: list[int]
    node_order: str = ""

    @property
    def backend(self) -> str:
        """``nccl`` between GPUs, ``gloo`` between CPU processes."""
        return backend_for(self.job.device)

    @property
    def world(self) -> int:
        return self.job.world

    @property
    def topic(self) -> str:
        """The Dask topic the ranks publish their epochs on: the run's id."""
        return self.launch.run_id

    @property
    def stop_event(self) -> str:
        """The name of the Dask event that asks every rank to stop."""
        return f"{self.launch.run_id}-stop"


def backend_for(device: str) -> str:
    """``nccl`` between GPUs, ``gloo`` between CPU processes."""
    return "nccl" if device == "cuda" else "gloo"


@dataclass(frozen=True)
class Attempt:
    """One launch of a job: the rendezvous, torch threads per rank, how many restarts came
    before it, and the checkpoint folder (a complete ``epoch-*`` one) it resumes from."""

    init_method: str
    threads: int = 1
    number: int = 0
    resume: str | None = None


@dataclass
class RankResult:
    """A rank's whole run: per-epoch records, timeline rows, byte counters, final weights."""

    rank: int
    records: list[dict[str, Any]]
    events: list[dict[str, Any]]
    comm: list[dict[str, Any]]
    state: dict[str, torch.Tensor]
    worker: str = ""  # the worker address it ran on (filled in by the launcher)
