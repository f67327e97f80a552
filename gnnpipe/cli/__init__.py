"""`gnnpipe` command line: train, demo, simulate, plan (and dashboard, when installed)."""

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
    DATASETS,
    DISTRIBUTED,
    MODELS,
    MODES,
    CliError,
    Parser,
    bandwidth,
    byte_size,
    dataset_spec,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    probability,
    writable_file,
    writable_folder,
)
from gnnpipe.cli.runs import RunFailed, finish

__all__ = ["APPLIES", "DATASET_HELP", "TRAIN_DEFAULTS", "build_parser", "main"]

logger = logging.getLogger(__name__)

#: Defaults of the train flags that are ``None`` until parsed, to tell whether they were given.
TRAIN_DEFAULTS = {"dataset": "cora", "model": "gcnii", "layers": 32, "hidden": 64,
                  "mode": "single", "stages": 1, "ways": 1, "parts": 2}
#: The modes each mode-specific train flag applies to.
APPLIES = {"stages": ("local", "pipeline", "hybrid"), "chunks": ("local", "pipeline", "hybrid"),
           "parts_per_chunk": ("local", "pipeline", "hybrid"),
           "ways": ("hybrid",), "parts": ("graph",), "scheduler": DISTRIBUTED,
           "dashboard": DISTRIBUTED}
DATASET_HELP = f"{', '.join(DATASETS)}, or synthetic:NODES (planted partition)"


def _default(flag: str) -> str:
    return f"(default: {TRAIN_DEFAULTS[flag]})"


def _add_model_args(p: argparse.ArgumentParser, tracked: bool) -> None:
    """--dataset, --model, --layers, --hidden; ``tracked``: default None, filled after checks."""
    def default(flag: str) -> Any:
        return None if tracked else TRAIN_DEFAULTS[flag]

    p.add_argument("--dataset", type=dataset_spec, default=default("dataset"),
                   help=f"{DATASET_HELP} {_default('dataset')}")
    p.add_argument("--model", choices=MODELS, default=default("model"),
                   help=f"model family {_default('model')}")
    p.add_argument("--layers", type=positive_int, default=default("layers"),
                   help=f"GNN layers {_default('layers')}")
    p.add_argument("--hidden", type=positive_int, default=default("hidden"),
                   help=f"hidden width {_default('hidden')}")


def _add_train_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p, tracked=True)
    p.add_argument("--plan", default=None,
                   help="a plan written by 'gnnpipe plan --out': train its stage split in mode "
                        "pipeline (default: none)")
    p.add_argument("--dropout", type=probability, default=None,
                   help="dropout rate (default: the model family's)")
    p.add_argument("--mode", choices=MODES, default=None, help=f"how to train {_default('mode')}")
    p.add_argument("--stages", type=positive_int, default=None,
                   help=f"local, pipeline, hybrid: pipeline stages {_default('stages')}")
    p.add_argument("--chunks", type=positive_int, default=None,
                   help="local, pipeline, hybrid: chunks per epoch (default: 4 x stages)")
    p.add_argument("--parts-per-chunk", type=positive_int, default=None,
                   help="local, pipeline, hybrid: METIS parts merged at random into each chunk "
                        "(default: 1, METIS's own parts; 4: the GNNPipe paper's merge)")
    p.add_argument("--ways", type=positive_int, default=None,
                   help=f"hybrid: pipelines side by side {_default('ways')}")
    p.add_argument("--parts", type=positive_int, default=None,
                   help=f"graph: partitions, one rank each {_default('parts')}")
    p.add_argument("--scheduler", default=None,
                   help="distributed modes: Dask scheduler address (tcp://host:8786) "
                        "(default: a local cluster)")
    p.add_argument("--epochs", type=positive_int, default=200, help="training epochs")
    p.add_argument("--lr", type=positive_float, default=0.01, help="Adam learning rate")
    p.add_argument("--weight-decay", type=nonneg_float, default=5e-4, help="L2 penalty")
    p.add_argument("--gnn-weight-decay", type=nonneg_float, default=None,
                   help="weight decay of the GNN layers (default: --weight-decay)")
    p.add_argument("--seed", type=nonneg_int, default=0, help="seeds weights, chunks, dropout")
    p.add_argument("--eval-every", type=positive_int, default=1,
                   help="evaluate after every N-th epoch and the last")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: train on GPUs (distributed ranks: one per worker, NCCL)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads (default: torch's)")
    p.add_argument("--out", default="runs", help="folder for the run folders")
    p.add_argument("--dashboard", action="store_true",
                   help="distributed modes: serve the live dashboard on localhost while training")


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


def _train(args: argparse.Namespace) -> int:
    _check_mode_flags(args)
    plan = _read_plan(args) if args.plan is not None else None
    for flag in ("dataset", "model", "layers", "hidden"):
        if getattr(args, flag) is None:
            setattr(args, flag, TRAIN_DEFAULTS[flag])
    out = writable_folder(args.out, "--out")
    viewer = _viewer() if args.dashboard else None
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
                **({} if args.parts_per_chunk is None else
                   {"parts_per_chunk": args.parts_per_chunk}))
    server = None
    if viewer is not None:
        server, url = viewer.serve_run(run)
        print(f"dashboard at {url}", flush=True)
    try:
        folder = finish(run, out, args.mode)
        if viewer is not None:
            print(f"dashboard snapshot: {viewer.snapshot(run, folder)}")
    finally:
        if server is not None:
            server.stop()
    print(run.summary().to_string(index=False))
    print(f"results in {folder}/ (history.csv, trace.json for Perfetto, config.json)")
    return 0


def _demo(args: argparse.Namespace) -> int:
    """GCNII on Cora: a 2-stage GNNPipe pipeline on a local 2-worker Dask cluster, beside the
    exact single-process reference and graph parallelism on the same cluster."""
    import pandas as pd
    import torch

    import gnnpipe as gp

    out = writable_folder(args.out, "--out")
    torch.set_num_threads(1)
    viewer = _viewer()
    data = gp.datasets.load("cora")
    rows = []
    with gp.Cluster(n_workers=2) as cluster:
        print(f"started {cluster}")
        for mode, kw in (("single", {}), ("pipeline", {"stages": 2, "chunks": 8}),
                         ("graph", {"parts": 2})):
            torch.manual_seed(0)
            model = gp.models.gcnii(data.num_features, hidden=64, out_dim=7, layers=args.layers,
                                    alpha=0.1, theta=0.5, dropout=0.6)
            live = mode == "pipeline" and viewer is not None
            run = gp.train(model, data, mode, epochs=args.epochs, lr=0.01, weight_decay=5e-4,
                           gnn_weight_decay=0.01, seed=0, cluster=cluster, background=live, **kw)
            if live:
                server, url = viewer.serve_run(run)
                print(f"live dashboard of the pipeline run: {url}", flush=True)
            folder = finish(run, out, f"demo-{mode}")
            if live:
                server.stop()
                print(f"dashboard snapshot: {viewer.snapshot(run, folder)}")
            predicted = gp.comm_volume(model, data, mode, stages=kw.get("stages", 1),
                                       parts=kw.get("parts", 1))
            rows.append(run.summary().assign(predicted_bytes_per_epoch=predicted,
                                             folder=str(folder)))
    table = pd.concat(rows, ignore_index=True)
    print(f"\nCora, GCNII-{args.layers}, {args.epochs} epochs, 2 Dask workers")
    print(table.drop(columns="folder").to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    pipe, graph = table.set_index("mode").loc[["pipeline", "graph"], "comm_bytes_per_epoch"]
    print(f"\ngraph-parallel bytes / pipeline bytes = {graph / pipe:.2f}")
    print("runs written to:\n  " + "\n  ".join(table["folder"]))
    print("open a trace.json in https://ui.perfetto.dev to see the stage timeline")
    return 0


def _simulate(args: argparse.Namespace) -> int:
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


def _plan(args: argparse.Namespace) -> int:
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


def _plugins() -> list[Any]:
    """Modules registered under the ``gnnpipe.cli`` entry point (the dashboard is one)."""
    from importlib.metadata import entry_points

    modules = []
    for ep in entry_points(group="gnnpipe.cli"):
        try:
            modules.append(ep.load())
        except ImportError as err:  # an optional part that is not installed
            logger.warning("gnnpipe.cli plugin %s unavailable: %s", ep.name, err)
    return modules


def _viewer() -> Any:
    """The plugin that serves dashboards, if installed."""
    return next((m for m in _plugins() if hasattr(m, "serve_run")), None)


def _add_simulate(sub: Any) -> None:
    sim = sub.add_parser("simulate", help="simulate a pipeline schedule and write a trace")
    sim.add_argument("--schedule", default="gnnpipe", choices=["gnnpipe", "gpipe", "1f1b"],
                     help="pipeline schedule")
    sim.add_argument("--stages", type=positive_int, default=4, help="pipeline stages")
    sim.add_argument("--chunks", type=positive_int, default=16, help="chunks per epoch")
    sim.add_argument("--forward", type=positive_float, default=1.0, help="seconds per forward op")
    sim.add_argument("--backward", type=positive_float, default=2.0,
                     help="seconds per backward op")
    sim.add_argument("--comm", type=nonneg_float, default=0.0,
                     help="seconds per stage-to-stage transfer")
    sim.add_argument("--trace", default="schedule_trace.json", help="Chrome trace file to write")
    sim.set_defaults(func=_simulate)


def _add_plan(sub: Any) -> None:
    plan = sub.add_parser("plan", help="profile a model and choose stage boundaries and chunks")
    _add_model_args(plan, tracked=False)
    plan.add_argument("--workers", type=positive_int, default=2,
                      help="pipeline stages, one worker each")
    plan.add_argument("--memory-limit", type=byte_size, default=None,
                      help="bytes per stage, e.g. 8GB or 512MiB (default: no limit)")
    plan.add_argument("--bandwidth", type=bandwidth, default=None,
                      help="stage-to-stage bytes/s, e.g. 1GB/s (default: 1GB/s)")
    plan.add_argument("--repeats", type=positive_int, default=3,
                      help="profiled epochs at each of two chunk counts (medians)")
    plan.add_argument("--threads", type=positive_int, default=1,
                      help="torch threads of each profiling worker (gnnpipe train's ranks use 1)")
    plan.add_argument("--seed", type=nonneg_int, default=0, help="seeds weights and chunks")
    plan.add_argument("--out", default=None,
                      help="write the plan as JSON here, for 'gnnpipe train --plan' "
                           "(default: not written)")
    plan.set_defaults(func=_plan)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (plugins' too); imports no torch."""
    parser = Parser(prog="gnnpipe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a model and write a new run folder under --out")
    _add_train_args(train)
    train.set_defaults(func=_train)

    demo = sub.add_parser("demo", help="Cora GCNII-32: single vs 2-stage pipeline vs graph, live dashboard")
    demo.add_argument("--epochs", type=positive_int, default=200, help="training epochs")
    demo.add_argument("--layers", type=positive_int, default=32, help="GNN layers")
    demo.add_argument("--out", default="runs", help="folder for the run folders")
    demo.set_defaults(func=_demo)
    _add_simulate(sub)
    _add_plan(sub)
    for plugin in _plugins():
        plugin.register(sub)
    return parser


def _fail(parser: argparse.ArgumentParser, args: argparse.Namespace, err: BaseException) -> None:
    message = " ".join(str(err).split())
    print(f"{parser.prog} {args.command}: error: {message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; errors are one line on stderr (exit 2 for a bad command line, 1 for
    a run that failed)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, or a one-line argparse error
        return stop.code if isinstance(stop.code, int) else 2
    if args.command in ("train", "demo"):
        # before the root handler: then Dask keeps its own log handler, which gp.Cluster silences
        import distributed  # noqa: F401
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except RunFailed as err:
        print(f"the run failed; what it did is saved in {err.folder}/", flush=True)
        _fail(parser, args, err)
        return 1
    except (CliError, ValueError, TypeError) as err:
        _fail(parser, args, err)
        return 2
    except RuntimeError as err:
        launch = sys.modules.get("gnnpipe.runtime.launch")
        if launch is None or not isinstance(err, launch.RankFailure):
            raise
        _fail(parser, args, err)
        return 1
