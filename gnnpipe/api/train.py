"""`gnnpipe.train()`: check the arguments, choose the engine for the mode, return a `Run`."""

from __future__ import annotations

import copy
import functools
import logging
import os
import time
from typing import Any

import torch
from torch_geometric.data import Data
from tqdm.auto import tqdm

from gnnpipe import checkpoint as ckpt
from gnnpipe.api import door
from gnnpipe.core.job import PARTS_PER_CHUNK, TrainConfig
from gnnpipe.core.kinds import Mode
from gnnpipe.core.techniques import Techniques
from gnnpipe.core.timeline import Timeline
from gnnpipe.engine import single
from gnnpipe.engine.buffers import torch_dtype
from gnnpipe.engine.driver import EpochCallback, EpochProgram, drive
from gnnpipe.engine.graph import normalized_adjacency
from gnnpipe.engine.local import LocalEngine
from gnnpipe.engine.memory import MemoryMeter
from gnnpipe.engine.state import param_shapes
from gnnpipe.nn import LayerStack
from gnnpipe.partition import chunk as make_chunks
from gnnpipe.pyg import for_training
from gnnpipe.run import Run, RunHandle, events_frame, history_from, memory_from
from gnnpipe.runtime.start import start_distributed

__all__ = ["follow", "train"]

logger = logging.getLogger(__name__)


def train(model: LayerStack, data: Data, mode: Mode | str | None = None, *, epochs: int = 200,
          lr: float = 0.01, weight_decay: float = 5e-4, gnn_weight_decay: float | None = None,
          seed: int = 0, stages: int | None = None, chunks: int | None = None,
          parts_per_chunk: int = PARTS_PER_CHUNK, ways: int | None = None,
          parts: int | None = None, techniques: Techniques | dict | bool | None = None,
          recompute: bool | None = None, history_dtype: torch.dtype | str | None = None,
          wire_dtype: torch.dtype | str | None = None, schedule: str | None = None,
          cluster: Any = None, workers: int | None = None,
          background: bool = False, timeout: float = 120.0, plan: Any = None,
          eval_every: int = 1, device: str = "cpu", progress: bool = True,
          split: Any = None, checkpoint: str | os.PathLike | None = None,
          checkpoint_every: int = 10, resume: str | os.PathLike | None = None,
          restarts: int = 0) -> RunHandle:
    """Train ``model`` in place on ``data`` and return its run: a :class:`~gnnpipe.run.Run`, or a
    :class:`~gnnpipe.runtime.handle.DistributedRun` in distributed modes (both a
    :class:`~gnnpipe.run.RunHandle`).

    Args:
        model: a :class:`~gnnpipe.models.LayerStack` (``gp.models.gcnii(...)`` and friends), or
            a PyG BasicGNN (``GCN``, ``GraphSAGE``, ``GIN``, ``GAT``) or ``Sequential``, converted
            by ``gp.models.from_pyg`` (its own parameters are trained).
        data: a PyG ``Data`` with features, labels and train/val/test masks, or a PyG
            ``Dataset`` of one graph; float64 or float16 features are converted to float32 (a
            logged warning), ``[n, 1]`` labels flattened; ``data`` itself is not changed.
        mode: ``"single"`` (exact full graph) or ``"local"`` (GNNPipe's chunked epoch in one
            process); ``"pipeline"``, ``"graph"`` and ``"hybrid"`` run on Dask workers.
            (default: ``"single"``, or the plan's mode)
        epochs: optimizer steps (one per epoch in every mode).
        lr: Adam learning rate.
        weight_decay: L2 on the input projection and classifier (and on GNN layers unless
            ``gnn_weight_decay`` is given).
        gnn_weight_decay: L2 on the GNN layers.
        seed: seeds chunking, chunk order and dropout masks; the model's initial weights are yours.
        stages: pipeline stages (block ranges); the math of ``local`` does not depend on it.
            (default: 1)
        chunks: chunks per epoch; default ``4 × stages`` for chunked modes.
        parts_per_chunk: METIS parts merged at random into each chunk (:func:`gnnpipe.chunk`);
            1 (default): METIS's own parts, the fewest edges between chunks; 4: the GNNPipe
            paper's merge.
        techniques: GNNPipe's convergence switches (:class:`~gnnpipe.core.techniques.Techniques`;
            a dict changes the defaults: random order and snapshot on, unbiased gradients off;
            ``True``: all three on, the paper's set). ``None``: the defaults, except for models
            with PyG message-passing layers, which train with the snapshot off too
            (:func:`gnnpipe.pyg.default_techniques`).
        ways: data-parallel pipelines of ``hybrid`` (chunks are split among them). (default: 1)
        parts: graph-parallel ranks of ``graph`` (METIS partitions). (default: 2)
        recompute: keep only stage inputs and aggregations; rerun the forward in backward.
            (default: ``False``)
        history_dtype: what the chunked modes keep their historical buffers in (``Hbuf``, its
            snapshot and ``dZbuf``, one row per node per aggregating layer):
            ``torch.bfloat16`` or ``torch.float16`` halve that memory, and the rows the hybrid's
            ways exchange; every product still runs in float32 (rows are rounded when stored).
            (default: ``torch.float32``)
        wire_dtype: what stage-boundary activations and their gradients (``pipeline``,
            ``hybrid``) and halo rows (``graph``) are sent in: ``torch.bfloat16`` halves those
            bytes (``gp.comm_volume`` counts them so). ``local`` rounds at its stage boundaries
            alike, so ``pipeline`` still equals it; evaluation is sent in float32.
            (default: ``torch.float32``)
        schedule: the order of the chunked epoch (``local``, ``pipeline``;
            :class:`~gnnpipe.core.kinds.TrainSchedule`): ``"gnnpipe"``, GNNPipe's fill-drain
            (every forward, then every backward in reverse); or ``"1f1b"``, each chunk's backward
            as soon as the last stage has its loss, backwards in chunk order: stage ``s`` keeps at
            most ``S - s`` chunks' activations instead of ``C``, and a stage's forward and
            backward work overlap, which pays when stages' forwards and backwards are unequal;
            a backward then pulls last epoch's gradients of the chunks after it (a different
            training rule, measured in the docs). (default: ``"gnnpipe"``)
        cluster: where distributed modes run: ``None`` (a local Dask cluster of the right size,
            closed afterwards), a :class:`~gnnpipe.runtime.cluster.Cluster`, a
            ``distributed.Client`` or a scheduler address.
        workers: if given, the number of workers the run must use exactly.
        background: return at once (distributed modes); use ``run.wait()``, ``run.stop()``.
        timeout: seconds a rank waits on a peer before the run fails.
        plan: a :class:`~gnnpipe.plan.Plan` from ``gp.plan``: trains its layout in its mode
            (``mode`` may be left out; ``"local"`` runs a pipeline plan in this process): its
            stages and their ranges, chunks, ways, parts, ``recompute``, ``history_dtype``,
            ``wire_dtype`` and ``schedule``, which are then not given (or given as the plan has
            them). ``run.prediction`` holds what the plan predicted, and ``run.summary()`` puts
            it beside what was measured. The distributed ranks of a plan made under a
            ``memory_limit`` trim their heap past 80% of it above what they held when the graph
            arrived, so that freed tensors do not keep them over it.
        eval_every: exact full-graph evaluation after every ``eval_every``-th epoch and the last
            one; the other epochs' metric columns are NaN (``best`` picks among evaluated epochs).
        device: ``"cpu"`` or ``"cuda"``: one-process modes train on this process's GPU (the
            model is moved there); distributed ranks each take a GPU of their worker and talk
            through NCCL instead of gloo.
        progress: show a tqdm bar.
        split: train/val/test masks for a graph without them (or to replace them): OGB's
            ``split_idx`` ``{"train": ids, "valid": ids, "test": ids}``, ``"random"`` (a 60/20/20
            split seeded by ``seed``) or shares ``{"train": 0.6, "val": 0.2, "test": 0.2}``;
            see :func:`gnnpipe.datasets.prepare_data`.
        checkpoint: a folder to write checkpoints to (:mod:`gnnpipe.checkpoint`): every
            ``checkpoint_every`` epochs and after the last one, each rank (or this process) writes
            its shard (model slice, Adam state, historical buffers), then a manifest. Distributed
            ranks write it themselves: give a folder every worker sees at that path.
        checkpoint_every: epochs between checkpoints.
        resume: a checkpoint folder: continue from its newest complete checkpoint (epochs run on
            up to ``epochs``; the history starts with the checkpoint's). Any mode and stage split
            may resume any checkpoint: model and Adam state are resharded by parameter name; the
            historical buffers carry over where node order, chunking and stage layout allow
            (``local`` <-> ``pipeline``, or the same layout) and otherwise start from zeros like
            epoch 0 (a logged warning), so the run is then no longer identical to an
            uninterrupted one.
        restarts: distributed modes: when a worker dies (also as the launcher asks it for its
            memory or sends it the graph, before its rank starts) or a rank raises, restart
            every rank from the newest checkpoint (from epoch 0 if none is written yet) up to
            ``restarts`` times, then fail naming the rank and cause (``WorkerLeft`` naming the
            worker, for one that died before its rank); needs ``checkpoint``. ``run.events`` and
            the history's ``restarts`` column show each restart.

    Raises:
        ValueError, TypeError: naming the bad argument (:func:`gnnpipe.api.door.check_train`),
            before the graph is chunked or any Dask cluster is contacted.
    """
    mode, layout = door.resolve_layout(plan, mode, {
        "stages": stages, "chunks": chunks, "ways": ways, "parts": parts, "recompute": recompute,
        "history_dtype": history_dtype, "wire_dtype": wire_dtype, "schedule": schedule})
    model = for_training(model, mode, data)  # PyG BasicGNN / Sequential -> LayerStack, same weights
    job, data, recovery, prediction = door.parse_train(
        model, data, mode, plan=plan, parts_per_chunk=parts_per_chunk, workers=workers,
        cluster=cluster,
        techniques=techniques, split=split, checkpoint=checkpoint,
        checkpoint_every=checkpoint_every, resume=resume, restarts=restarts,
        background=background, progress=progress, epochs=epochs, lr=lr,
        weight_decay=weight_decay, gnn_weight_decay=gnn_weight_decay, seed=seed,
        timeout=timeout, **layout,
        eval_every=eval_every, device=device)
    if job.mode.distributed:
        limit = None if prediction is None else prediction.memory_limit
        handle = start_distributed(model, data, job, cluster, recovery,
                                   plan_memory_limit=limit)
        handle.prediction = prediction
        return handle if background else follow(handle, progress)
    run = _train_here(model, data, job, recovery, progress)
    run.prediction = prediction
    logger.info("%r", run)
    return run


def _train_here(model: LayerStack, data: Data, job: TrainConfig, recovery: ckpt.Recovery,
                progress: bool) -> Run:
    """``single`` and ``local``: the epoch driver in this process, resumed and checkpointed as
    ``recovery`` says."""
    meter = MemoryMeter(job.device).begin()  # counts from here: the caller's memory does not
    model.to(job.device)
    optimizer = torch.optim.Adam(model.param_groups(job.weight_decay, job.gnn_weight_decay),
                                 lr=job.lr)
    parts = None if job.mode is Mode.SINGLE else make_chunks(
        data, job.chunks, seed=job.seed, parts_per_chunk=job.parts_per_chunk)
    layout = ckpt.layout(job.mode, job.ranges, ckpt.node_order(parts))
    program: EpochProgram
    if parts is None:
        eval_data = copy.copy(data).to(job.device)  # a shallow copy: the caller's data stays put
        adj = normalized_adjacency(eval_data.edge_index, data.num_nodes, model.norm)
        program = single.SingleProgram(model, eval_data, adj, optimizer, job.seed, layout)
    else:
        eval_data = parts.apply(data).to(job.device)
        adj = normalized_adjacency(eval_data.edge_index, eval_data.num_nodes, model.norm)
        program = LocalEngine(model, eval_data, adj, parts.bounds.tolist(), job.ranges,
                              job.techniques, job.seed, job.recompute, optimizer, layout,
                              history_dtype=torch_dtype(job.history_dtype),
                              wire_dtype=torch_dtype(job.wire_dtype), schedule=job.schedule)
    start, inherited = recovery.start(program)
    bar = tqdm(total=job.epochs, initial=start, desc=f"{model.name}-{model.num_layers} {job.mode}",
               disable=not progress, leave=False)
    callbacks: list[EpochCallback] = [meter, functools.partial(_one_process_record, bar)]
    if recovery.root is not None:
        callbacks.append(ckpt.Checkpointer(recovery.root, recovery.every, job.epochs, program,
                                           job, param_shapes(model),
                                           inherited=inherited))
    origin = time.perf_counter()
    with bar:
        records = drive(program, job.epochs, job.eval_every, start, callbacks)
    timeline = Timeline.from_events(getattr(program, "events", []))
    if len(timeline):
        timeline.df[["start", "end"]] -= origin
    return Run(config=job, history=history_from(inherited + records), timeline=timeline,
               data=data, partitioning=parts, events=events_frame(recovery.events()),
               peaks=memory_from(records))


def _one_process_record(bar: Any, record: dict[str, Any]) -> bool:
    """Complete a one-process epoch record (rank 0, no bytes) and advance the progress bar."""
    record.update(rank=0, comm_bytes=0, attempt=0)
    bar.update(1)
    if "val_acc" in record:
        bar.set_postfix(loss=f"{record['loss']:.3f}", val=f"{record['val_acc']:.3f}",
                        test=f"{record['test_acc']:.3f}")
    return False


def follow(run: RunHandle, progress: bool) -> RunHandle:
    """Wait for a distributed run, advancing a progress bar (with the latest loss and
    accuracies) from its live history."""
    config = run.config
    with tqdm(total=config.epochs, desc=f"{config.model} {config.mode}", disable=not progress,
              leave=False) as bar:
        while not run.done:
            time.sleep(0.2)
            history = run.history if progress else None
            if history is not None and len(history) > bar.n:
                last, scored = history.iloc[-1], history.dropna(subset=["val_acc"])
                accs = scored.iloc[-1] if len(scored) else last  # eval_every skips epochs
                bar.set_postfix(loss=f"{last['loss']:.3f}", val=f"{accs['val_acc']:.3f}",
                                test=f"{accs['test_acc']:.3f}", refresh=False)
                bar.update(len(history) - bar.n)
    return run.wait()
