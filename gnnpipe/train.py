"""`gnnpipe.train()`: check the arguments, choose the engine for the mode, return a `Run`."""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import asdict
from typing import Any

import pandas as pd
import torch
from torch_geometric.data import Data
from tqdm.auto import tqdm

from gnnpipe import validate
from gnnpipe.engine import single
from gnnpipe.engine.chunked import Techniques
from gnnpipe.engine.graph import normalized_adjacency
from gnnpipe.engine.local import LocalEngine, stage_ranges
from gnnpipe.events import OpEvent, Timeline
from gnnpipe.models import LayerStack
from gnnpipe.partition import chunk as make_chunks
from gnnpipe.run import HISTORY_COLUMNS, Run

logger = logging.getLogger(__name__)

MODES = validate.MODES  # the CLI's mode choices
DISTRIBUTED = validate.DISTRIBUTED


def train(model: LayerStack, data: Data, mode: str = "single", *, epochs: int = 200,
          lr: float = 0.01, weight_decay: float = 5e-4, gnn_weight_decay: float | None = None,
          seed: int = 0, stages: int = 1, chunks: int | None = None,
          ways: int = 1, parts: int = 2, techniques: Techniques | dict | bool | None = None,
          recompute: bool = False, cluster: Any = None, workers: int | None = None,
          background: bool = False, timeout: float = 120.0, plan: Any = None,
          eval_every: int = 1, device: str = "cpu", progress: bool = True) -> Run:
    """Train ``model`` in place on ``data`` and return a :class:`~gnnpipe.run.Run`.

    Args:
        model: a :class:`~gnnpipe.models.LayerStack` (``gp.models.gcnii(...)`` and friends).
        data: a PyG ``Data`` with features, labels and train/val/test masks; float64 or
            float16 features are converted to float32 (a logged warning; ``data`` is not changed).
        mode: ``"single"`` (exact full graph) or ``"local"`` (GNNPipe's chunked epoch in one
            process); ``"pipeline"``, ``"graph"`` and ``"hybrid"`` run on Dask workers.
        epochs: optimizer steps (one per epoch in every mode).
        lr: Adam learning rate.
        weight_decay: L2 on the input projection and classifier (and on GNN layers unless
            ``gnn_weight_decay`` is given).
        gnn_weight_decay: L2 on the GNN layers.
        seed: seeds chunking, chunk order and dropout masks; the model's initial weights are yours.
        stages: pipeline stages (block ranges); the math of ``local`` does not depend on it.
        chunks: chunks per epoch; default ``4 × stages`` for chunked modes.
        techniques: GNNPipe's convergence switches (:class:`~gnnpipe.engine.chunked.Techniques`).
        ways: data-parallel pipelines of ``hybrid`` (chunks are split among them).
        parts: graph-parallel ranks of ``graph`` (METIS partitions).
        recompute: keep only stage inputs and aggregations; rerun the forward in backward.
        cluster: where distributed modes run: ``None`` (a local Dask cluster of the right size,
            closed afterwards), a :class:`~gnnpipe.runtime.cluster.Cluster`, a
            ``distributed.Client`` or a scheduler address.
        workers: if given, the number of workers the run must use exactly.
        background: return at once (distributed modes); use ``run.wait()``, ``run.stop()``.
        timeout: seconds a rank waits on a peer before the run fails.
        plan: a :class:`~gnnpipe.plan.Plan` from ``gp.plan``: its stage ranges and chunk count
            replace ``stages`` and ``chunks``.
        eval_every: exact full-graph evaluation after every ``eval_every``-th epoch and the last
            one; the other epochs' metric columns are NaN (``best`` picks among evaluated epochs).
        device: ``"cpu"`` or ``"cuda"``: one-process modes train on this process's GPU (the
            model is moved there); distributed ranks each take a GPU of their worker and talk
            through NCCL instead of gloo.
        progress: show a tqdm bar.

    Raises:
        ValueError, TypeError: naming the bad argument (:func:`gnnpipe.validate.check_train`),
            before the graph is chunked or any Dask cluster is contacted.
    """
    data = validate.check_train(
        model, data, mode, plan=plan, stages=stages, chunks=chunks, ways=ways, parts=parts,
        workers=workers, cluster=cluster, techniques=techniques, epochs=epochs, lr=lr,
        weight_decay=weight_decay, gnn_weight_decay=gnn_weight_decay, seed=seed,
        recompute=recompute, background=background, timeout=timeout, eval_every=eval_every,
        device=device, progress=progress)
    ranges, stages, chunks = validate.split(plan, stages, chunks)
    tech = Techniques.coerce(techniques)
    config = {"mode": mode, "model": model.name, "layers": model.num_layers, "epochs": epochs,
              "lr": lr, "weight_decay": weight_decay, "gnn_weight_decay": gnn_weight_decay,
              "seed": seed, "stages": stages, "chunks": chunks if mode != "single" else 1,
              "techniques": asdict(tech), "recompute": recompute,
              "dataset": getattr(data, "name", None), "ways": ways, "parts": parts,
              "eval_every": eval_every, "device": device,
              "ranges": ranges or stage_ranges(len(model), stages)}
    if mode in DISTRIBUTED:
        from gnnpipe.runtime.start import start_distributed

        run = start_distributed(model, data, config, tech, cluster, timeout)
        return run if background else _follow(run, epochs, progress)
    model.to(device)
    optimizer = torch.optim.Adam(model.param_groups(weight_decay, gnn_weight_decay), lr=lr)

    events: list[OpEvent] = []
    if mode == "single":
        eval_data = copy.copy(data).to(device)  # a shallow copy: the caller's data stays put
        adj = normalized_adjacency(eval_data.edge_index, data.num_nodes, model.norm)

        def step(epoch: int) -> float:
            return single.train_epoch(model, eval_data, adj, optimizer, seed, epoch)
    else:
        parts = make_chunks(data, chunks, seed=seed)
        eval_data = parts.apply(data).to(device)
        adj = normalized_adjacency(eval_data.edge_index, eval_data.num_nodes, model.norm)
        engine = LocalEngine(model, eval_data, adj, parts.bounds.tolist(),
                             config["ranges"], tech, seed, recompute)
        events = engine.events

        def step(epoch: int) -> float:
            return engine.train_epoch(optimizer, epoch)

    rows = []
    origin = time.perf_counter()
    bar = tqdm(range(epochs), desc=f"{model.name}-{model.num_layers} {mode}", disable=not progress,
               leave=False)
    for epoch in bar:
        start = time.perf_counter()
        loss = step(epoch)
        elapsed = time.perf_counter() - start
        rows.append({"epoch": epoch, "loss": loss, "epoch_time": elapsed, "comm_bytes": 0})
        if single.evaluates(epoch, epochs, eval_every):
            metrics = single.evaluate(model, eval_data, adj)
            rows[-1].update(metrics)
            bar.set_postfix(loss=f"{loss:.3f}", val=f"{metrics['val_acc']:.3f}",
                            test=f"{metrics['test_acc']:.3f}")
    history = pd.DataFrame(rows, columns=list(HISTORY_COLUMNS))
    timeline = Timeline.from_events(events)
    if len(timeline):
        timeline.df[["start", "end"]] -= origin
    run = Run(config=config, history=history, timeline=timeline, data=data,
              partitioning=None if mode == "single" else parts)
    logger.info("%r", run)
    return run


def _follow(run: Any, epochs: int, progress: bool) -> Run:
    """Wait for a distributed run, advancing a progress bar (with the latest loss and
    accuracies) from its live history."""
    with tqdm(total=epochs, desc=f"{run.config['model']} {run.config['mode']}",
              disable=not progress, leave=False) as bar:
        while not run.done:
            time.sleep(0.2)
            history = run.history if progress else ()
            if len(history) > bar.n:
                last, scored = history.iloc[-1], history.dropna(subset=["val_acc"])
                accs = scored.iloc[-1] if len(scored) else last  # eval_every skips epochs
                bar.set_postfix(loss=f"{last['loss']:.3f}", val=f"{accs['val_acc']:.3f}",
                                test=f"{accs['test_acc']:.3f}", refresh=False)
                bar.update(len(history) - bar.n)
    return run.wait()
