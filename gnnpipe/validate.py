"""Argument checks for the public API, in one place: small named checkers and `check_train`.

Every error names the argument: ``name: expected X, got Y``. A value of the wrong kind (a
string where a number is due) raises ``TypeError``; a number of the wrong form or range (``2.5``
epochs, ``lr=inf``) raises ``ValueError``. `check_train` runs before ``gp.train`` chunks the
graph or contacts any Dask cluster.
"""

from __future__ import annotations

import copy
import itertools
import logging
import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch

logger = logging.getLogger(__name__)

MODES = ("single", "local", "pipeline", "graph", "hybrid")
DISTRIBUTED = ("pipeline", "graph", "hybrid")
CHUNKED = ("local", "pipeline", "hybrid")
DEVICES = ("cpu", "cuda")


# --------------------------------------------------------------------------- small checkers
def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {value!r}")
    return float(value)


def integer(name: str, value: Any, minimum: int) -> int:
    """An integer ``>= minimum`` (numpy integers too; bools and floats such as 2.0 refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    if not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def positive_int(name: str, value: Any) -> int:
    """An integer ``>= 1``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a positive integer, got {value!r}")
    if not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def positive_float(name: str, value: Any) -> float:
    """A finite number ``> 0``."""
    v = _number(name, value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name}: expected a positive number (finite), got {value!r}")
    return v


def nonnegative_float(name: str, value: Any) -> float:
    """A finite number ``>= 0``."""
    v = _number(name, value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name}: expected a number >= 0 (finite), got {value!r}")
    return v


def finite_float(name: str, value: Any) -> float:
    """Any finite number."""
    v = _number(name, value)
    if not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return v


def share(name: str, value: Any) -> float:
    """A number in ``[0, 1]``."""
    v = _number(name, value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name}: expected a share in [0, 1], got {value!r}")
    return v


def boolean(name: str, value: Any) -> bool:
    """``True`` or ``False`` (not ``"yes"``, not 1)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return value


def choice(name: str, value: Any, options: Sequence[str]) -> str:
    """One of ``options``."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name}: expected one of {tuple(options)}, got {value!r}")
    return value


# --------------------------------------------------------------------------- model and data
def float32_features(data: Any) -> Any:
    """``data`` itself when ``data.x`` is float32, else a shallow copy with float32 features (a
    logged warning): the models compute in float32, so float64 or float16 features are converted,
    never refused; the caller's ``data`` stays as it was."""
    if data.x.dtype == torch.float32:
        return data
    logger.warning("data.x: converting %s features to torch.float32", data.x.dtype)
    converted = copy.copy(data)
    converted.x = data.x.to(torch.float32)
    return converted


def check_model_data(model: Any, data: Any) -> None:
    """The graph is well formed (:func:`gnnpipe.datasets.validate`) and fits the model: feature
    width and every label below the model's output width."""
    from gnnpipe import datasets  # late: datasets imports this module's checkers
    from gnnpipe.models import LayerStack

    if not isinstance(model, LayerStack):
        raise TypeError(f"model: expected a gnnpipe LayerStack (gp.models.gcnii(...) etc.) or "
                        f"a PyG BasicGNN / Sequential, "
                        f"got {type(model).__name__}")
    datasets.validate(data)
    if data.x.size(1) != model.in_dim:
        raise ValueError(f"model: its input width {model.in_dim} does not match "
                         f"data.x's {data.x.size(1)} features")
    out_dim, top = model.blocks[-1].out_dim, int(data.y.max())
    if top >= out_dim:
        raise ValueError(f"data.y: labels go up to {top}, but the model's output width (out_dim) "
                         f"is {out_dim}; build the model with out_dim >= {top + 1}")


def model_graph(model: Any, data: Any, split: Any = None, seed: Any = 0) -> Any:
    """Where every graph enters (``gp.train``, ``gp.plan``): ``data`` made ready
    (:func:`gnnpipe.datasets.prepare_data`: a Dataset's graph, flat labels, masks from
    ``split``), checked against the model (:func:`check_model_data`), with float32 features
    (:func:`float32_features`). The caller's ``data`` is never modified."""
    from gnnpipe import datasets

    data = datasets.prepare_data(data, split, seed)
    check_model_data(model, data)
    return float32_features(data)


def block_structure(model: Any) -> tuple[tuple[str, bool, int], ...]:
    """What a plan must agree on with the model: each block's type, aggregation and width."""
    return tuple((type(b).__name__, bool(b.aggregates), int(b.out_dim)) for b in model.blocks)


def check_plan(plan: Any, model: Any) -> None:
    """``plan`` is a ``gp.Plan`` made for a model with ``model``'s block structure."""
    from gnnpipe.plan import Plan

    if not isinstance(plan, Plan):
        raise TypeError(f"plan: expected a gp.Plan from gp.plan(...), got {type(plan).__name__}")
    ranges = [tuple(r) for r in plan.ranges]
    if not ranges or ranges[0][0] != 0 or ranges[-1][1] != len(model) or any(
            a[1] != b[0] for a, b in itertools.pairwise(ranges)):
        raise ValueError(f"plan: its stage ranges {ranges} do not tile the model's "
                         f"{len(model)} blocks; was it made for another model?")
    planned = tuple((b.name, bool(b.aggregates), int(b.out_dim)) for b in plan.profile.blocks)
    ours = block_structure(model)
    if planned != ours:
        diff = next((i for i, (p, m) in enumerate(zip(planned, ours)) if p != m), None)
        where = (f"{len(planned)} blocks in the plan, {len(ours)} in the model" if diff is None
                 else f"block {diff} is {planned[diff]} in the plan but {ours[diff]} in the "
                 "model (type, aggregates, width)")
        raise ValueError(f"plan: it was made for another model: {where}")


# --------------------------------------------------------------------------- gp.train
def split(plan: Any, stages: Any, chunks: Any) -> tuple[list[tuple[int, int]] | None, Any, Any]:
    """``train``'s stage ranges (``None`` without a plan), stages and chunks: a plan's replace
    ``stages`` and ``chunks``; chunks default to ``4 × stages``."""
    ranges = None
    if plan is not None:
        ranges = [tuple(r) for r in plan.ranges]
        stages, chunks = len(ranges), plan.chunks
    elif chunks is None and isinstance(stages, numbers.Integral):
        chunks = 4 * stages
    return ranges, stages, chunks


def check_train(model: Any, data: Any, mode: Any, *, plan: Any = None, stages: Any = 1,
                chunks: Any = None, parts_per_chunk: Any = 1, ways: Any = 1, parts: Any = 2,
                workers: Any = None, cluster: Any = None, techniques: Any = None,
                split: Any = None, **scalars: Any) -> Any:
    """Check every argument of ``gp.train`` (same names; ``scalars`` are the epochs, lr,
    weight_decay, gnn_weight_decay, seed, recompute, background, timeout, eval_every, device and
    progress) and return the graph to train on (:func:`model_graph`: ``data`` with masks from
    ``split``, float32 features). Arguments
    that the mode does not use (``chunks`` in ``single``, ``parts`` outside ``graph``, the
    cluster outside distributed modes) are not checked against the graph."""
    from gnnpipe.engine.chunked import Techniques

    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode: unknown mode {mode!r}; expected one of {MODES}")
    data = model_graph(model, data, split, scalars.get("seed", 0))
    _check_scalars(mode, **scalars)
    if plan is not None:
        check_plan(plan, model)
    Techniques.coerce(techniques)
    positive_int("parts_per_chunk", parts_per_chunk)
    _check_layout(model, data.num_nodes, mode, plan, stages, chunks, ways, parts, workers)
    if mode in DISTRIBUTED:
        from gnnpipe.runtime.cluster import check_cluster

        check_cluster(cluster)
    return data


def _check_scalars(mode: str, *, epochs: Any, lr: Any, weight_decay: Any, gnn_weight_decay: Any,
                   seed: Any, recompute: Any, background: Any, timeout: Any, eval_every: Any,
                   device: Any, progress: Any) -> None:
    positive_int("epochs", epochs)
    positive_int("eval_every", eval_every)
    positive_float("lr", lr)
    nonnegative_float("weight_decay", weight_decay)
    if gnn_weight_decay is not None:
        nonnegative_float("gnn_weight_decay", gnn_weight_decay)
    integer("seed", seed, 0)
    positive_float("timeout", timeout)
    for name, value in (("recompute", recompute), ("background", background),
                        ("progress", progress)):
        boolean(name, value)
    choice("device", device, DEVICES)
    if device == "cuda" and mode not in DISTRIBUTED and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' asked, but torch sees no GPU in this process")


def _check_layout(model: Any, n: int, mode: str, plan: Any, stages: Any, chunks: Any, ways: Any,
                  parts: Any, workers: Any) -> None:
    """Stages, chunks, ways, parts and workers against the model, the graph and each other."""
    given = chunks is not None
    if plan is None:
        positive_int("stages", stages)
    _, stages, chunks = split(plan, stages, chunks)
    if stages > len(model):
        raise ValueError(f"stages: {stages} stages need at least as many blocks, but the model has "
                         f"{len(model)} ({model.num_layers} GNN layers plus projections)")
    positive_int("ways", ways)
    if ways != 1 and mode != "hybrid":
        raise ValueError(f"ways: {ways} pipelines side by side is mode='hybrid'; mode={mode!r} "
                         "runs one")
    if mode in CHUNKED:
        positive_int("chunks", chunks)
        if chunks > n:
            raise ValueError(_too_many_chunks(chunks, n, plan is not None, given))
        if mode == "hybrid" and chunks % ways:
            raise ValueError(f"chunks: hybrid splits chunks evenly among ways; {chunks} chunks "
                             f"do not divide into {ways} ways")
    if mode == "graph":
        positive_int("parts", parts)
        if parts > n:
            raise ValueError(f"parts: {parts} partitions exceed the graph's {n} nodes")
    if workers is not None:
        positive_int("workers", workers)
        world = parts if mode == "graph" else stages * ways
        if mode in DISTRIBUTED and workers != world:
            what = "parts" if mode == "graph" else "ways x stages"
            raise ValueError(f"workers: {what} = {world} ranks, but workers={workers}; "
                             "one rank runs on each worker")


def _too_many_chunks(chunks: int, n: int, planned: bool, given: bool) -> str:
    if planned:
        return (f"chunks: the plan's {chunks} chunks exceed the graph's {n} nodes; was the plan "
                "made for another graph?")
    if given:
        return f"chunks: {chunks} chunks exceed the graph's {n} nodes"
    return (f"chunks: the default 4 x stages = {chunks} chunks exceed the graph's {n} nodes; "
            f"pass chunks= (at most {n})")


# --------------------------------------------------------------------------- checkpoints
def folder(name: str, value: Any) -> str:
    """A folder path (``str`` or ``os.PathLike``) that is not an existing file, made absolute."""
    import os

    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a folder path (str or os.PathLike), got {value!r}")
    path = os.fspath(value)
    if not path:
        raise ValueError(f"{name}: expected a folder path, got an empty string")
    if os.path.isfile(path):
        raise ValueError(f"{name}: expected a folder, but {path!r} is a file")
    return os.path.abspath(path)  # ranks on workers with another working directory see it too


def check_recovery(model: Any, mode: str, epochs: int, *, checkpoint: Any, checkpoint_every: Any,
                   resume: Any, restarts: Any) -> Any:
    """Check ``gp.train``'s ``checkpoint``, ``checkpoint_every``, ``resume`` and ``restarts``
    (after :func:`check_train`) and return the :class:`~gnnpipe.checkpoint.Recovery`: the
    resumed folder must hold a complete checkpoint of this model with epochs left to train, and
    a checkpoint folder must not hold another run's checkpoints unless it is the one resumed."""
    from gnnpipe import checkpoint as ckpt

    root = None if checkpoint is None else folder("checkpoint", checkpoint)
    every = positive_int("checkpoint_every", checkpoint_every)
    restarts = integer("restarts", restarts, 0)
    if restarts and mode not in DISTRIBUTED:
        raise ValueError(f"restarts: only distributed modes restart ranks; mode={mode!r} runs in "
                         "this process (resume= continues it after a failure)")
    if restarts and root is None:
        raise ValueError("restarts: a restart continues from the newest checkpoint; give "
                         "checkpoint=FOLDER too")
    manifest = None
    if resume is not None:
        resumed = folder("resume", resume)
        manifest = ckpt.latest(resumed)
        if manifest is None:
            raise ValueError(f"resume: no complete checkpoint in {resumed!r} (expected "
                             "epoch-*/manifest.json with every shard it lists)")
        _same_model(model, manifest)
        if manifest.epoch >= epochs:
            raise ValueError(f"epochs: the checkpoint in {manifest.folder!r} has {manifest.epoch} "
                             f"epochs done; epochs={epochs} leaves none to train")
    if root is not None:
        stale = ckpt.latest(root)
        if stale is not None and (manifest is None or stale.folder != manifest.folder):
            raise ValueError(f"checkpoint: {root!r} already holds checkpoints of another run "
                             f"(newest: {stale.folder}); resume={root!r} continues it, or choose "
                             "an empty folder")
    return ckpt.Recovery(root, every, restarts, manifest)


def _same_model(model: Any, manifest: Any) -> None:
    from gnnpipe.checkpoint import param_shapes

    mine, theirs = param_shapes(model), manifest.params
    if mine != theirs:
        differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise ValueError(f"resume: the checkpoint in {manifest.folder!r} is of another model "
                         f"(parameters differ: {differ[:5]})")
