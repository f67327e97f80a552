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
                  "mode": "single", "stages": 1, "ways": 1, "parts": 2}
#: The modes each mode-specific train flag applies to.
APPLIES = {"stages": ("local", "pipeline", "hybrid"), "chunks": ("local", "pipeline", "hybrid"),
           "parts_per_chunk": ("local", "pipeline", "hybrid"),
           "ways": ("hybrid",), "parts": ("graph",), "scheduler": DISTRIBUTED,
           "dashboard": DISTRIBUTED}

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


def _check_mode_flags(args: argparse.Namespace) -> None:
    """Refuse flags the chosen mode (or ``--plan``) does not use; then fill the defaults."""
    if args.plan is not None:
        for flag in ("stages", "chunks"):
            if getattr(args, flag) is not None:
                raise CliError(f"--{flag}: --plan sets the stages and chunks; drop one of them")
        if args.mode not in (None, "pipeline"):
            raise CliError(f"--mode: --plan trains mode pipeline, got --mode {args.mode}")
        args.mode = "pipeline"
    mode = args.mode or TRAIN_DEFAULTS["mode"]
    for flag, modes in APPLIES.items():
        value = getattr(args, flag)
        if value is not None and value is not False and mode not in modes:
            raise CliError(f"--{flag.replace('_', '-')}: does not apply to --mode {mode} (only to "
                           f"{', '.join(modes)})")
    for flag, value in TRAIN_DEFAULTS.items():
        if getattr(args, flag) is None and flag not in ("dataset", "model", "layers", "hidden"):
            setattr(args, flag, value)


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
    for flag in ("dataset", "model", "layers", "hidden"):
        given, planned = getattr(args, flag), plan.made_for.get(flag)
        if given is None:
            setattr(args, flag, planned)
        elif planned is not None and given != planned:
            raise CliError(f"--{flag}: {path} is a plan for {flag} {planned}, not {given}; "
                           f"make one with gnnpipe plan --{flag} {given} --out ...")
    return plan


def run_train(args: argparse.Namespace) -> int:
    _check_mode_flags(args)
    plan = _read_plan(args) if args.plan is not None else None
    for flag in ("dataset", "model", "layers", "hidden"):
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
                wire_dtype=args.wire_dtype, checkpoint=checkpoint,
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


def run_plan(args: argparse.Namespace) -> int:
    out = writable_file(args.out, "--out") if args.out is not None else None
    import torch

    import gnnpipe as gp
    from gnnpipe.engine.local import stage_ranges
    from gnnpipe.plan import plan as make_plan  # gp.plan, which a checker takes for the package

    torch.set_num_threads(1)
    data = _load_data(args.dataset)
    model = _build_model(args, data)
    with gp.Cluster(n_workers=args.workers, threads_per_worker=args.threads) as cluster:
        plan = make_plan(model, data, workers=args.workers, memory_limit=args.memory_limit,
                         bandwidth=args.bandwidth, seed=args.seed, repeats=args.repeats,
                         cluster=cluster)
    made_for = {flag: getattr(args, flag) for flag in ("dataset", "model", "layers", "hidden")}
    plan = dataclasses.replace(plan, made_for=made_for)
    print(plan)
    uniform = plan.predict(stage_ranges(len(model), args.workers))
    print(f"uniform split, same chunks: predicted epoch {uniform.makespan():.4g} s")
    given = " ".join(f"--{flag} {shlex.quote(str(value))}" for flag, value in made_for.items())
    if out is None:
        print(f"to train this split, write it with --out plan.json, then run:\n"
              f"  gnnpipe train --plan plan.json {given}")
        return 0
    partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    os.replace(plan.to_json(partial), out)
    print(f"plan written to {out}; train this split with:\n"
          f"  gnnpipe train --plan {shlex.quote(str(out))} {given}")
    return 0


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


