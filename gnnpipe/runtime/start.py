"""Start a distributed job: chunk or partition the graph on the client, before any worker
starts, and hand a `JobSpec` to a `DistributedRun`."""

from __future__ import annotations

from typing import Any

from torch_geometric.data import Data

from gnnpipe import checkpoint as ckpt
from gnnpipe.analysis.volume import comm_volume
from gnnpipe.core.job import Launch, TrainConfig
from gnnpipe.core.kinds import Mode
from gnnpipe.nn import LayerStack
from gnnpipe.partition import Partitioning, chunk, partition
from gnnpipe.runtime.asking import ask
from gnnpipe.runtime.cluster import check_gpus, gpu_ids, resolve
from gnnpipe.runtime.handle import DistributedRun
from gnnpipe.runtime.launch import new_topic
from gnnpipe.runtime.scripts import check_main_guard
from gnnpipe.runtime.spec import JobSpec
from gnnpipe.runtime.workerenv import check_workers

__all__ = ["start_distributed"]


def start_distributed(model: LayerStack, data: Data, job: TrainConfig, cluster: Any,
                      recovery: ckpt.Recovery, plan_memory_limit: int | None = None) -> DistributedRun:
    """Start ``job`` on ``cluster`` (see ``gp.train``) and return its handle at once.
    ``plan_memory_limit``: the bytes each rank may add once the graph has arrived (a plan's): its
    ranks trim their heap under it (:func:`~gnnpipe.runtime.workerenv.heap_ceiling`)."""
    if cluster is None:  # a local cluster will be started: refuse an unguarded script first
        check_main_guard()
    if job.mode is Mode.GRAPH:
        parts = partition(data, job.parts, method="metis", seed=job.seed)
    else:
        parts = chunk(data, job.chunks, seed=job.seed, parts_per_chunk=job.parts_per_chunk)
    launch = Launch(run_id=new_topic(), predicted_comm_bytes=_predicted(model, data, job, parts),
                    plan_memory_limit=plan_memory_limit)
    spec = JobSpec(job=job, launch=launch, model=model, data=parts.apply(data),
                   bounds=parts.bounds.tolist(), node_order=ckpt.node_order(parts))
    handle, owned = resolve(cluster, job.world)
    try:
        workers = handle.require(job.world, job.timeout)  # workers may still be (re)starting
        # ranks may go to any worker
        check_workers(handle.client, workers, handle.threads_per_worker, job.timeout)
        ranks = workers[:job.world]  # where they go on an idle cluster
        if job.device == "cuda":
            check_gpus(ranks, ask(handle.client, gpu_ids, ranks, timeout=job.timeout,
                                  what="its GPUs"))
    except BaseException:
        if owned:
            handle.close()
        raise
    return DistributedRun(spec, handle, owned, model, recovery, parts, data).start()


def _predicted(model: LayerStack, data: Data, job: TrainConfig, parts: Partitioning) -> int:
    return comm_volume(model, data, job.mode, stages=job.stages, parts=job.parts, ways=job.ways,
                       partitioning=parts, chunks=job.chunks, ranges=list(job.ranges),
                       history_dtype=job.history_dtype, wire_dtype=job.wire_dtype)
