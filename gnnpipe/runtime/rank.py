"""What every rank does around its mode's loop: join the process group, set threads, report
epochs live, stop together, and return its records, timeline and byte counters."""

from __future__ import annotations

import copy
import logging
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe import checkpoint as ckpt
from gnnpipe.core.kinds import Mode
from gnnpipe.engine import state as engine_state
from gnnpipe.engine.driver import Checkpointable, drive
from gnnpipe.engine.memory import MemoryMeter
from gnnpipe.nn import LayerStack
from gnnpipe.runtime.comm import Comm
from gnnpipe.runtime.graph import GraphRank, graph_program
from gnnpipe.runtime.hybrid import hybrid_program
from gnnpipe.runtime.pipeline import PipelineStage, pipeline_program
from gnnpipe.runtime.spec import Attempt, JobSpec, RankResult
from gnnpipe.runtime.store import bind_transport, rendezvous, worker_host
from gnnpipe.runtime.workerenv import heap_ceiling

__all__ = ["PROGRAMS", "EpochReporter", "run_rank"]

logger = logging.getLogger(__name__)


if TYPE_CHECKING:
    from distributed import Worker


class RankProgram(Checkpointable, Protocol):
    """What a distributed mode's ranks run: a checkpointable epoch program that also hands
    back its share of the final weights."""

    def state(self) -> dict[str, Tensor]:
        """The final weights of the blocks this rank holds."""


#: The program each distributed mode's ranks run: ``(spec, comm, model, data) -> RankProgram``.
PROGRAMS: dict[Mode, Callable[..., RankProgram]] = {
    Mode.PIPELINE: pipeline_program, Mode.GRAPH: graph_program, Mode.HYBRID: hybrid_program,
}


class EpochReporter:
    """Publishes each epoch's record on the Dask topic and checks the stop flag (rank 0 decides,
    every rank follows, so all stop at the same epoch boundary)."""

    def __init__(self, spec: JobSpec, comm: Comm, attempt: int = 0) -> None:
        self.spec, self.comm, self.attempt = spec, comm, attempt
        self.records: list[dict[str, Any]] = []
        self._published = 0  # timeline rows already sent live
        self._event = None
        if comm.rank == 0:
            from distributed import Event

            self._event = Event(spec.stop_event)
        try:
            from distributed import get_worker

            self._worker: Worker | None = get_worker()
        except ValueError:  # not inside a Dask worker (direct call in tests)
            self._worker = None

    def __call__(self, record: dict[str, Any]) -> bool:
        """Publish ``record`` (an epoch callback of :func:`gnnpipe.engine.driver.drive`); return
        True when the run should stop now."""
        record["rank"] = self.comm.rank
        record["comm_bytes"] = self.comm.epoch_bytes.get(record["epoch"], 0)
        record["attempt"] = self.attempt
        self.records.append(record)
        if self._worker is not None:
            ops = [e.to_dict() for e in self.comm.events[self._published:]]
            # "comm": this rank's byte counters so far, per (src, dst, kind), for live views
            self._worker.log_event(self.spec.topic,
                                   {**record, "ops": ops, "comm": self.comm.comm_table()})
        self._published = len(self.comm.events)
        stop = bool(self._event.is_set()) if self._event is not None else False
        return self.comm.broadcast_flag(stop)


def _clock_domain() -> str:
    """What identifies this process's ``perf_counter`` clock: the kernel's boot id on Linux (one
    monotonic clock per running kernel, whatever the host names say: containers on one machine
    share it, cloned machines named alike do not), else the host name."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def _shared_origin() -> float:
    """Time zero of every rank's timeline, called right after a barrier. ``perf_counter`` is
    the kernel's monotonic clock, shared by all its processes, so ranks on rank 0's machine take
    rank 0's origin exactly; ranks on other machines take their own barrier exit (aligned to
    within the barrier's latency)."""
    mine: list[Any] = [time.perf_counter(), _clock_domain()]  # a float and a str
    theirs = list(mine)
    dist.broadcast_object_list(theirs, src=0)
    return theirs[0] if theirs[1] == mine[1] else mine[0]


def _rank_device(spec: JobSpec, local_rank: int) -> torch.device:
    """The CPU, or this rank's GPU: ``local_rank`` (its place among the ranks on its host) modulo
    the GPUs the worker sees (one under dask-cuda, which sets ``CUDA_VISIBLE_DEVICES``)."""
    if spec.job.device != "cuda":
        return torch.device("cpu")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def _rank_copies(spec: JobSpec, device: torch.device) -> tuple[LayerStack, Data]:
    """This rank's model (a copy: the spec keeps the initial weights for a restart) and graph, on
    ``device``."""
    return copy.deepcopy(spec.model).to(device), copy.copy(spec.data).to(device)


def _join_group(spec: JobSpec, rank: int, init_method: str, device: torch.device) -> None:
    """Join the process group with every socket on this worker's interface: the rendezvous
    store (rank 0 serves it on its worker's address only) and gloo's or NCCL's transport."""
    host = worker_host()
    if host is not None:  # outside a Dask worker the backend picks its interface itself
        bind_transport(spec.backend, host)
    timeout = timedelta(seconds=spec.job.timeout)
    store = rendezvous(init_method, rank, spec.world, timeout)
    dist.init_process_group(spec.backend, store=store, rank=rank, world_size=spec.world,
                            timeout=timeout, device_id=device if device.type == "cuda" else None)


def run_rank(spec: JobSpec, rank: int, attempt: Attempt, local_rank: int = 0) -> RankResult:
    """Entry point submitted to one Dask worker per rank: the mode's program (:data:`PROGRAMS`)
    run by the epoch driver, resumed from and
    checkpointed to where ``attempt`` and ``spec`` say."""
    make_program = PROGRAMS[spec.job.mode]
    torch.set_num_threads(attempt.threads)
    device = _rank_device(spec, local_rank)
    meter = MemoryMeter(device).begin()
    # under a worker's Dask memory_limit or a plan's
    meter.ceiling = ceiling = heap_ceiling(spec.launch.plan_memory_limit, meter.baseline)
    model, data = _rank_copies(spec, device)
    _join_group(spec, rank, attempt.init_method, device)
    try:
        dist.barrier()
        stage, way = (0, rank) if spec.job.mode is Mode.GRAPH else (rank % spec.job.stages, rank // spec.job.stages)
        comm = Comm(rank, spec.world, stage=stage, way=way, origin=_shared_origin(),
                    device=device)
        program = make_program(spec, comm, model, data)
        if isinstance(program, PipelineStage):  # hybrid too: chunk ops leave holes in the heap
            program.executor.after_op = ceiling
        elif isinstance(program, GraphRank):  # so do a small partition's rows
            program.after_swap = ceiling
        reporter = EpochReporter(spec, comm, attempt.number)
        start, inherited = _resume(attempt, program, rank)
        callbacks: list[Callable[[dict[str, Any]], bool]] = [meter, reporter]
        if spec.job.checkpoint is not None:
            assert spec.job.checkpoint_every is not None  # the API door sets both or neither
            callbacks.append(ckpt.Checkpointer(
                spec.job.checkpoint, spec.job.checkpoint_every, spec.job.epochs, program, spec.job,
                engine_state.param_shapes(model), rank, spec.world, inherited=inherited, gather=_gather))
        drive(program, spec.job.epochs, spec.job.eval_every, start, callbacks)
        dist.barrier()
        return RankResult(rank, reporter.records, [e.to_dict() for e in comm.events],
                          comm.comm_table(), {k: v.cpu() for k, v in program.state().items()})
    finally:
        dist.destroy_process_group()


def _resume(attempt: Attempt, program: Any, rank: int) -> tuple[int, list[dict[str, Any]]]:
    """Restore ``program`` from the attempt's checkpoint: the epoch to start at and the history
    records before it (``0, []`` when the attempt starts afresh)."""
    if attempt.resume is None:
        return 0, []
    manifest = ckpt.Manifest.read(attempt.resume)
    if manifest is None:
        raise RuntimeError(f"resume: rank {rank} finds no complete checkpoint at "
                           f"{attempt.resume!r} (is the folder shared with every worker?)")
    program.restore(manifest.shards())
    return manifest.epoch, list(manifest.records) if rank == 0 else []


def _gather(records: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Every rank's records on rank 0 (a collective: once it returns there, every rank has
    written its shard)."""
    out: list[Any] = [None] * dist.get_world_size() if dist.get_rank() == 0 else []
    dist.gather_object(records, out if dist.get_rank() == 0 else None, dst=0)
    return out if dist.get_rank() == 0 else []
