"""What each `gnnpipe` subcommand does, once its command line is parsed."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from gnnpipe.cli.args import (
    DISTRIBUTED,
    CliError,
    writable_file,
    writable_folder,
)
from gnnpipe.cli.runs import finish

__all__ = [
    "APPLIES",
    "TRAIN_DEFAULTS",
    "dashboard_plugin",
    "plugins",
    "run_demo",
    "run_plan",
    "run_simulate",
    "run_train",
]

logger = logging.getLogger(__name__)

#: Defaults of the train flags that are ``None`` until parsed, to tell whether they were given.
TRAIN_DEFAULTS = {"dataset": "cora", "model": "gcnii", "layers": 32, "hidden": 64,
                  "mode": "single", "stages": 1, "ways": 1, "parts": 2, "recompute": False,
                  "history_dtype": "float32", "wire_dtype": "float32", "schedule": "gnnpipe"}
#: The modes each mode-specific train flag applies to.
APPLIES = {"stages": ("local", "pipeline", "hybrid"), "chunks": ("local", "pipeline", "hybrid"),
           "parts_per_chunk": ("local", "pipeline", "hybrid"),
           "ways": ("hybrid",), "parts": ("graph",), "schedule": ("local", "pipeline"),
           "scheduler": DISTRIBUTED, "dashboard": DISTRIBUTED}
#: The train flags a plan sets (its layout's fields of the same names); given with --plan, they
#: must repeat the plan's values.
PLANNED = ("stages", "chunks", "ways", "parts", "recompute", "history_dtype", "wire_dtype",
           "schedule")
#: What the run is made for: train takes them from a plan, plan records them in it.
MADE_FOR = ("dataset", "model", "layers", "hidden")

def _load_data(spec: str) -> Any:
    """``cora``/``citeseer``/``pubmed`` or ``synthetic:NODES`` (as :func:`dataset_spec` writes)."""
    from gnnpipe import datasets

    name, _, nodes = spec.partition(":")
    if name == "synthetic":
        return datasets.synthetic(num_nodes=int(nodes), seed=0)
    return datasets.load(name)


def _build_model(args: argparse.Namespace, data: Any, dropout: float | None = None) -> Any:
    import torch

    from gnnpipe import nn as models

    torch.manual_seed(args.seed)
    extra = {"alpha": 0.1, "theta": 0.5} if args.model == "gcnii" else {}
    return models.build(args.model, data.num_features, int(data.y.max()) + 1, args.layers,
                        hidden=args.hidden, dropout=dropout, **extra)


def _option(flag: str) -> str:
    return f"--{flag.replace('_', '-')}"


def _check_mode_flags(args: argparse.Namespace, planned: bool = False) -> None:
    """Refuse flags the chosen mode does not use; then fill the defaults (but the layout flags
    of a ``planned`` run, which the plan sets)."""
    mode = args.mode or TRAIN_DEFAULTS["mode"]
    for flag, modes in APPLIES.items():
        value = getattr(args, flag)
        if value is not None and value is not False and mode not in modes:
            raise CliError(f"{_option(flag)}: does not apply to --mode {mode} (only to "
                           f"{', '.join(modes)})")
    for flag, value in TRAIN_DEFAULTS.items():
        if getattr(args, flag) is None and flag not in MADE_FOR and not (
                planned and flag in PLANNED):
            setattr(args, flag, value)


def _fit_plan(args: argparse.Namespace, plan: Any) -> None:
    """Set the mode to the plan's, and refuse a --mode or layout flag that the plan sets
    otherwise (``--mode local`` runs a pipeline plan in this process, the same math)."""
    layout, path = plan.layout, args.plan
    mode = layout.mode.value
    allowed = (mode, "local") if mode == "pipeline" else (mode,)
    if args.mode is not None and args.mode not in allowed:
        modes = "pipeline" if args.mode == "local" else args.mode  # local trains pipeline plans
        raise CliError(f"--mode: {path} is a plan for mode {mode} ({layout.describe()}), not "
                       f"{args.mode}; leave --mode out to train it, or plan again with "
                       f"gnnpipe plan --modes {modes} --out ...")
    args.mode = args.mode or mode
    values = {"stages": layout.stages, "chunks": layout.chunks, "ways": layout.ways,
              "parts": layout.parts, "recompute": layout.recompute,
              "history_dtype": layout.history_dtype.value,
              "wire_dtype": layout.wire_dtype.value, "schedule": layout.schedule.value}
    for flag in PLANNED:
        given = getattr(args, flag)
        if given is None:
            continue
        if flag in APPLIES and args.mode not in APPLIES[flag]:
            raise CliError(f"{_option(flag)}: {path} is a plan for mode {mode} "
                           f"({layout.describe()}), where {_option(flag)} does not apply; "
                           f"drop it")
        if given != values[flag]:
            shown = "on" if values[flag] is True else "off" if values[flag] is False else (
                values[flag])
            raise CliError(f"{_option(flag)}: {path} plans {layout.describe()} with "
                           f"{_option(flag)} {shown}, not {'on' if given is True else given}; "
                           f"drop {_option(flag)} to train the plan, or plan again")


def _read_plan(args: argparse.Namespace) -> Any:
    """The ``--plan`` file; fills --dataset/--model/--layers/--hidden from it and refuses ones
    given for something else."""
    from gnnpipe.plan import Plan

    path = Path(args.plan)
    if not path.is_file():
        raise CliError(f"--plan: no plan file at {path}")
    try:
        plan = Plan.from_json(path)
    except ValueError as err:
        raise CliError(f"--plan: {path} is not a usable plan ({err})") from None
    for flag in MADE_FOR:
        given, planned = getattr(args, flag), plan.made_for.get(flag)
        if given is None:
            setattr(args, flag, planned)
        elif planned is not None and given != planned:
            raise CliError(f"--{flag}: {path} is a plan for {flag} {planned}, not {given}; "
                           f"make one with gnnpipe plan --{flag} {given} --out ...")
    return plan


def run_train(args: argparse.Namespace) -> int:
    plan = _read_plan(args) if args.plan is not None else None
    if plan is not None:
        _fit_plan(args, plan)
    _check_mode_flags(args, planned=plan is not None)
    for flag in MADE_FOR:
        if getattr(args, flag) is None:
            setattr(args, flag, TRAIN_DEFAULTS[flag])
    out = writable_folder(args.out, "--out")
    checkpoint = writable_folder(args.checkpoint, "--checkpoint") if args.checkpoint else None
    if args.resume is not None and not Path(args.resume).is_dir():
        raise CliError(f"--resume: no checkpoint folder at {args.resume}")
    viewer = dashboard_plugin() if args.dashboard else None
    if args.dashboard and viewer is None:
        raise CliError("--dashboard: the dashboard is not installed (pip install gnnpipe)")
    import torch

    from gnnpipe.api.train import train

    if args.threads:
        torch.set_num_threads(args.threads)
    data = _load_data(args.dataset)
    model = _build_model(args, data, args.dropout)
    distributed = args.mode in DISTRIBUTED
    run = train(model, data, args.mode, epochs=args.epochs, lr=args.lr,
                weight_decay=args.weight_decay, gnn_weight_decay=args.gnn_weight_decay,
                seed=args.seed, stages=args.stages, chunks=args.chunks, ways=args.ways,
                parts=args.parts, cluster=args.scheduler, eval_every=args.eval_every,
                device=args.device, plan=plan, background=distributed,
                recompute=args.recompute, history_dtype=args.history_dtype,
                wire_dtype=args.wire_dtype, schedule=args.schedule, checkpoint=checkpoint,
                checkpoint_every=args.checkpoint_every, resume=args.resume,
                restarts=args.restarts, progress=sys.stderr.isatty(),
                **({} if args.parts_per_chunk is None else
                   {"parts_per_chunk": args.parts_per_chunk}))
    server = None
    if viewer is not None:
        server, url = viewer.serve_run(run)
        print(f"dashboard at {url}", flush=True)
    try:
        folder = finish(run, out, args.mode, progress=sys.stderr.isatty())
        if viewer is not None:
            print(f"dashboard snapshot: {viewer.snapshot(run, folder)}")
    finally:
        if server is not None:
            server.stop()
    print(run.summary().to_string(index=False))
    print(f"results in {folder}/ (history.csv, trace.json for Perfetto, config.json)")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    """GCNII on Cora and on a larger synthetic graph: single vs a 2-stage pipeline vs graph
    parallelism on one 2-worker Dask cluster (:mod:`gnnpipe.cli.demo`)."""
    from gnnpipe.cli import demo

    return demo.run(args, dashboard_plugin())


def run_simulate(args: argparse.Namespace) -> int:
    import gnnpipe as gp

    trace = writable_file(args.trace, "--trace")
    builders = {"gnnpipe": gp.schedule.gnnpipe, "gpipe": gp.schedule.gpipe,
                "1f1b": gp.schedule.one_f_one_b}
    sched = builders[args.schedule](args.stages, args.chunks)
    costs = {"forward": args.forward, "backward": args.backward}
    timeline = gp.simulate(sched, costs, comm=args.comm or None)
    print(sched)
    print(f"\nmakespan {timeline.makespan():.4g} s, bubble fraction {timeline.bubble_fraction():.4f}"
          f" (equal-cost formula (S-1)/(C+S-1) = "
          f"{(args.stages - 1) / (args.chunks + args.stages - 1):.4f})")
    print(f"peak chunks in flight per rank: {timeline.peak_inflight().tolist()}")
    path = timeline.to_chrome_trace(trace)
    print(f"trace written to {path} (open in https://ui.perfetto.dev)")
    return 0


#: The columns of the candidate table ``gnnpipe plan`` prints (all are in the plan file).
PLAN_COLUMNS = ("layout", "epoch_time", "peak_bytes", "comm_bytes", "fits", "reason")
#: Candidate rows ``gnnpipe plan`` prints, best first.
PLAN_ROWS = 12


def _check_layouts(args: argparse.Namespace, blocks: int) -> None:
    """Refuse --modes (and --schedules) that give no layout on --workers workers."""
    from gnnpipe.core.kinds import Mode, TrainSchedule
    from gnnpipe.plan.layout import PLANNED_MODES, layouts

    modes = PLANNED_MODES if args.modes is None else tuple(Mode(m) for m in args.modes)
    schedules = [TrainSchedule(s) for s in args.schedules or ("gnnpipe",)]
    if next(layouts(args.workers, blocks, modes, args.compact, schedules), None) is None:
        raise CliError(f"--modes: {','.join(m.value for m in modes)} has no layout on "
                       f"{args.workers} worker(s) (pipeline and graph need 2 or more, hybrid 4); "
                       "give more --workers or other --modes")


def _layout_line(plan: Any) -> str:
    """The chosen layout as ``gnnpipe train``'s flags set it (options at their defaults left
    out), and its split."""
    layout = plan.layout
    flags = []
    for name, value in layout.train_options().items():
        if value is True:
            flags.append(_option(name))
        elif value is not False and not (name in ("history_dtype", "wire_dtype", "schedule")
                                         and value == TRAIN_DEFAULTS[name]):
            flags.append(f"{_option(name)} {value}")
    split = (f"; stage ranges (blocks) {[list(r) for r in layout.ranges]}"
             if layout.mode.staged else "")
    return f"chosen layout: {layout.describe()}: {' '.join(flags)}{split}"


def _candidates(plan: Any) -> str:
    """The best :data:`PLAN_ROWS` rows of the candidate table, bytes readable."""
    from gnnpipe.core.units import format_bytes

    table = plan.table()
    shown = table.loc[:, list(PLAN_COLUMNS)].head(PLAN_ROWS).copy()
    shown["epoch_time"] = [f"{t:.4g} s" for t in shown["epoch_time"]]
    for column in ("peak_bytes", "comm_bytes"):
        shown[column] = [format_bytes(b) for b in shown[column]]
    more = len(table) - len(shown)
    head = (f"candidates, best first ({len(table)} weighed"
            + (f"; the best {len(shown)} shown, every one in the plan file)" if more else ")"))
    left = {c: _left(shown[c]) for c in ("layout", "reason")}
    return head + ":\n" + shown.to_string(index=False, justify="left", formatters=left)


def _left(column: Any) -> Any:
    """A formatter that left-aligns ``column``'s text."""
    width = max(len(str(v)) for v in column)
    return lambda v: f"{v!s:<{width}}"


def run_plan(args: argparse.Namespace) -> int:
    out = writable_file(args.out, "--out") if args.out is not None else None
    import torch

    import gnnpipe as gp
    from gnnpipe.engine.local import stage_ranges
    from gnnpipe.plan import plan as make_plan  # gp.plan, which a checker takes for the package

    torch.set_num_threads(1)
    data = _load_data(args.dataset)
    model = _build_model(args, data)
    _check_layouts(args, len(model))
    options = {"workers": args.workers, "memory_limit": args.memory_limit,
               "bandwidth": args.bandwidth, "modes": args.modes, "chunks": args.chunks,
               "compact": args.compact, "schedules": args.schedules, "seed": args.seed,
               "repeats": args.repeats, "headroom": args.headroom}
    if args.threads == 1:  # gp.plan starts its 1-thread workers after checking its arguments
        plan = make_plan(model, data, **options)
    else:
        workers = min(args.workers, len(model))  # the workers gp.plan profiles on
        with gp.Cluster(n_workers=workers, threads_per_worker=args.threads) as cluster:
            plan = make_plan(model, data, cluster=cluster, **options)
    made_for = {flag: getattr(args, flag) for flag in MADE_FOR}
    plan = dataclasses.replace(plan, made_for=made_for)
    print(_layout_line(plan))
    print(plan)
    print()
    print(_candidates(plan))
    layout = plan.layout
    if layout.mode.staged:
        uniform = plan.predict(stage_ranges(model, layout.stages))
        print(f"\neven split, same chunks: predicted epoch {uniform.makespan():.4g} s "
              f"(this split: {plan.epoch_time:.4g} s)")
    if out is not None:
        partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(plan.to_json(partial), out)
    print(f"\n{_how_to_train(plan, out)}")
    return 0


def _how_to_train(plan: Any, out: Path | None) -> str:
    """The hint ``gnnpipe plan`` ends with: the train command line that runs the plan."""
    layout = plan.layout
    path = shlex.quote(str(out)) if out is not None else "plan.json"
    what = f"{layout.describe()}, on the dataset and model it was made for"
    local = (f"\n(or in this one process, the same math: gnnpipe train --plan {path} --mode "
             "local)" if layout.mode.value == "pipeline" else "")
    head = (f"plan written to {out}; train it ({what}) with:" if out is not None else
            f"to train this plan ({what}), write it with --out plan.json, then run:")
    return f"{head}\n  gnnpipe train --plan {path}{local}"


def plugins() -> list[Any]:
    """Modules registered under the ``gnnpipe.cli`` entry point (the dashboard is one)."""
    from importlib.metadata import entry_points

    modules = []
    for ep in entry_points(group="gnnpipe.cli"):
        try:
            modules.append(ep.load())
        except ImportError as err:  # an optional part that is not installed
            logger.warning("gnnpipe.cli plugin %s unavailable: %s", ep.name, err)
    return modules


def dashboard_plugin() -> Any:
    """The plugin that serves dashboards, if installed."""
    return next((m for m in plugins() if hasattr(m, "serve_run")), None)


