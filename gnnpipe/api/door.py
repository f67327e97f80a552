"""The API door: ``gp.train``'s arguments checked once and parsed into a
:class:`~gnnpipe.core.job.TrainConfig`.

Every error names the argument: ``name: expected X, got Y``. A value of the wrong kind (a
string where a number is due) raises ``TypeError``; a number of the wrong form or range (``2.5``
epochs, ``lr=inf``) raises ``ValueError``. :func:`parse_train` runs before ``gp.train`` chunks
the graph or contacts any Dask cluster; below it nothing is checked or defaulted again.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import torch

from gnnpipe import checkpoint as ckpt
from gnnpipe.core.checks import (
    boolean,
    choice,
    folder,
    integer,
    nonnegative_float,
    positive_float,
    positive_int,
)
from gnnpipe.core.job import TrainConfig
from gnnpipe.core.kinds import Mode, Precision, TrainSchedule
from gnnpipe.core.prediction import Prediction
from gnnpipe.core.techniques import Techniques
from gnnpipe.datasets.fit import model_graph
from gnnpipe.engine.local import stage_ranges
from gnnpipe.engine.state import param_shapes
from gnnpipe.nn import LayerStack, check_stack
from gnnpipe.plan import Plan
from gnnpipe.pyg import default_techniques
from gnnpipe.runtime.cluster import check_cluster

__all__ = ["DEVICES", "LAYOUT_DEFAULTS", "MODES", "Admitted", "block_structure", "check_plan",
           "check_recovery", "parse_train", "resolve_layout"]

MODES = tuple(m.value for m in Mode)
DEVICES = ("cpu", "cuda")


class Admitted(NamedTuple):
    """What passes the door: the job, the graph to train on (masks from ``split``, float32
    features), how it checkpoints, resumes and restarts, and what a plan predicted for it."""

    job: TrainConfig
    data: Any
    recovery: ckpt.Recovery
    prediction: Prediction | None = None


#: ``gp.train``'s layout arguments that a plan sets, with their defaults without one.
LAYOUT_DEFAULTS: dict[str, Any] = {"stages": 1, "chunks": None, "ways": 1, "parts": 2,
                                   "recompute": False, "history_dtype": "float32",
                                   "wire_dtype": "float32", "schedule": "gnnpipe"}


def resolve_layout(plan: Plan | None, mode: Any, given: dict[str, Any]) -> tuple[Any, dict]:
    """The mode and layout arguments to train: without a plan, ``mode`` (``"single"`` if None)
    and ``given`` with the defaults where it holds None; with one, the plan's mode (``mode``
    may name it, or ``"local"`` for a pipeline plan: the same math in one process) and layout,
    refusing an argument given that the plan sets otherwise."""
    if plan is None:
        return ("single" if mode is None else mode,
                {k: LAYOUT_DEFAULTS[k] if v is None else v for k, v in given.items()})
    if not isinstance(plan, Plan):
        raise TypeError(f"plan: expected a gp.Plan from gp.plan(...), got {type(plan).__name__}")
    planned = plan.layout
    allowed = {planned.mode.value} | ({"local"} if planned.mode is Mode.PIPELINE else set())
    if mode is not None and str(mode) not in allowed:
        raise ValueError(f"mode: the plan is for mode {planned.mode.value!r} "
                         f"({planned.describe()}), got mode={mode!r}; leave mode out to train "
                         "the plan")
    values = {"stages": planned.stages, "chunks": planned.chunks, "ways": planned.ways,
              "parts": planned.parts, "recompute": planned.recompute,
              "history_dtype": planned.history_dtype.value,
              "wire_dtype": planned.wire_dtype.value, "schedule": planned.schedule.value}
    for name, value in given.items():
        if value is not None and str(_named(value)) != str(values[name]):
            raise ValueError(f"{name}: the plan sets {name}={values[name]!r} "
                             f"({planned.describe()}), got {value!r}; leave {name} out to "
                             "train the plan, or plan again")
    return planned.mode.value if mode is None else mode, values


def _named(value: Any) -> Any:
    """A dtype as its name (``torch.bfloat16`` -> ``bfloat16``), other values as they are."""
    return str(value).removeprefix("torch.") if isinstance(value, torch.dtype) else value


# --------------------------------------------------------------------------- plans
def block_structure(model: LayerStack) -> tuple[tuple[str, bool, int], ...]:
    """What a plan must agree on with the model: each block's type, aggregation and width."""
    return tuple((type(b).__name__, bool(b.aggregates), int(b.out_dim)) for b in model.blocks)


def check_plan(plan: Any, model: LayerStack, num_nodes: int) -> None:
    """``plan`` is a ``gp.Plan`` made for a model with ``model``'s block structure, on a graph
    of ``num_nodes`` nodes (its predictions are that graph's)."""
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
    if plan.profile.num_nodes != num_nodes:
        raise ValueError(f"plan: it was made for a graph of {plan.profile.num_nodes:,} nodes, "
                         f"got one of {num_nodes:,}; plan for this graph (its layout, memory and "
                         "epoch were predicted for that one)")


# --------------------------------------------------------------------------- gp.train
def parse_train(model: LayerStack, data: Any, mode: Any, *, plan: Any, stages: Any, chunks: Any,
                parts_per_chunk: Any, ways: Any, parts: Any, workers: Any, cluster: Any,
                techniques: Any, split: Any, checkpoint: Any, checkpoint_every: Any,
                resume: Any, restarts: Any, background: Any, progress: Any,
                **scalars: Any) -> Admitted:
    """Check every argument of ``gp.train`` (same names; ``scalars`` are the epochs, lr,
    weight_decay, gnn_weight_decay, seed, recompute, history_dtype, wire_dtype, schedule, timeout,
    eval_every and device) and parse
    them into the job. Arguments that the mode does not use (``chunks`` in ``single``, ``parts``
    outside ``graph``, the cluster outside distributed modes) are not checked against the
    graph."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode: unknown mode {mode!r}; expected one of {MODES}")
    mode = Mode(mode)
    data = model_graph(check_stack(model), data, split, scalars.get("seed", 0))
    scalars = _check_scalars(mode, **scalars)
    for name, value in (("background", background), ("progress", progress)):
        boolean(name, value)
    if plan is not None:
        check_plan(plan, model, data.num_nodes)
    tech = Techniques.coerce(techniques) if techniques is not None else default_techniques(model)
    _check_schedule(mode, scalars["schedule"], tech)
    positive_int("parts_per_chunk", parts_per_chunk)
    stages, ranges, chunks = _layout(model, data.num_nodes, mode, plan, stages, chunks, ways,
                                     parts, workers)
    if mode.distributed:
        check_cluster(cluster)
    recovery = check_recovery(model, mode, scalars["epochs"], checkpoint=checkpoint,
                              checkpoint_every=checkpoint_every, resume=resume, restarts=restarts)
    job = TrainConfig(
        mode=mode, model=model.name, layers=model.num_layers, stages=stages, ranges=ranges,
        chunks=chunks, parts_per_chunk=int(parts_per_chunk), ways=int(ways), parts=int(parts),
        techniques=tech, dataset=getattr(data, "name", None),
        checkpoint=recovery.root, checkpoint_every=recovery.every if recovery.root else None,
        restarts=recovery.restarts,
        resume=recovery.resume.folder if recovery.resume is not None else None, **scalars)
    return Admitted(job, data, recovery, None if plan is None else plan.prediction)


def _check_scalars(mode: Mode, *, epochs: Any, lr: Any, weight_decay: Any, gnn_weight_decay: Any,
                   seed: Any, recompute: Any, history_dtype: Any, wire_dtype: Any, schedule: Any,
                   timeout: Any, eval_every: Any, device: Any) -> dict[str, Any]:
    """The scalar arguments checked, as the job holds them (ints, floats, bools)."""
    out = {"epochs": positive_int("epochs", epochs),
           "eval_every": positive_int("eval_every", eval_every),
           "lr": positive_float("lr", lr),
           "weight_decay": nonnegative_float("weight_decay", weight_decay),
           "gnn_weight_decay": None if gnn_weight_decay is None else nonnegative_float(
               "gnn_weight_decay", gnn_weight_decay),
           "seed": integer("seed", seed, 0), "timeout": positive_float("timeout", timeout),
           "recompute": boolean("recompute", recompute), "device": choice("device", device,
                                                                          DEVICES),
           "history_dtype": Precision.of("history_dtype", history_dtype),
           "wire_dtype": Precision.of("wire_dtype", wire_dtype),
           "schedule": TrainSchedule.parse("schedule", schedule)}
    if device == "cuda" and not mode.distributed and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' asked, but torch sees no GPU in this process")
    return out


def _check_schedule(mode: Mode, schedule: TrainSchedule, techniques: Techniques) -> None:
    """``1f1b`` is an order of the chunked epoch in ``local`` and ``pipeline``, and needs its
    own ``dZbuf`` (a backward begins before the epoch's last forward)."""
    if schedule is TrainSchedule.GNNPIPE:
        return
    if mode not in (Mode.LOCAL, Mode.PIPELINE):
        raise ValueError(f"schedule: {schedule.value!r} orders the chunked epoch of mode 'local' "
                         f"or 'pipeline'; mode={mode.value!r} runs {TrainSchedule.GNNPIPE.value!r}")
    if techniques.grad_in_h:
        raise ValueError(f"schedule: {schedule.value!r} runs backwards before the epoch's last "
                         "forward, so dZbuf cannot live in Hbuf's memory as it does with the "
                         "snapshot and unbiased gradients both on; turn one of them off "
                         "(techniques={'unbiased_grad': False})")


def _layout(model: LayerStack, n: int, mode: Mode, plan: Plan | None, stages: Any, chunks: Any,
            ways: Any, parts: Any, workers: Any) -> tuple[int, tuple[tuple[int, int], ...], int]:
    """Stages, chunks, ways, parts and workers checked against the model, the graph and each
    other; the stages, their block ranges and the chunks resolved (a plan's replace ``stages``
    and ``chunks``; chunks default to ``4 × stages``)."""
    given = chunks is not None
    if plan is not None:
        ranges = tuple((int(a), int(b)) for a, b in plan.ranges)
        stages, chunks = len(ranges), plan.chunks
    else:
        stages = positive_int("stages", stages)
        chunks = 4 * stages if chunks is None else chunks
    if stages > len(model):
        raise ValueError(f"stages: {stages} stages need at least as many blocks, but the model has "
                         f"{len(model)} ({model.num_layers} GNN layers plus projections)")
    positive_int("ways", ways)
    if ways != 1 and mode is not Mode.HYBRID:
        raise ValueError(f"ways: {ways} pipelines side by side is mode='hybrid'; "
                         f"mode={mode.value!r} runs one")
    if mode.chunked:
        _check_chunks(mode, chunks, n, ways, plan is not None, given)
    if mode is Mode.GRAPH:
        positive_int("parts", parts)
        if parts > n:
            raise ValueError(f"parts: {parts} partitions exceed the graph's {n} nodes")
    if workers is not None:
        _check_workers(mode, workers, parts if mode is Mode.GRAPH else stages * ways)
    if plan is None:
        ranges = tuple(stage_ranges(model, stages))
    if mode is Mode.GRAPH:  # one rank holds every block of its partition
        stages, ranges = 1, ((0, len(model)),)
    return stages, ranges, 1 if mode is Mode.SINGLE else int(chunks)


def _check_chunks(mode: Mode, chunks: Any, n: int, ways: int, planned: bool, given: bool) -> None:
    positive_int("chunks", chunks)
    if chunks > n:
        raise ValueError(_too_many_chunks(chunks, n, planned, given))
    if mode is Mode.HYBRID and chunks % ways:
        raise ValueError(f"chunks: hybrid splits chunks evenly among ways; {chunks} chunks "
                         f"do not divide into {ways} ways")


def _check_workers(mode: Mode, workers: Any, world: int) -> None:
    positive_int("workers", workers)
    if mode.distributed and workers != world:
        what = "parts" if mode is Mode.GRAPH else "ways x stages"
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
def check_recovery(model: LayerStack, mode: Mode, epochs: int, *, checkpoint: Any,
                   checkpoint_every: Any, resume: Any, restarts: Any) -> ckpt.Recovery:
    """Check ``gp.train``'s ``checkpoint``, ``checkpoint_every``, ``resume`` and ``restarts``
    (after the other arguments) and return the :class:`~gnnpipe.checkpoint.Recovery`: the
    resumed folder must hold a complete checkpoint of this model with epochs left to train, and
    a checkpoint folder must not hold another run's checkpoints unless it is the one resumed."""
    root = None if checkpoint is None else folder("checkpoint", checkpoint)
    every = positive_int("checkpoint_every", checkpoint_every)
    restarts = integer("restarts", restarts, 0)
    if restarts and not mode.distributed:
        raise ValueError(f"restarts: only distributed modes restart ranks; mode={mode.value!r} runs in "
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


def _same_model(model: LayerStack, manifest: ckpt.Manifest) -> None:
    mine, theirs = param_shapes(model), manifest.params
    if mine != theirs:
        differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        raise ValueError(f"resume: the checkpoint in {manifest.folder!r} is of another model "
                         f"(parameters differ: {differ[:5]})")
