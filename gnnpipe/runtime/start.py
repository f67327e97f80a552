"""Turn ``train``'s arguments into a `JobSpec` (chunking or partitioning on the client, before
any worker starts) and start a `DistributedRun`."""

from __future__ import annotations

from typing import Any

from torch_geometric.data import Data

from gnnpipe import checkpoint as ckpt
from gnnpipe.engine.chunked import Techniques
from gnnpipe.models import LayerStack
from gnnpipe.partition import chunk, partition
from gnnpipe.run import Run
from gnnpipe.runtime.cluster import check_gpus, gpu_ids, resolve
from gnnpipe.runtime.handle import DistributedRun
from gnnpipe.runtime.launch import new_topic
from gnnpipe.runtime.rank import JobSpec
from gnnpipe.runtime.scripts import check_main_guard
from gnnpipe.runtime.workerenv import check_workers


def start_distributed(model: LayerStack, data: Data, config: dict[str, Any], techniques: Techniques,
                      cluster: Any, timeout: float, recovery: ckpt.Recovery) -> DistributedRun:
    if cluster is None:  # a local cluster will be started: refuse an unguarded script first
        check_main_guard()
    mode = config["mode"]
    if mode == "graph":
        parts = partition(data, config["parts"], method="metis", seed=config["seed"])
        stages, ways = 1, 1
    else:
        parts = chunk(data, config["chunks"], seed=config["seed"],
                      parts_per_chunk=config["parts_per_chunk"])
        stages, ways = config["stages"], config["ways"]
    ranges = [(0, len(model))] if mode == "graph" else [tuple(r) for r in config["ranges"]]
    topic = new_topic()
    config["run_id"] = topic
    config["predicted_comm_bytes"] = _predicted(model, data, config, parts)
    spec = JobSpec(mode=mode, model=model, data=parts.apply(data), bounds=parts.bounds.tolist(),
                   epochs=config["epochs"], lr=config["lr"], weight_decay=config["weight_decay"],
                   gnn_weight_decay=config["gnn_weight_decay"], seed=config["seed"], stages=stages,
                   ways=ways, ranges=ranges, techniques=techniques,
                   recompute=config["recompute"], timeout=timeout, topic=topic,
                   stop_event=f"{topic}-stop", eval_every=config["eval_every"],
                   device=config["device"], node_order=ckpt.node_order(parts),
                   checkpoint=recovery.root, checkpoint_every=recovery.every, config=config)
    handle, owned = resolve(cluster, spec.world)
    try:
        workers = handle.ready(spec.world)
        if len(workers) < spec.world:
            raise ValueError(f"cluster: the run needs {spec.world} workers (one per rank), the "
                             f"cluster has {len(workers)}")
        check_workers(handle.client, workers, handle.threads_per_worker)  # ranks may go to any
        ranks = workers[:spec.world]  # where they go on an idle cluster
        if spec.device == "cuda":
            check_gpus(ranks, handle.client.run(gpu_ids, workers=ranks))
    except BaseException:
        if owned:
            handle.close()
        raise
    result = Run(config=config, partitioning=parts, data=data)
    return DistributedRun(result, spec, handle, owned, model, recovery).start()


def _predicted(model: LayerStack, data: Data, config: dict[str, Any], parts: Any) -> int:
    from gnnpipe.volume import comm_volume

    return comm_volume(model, data, config["mode"], stages=config["stages"], parts=config["parts"],
                       ways=config["ways"], partitioning=parts, chunks=config["chunks"],
                       ranges=config["ranges"])
