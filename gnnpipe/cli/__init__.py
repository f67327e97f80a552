"""`gnnpipe` command line: train, demo, simulate, plan (and dashboard, when installed)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from gnnpipe.cli.args import (
    DATASETS,
    MODELS,
    MODES,
    PLANNED_MODES,
    PRECISIONS,
    SCHEDULES,
    CliError,
    Parser,
    bandwidth,
    byte_size,
    dataset_spec,
    mode_list,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    probability,
    schedule_list,
)
from gnnpipe.cli.commands import (
    TRAIN_DEFAULTS,
    plugins,
    run_demo,
    run_plan,
    run_simulate,
    run_train,
)
from gnnpipe.cli.runs import RunFailed

__all__ = ["DATASET_HELP", "build_parser", "main"]

logger = logging.getLogger(__name__)

DATASET_HELP = f"{', '.join(DATASETS)}, or synthetic:NODES (planted partition)"


def _default(flag: str) -> str:
    return f"(default: {TRAIN_DEFAULTS[flag]})"


def _planned(flag: str) -> str:
    """The default of a layout flag, which a --plan sets instead."""
    return f"(default: {TRAIN_DEFAULTS[flag]}, or the plan's)"


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
                   help="a plan written by 'gnnpipe plan --out': train exactly its layout in its "
                        "mode (its stages and their ranges, chunks, ways, parts, schedule and "
                        "memory options, and its dataset and model); a layout flag given with it "
                        "must repeat the plan's value (default: none)")
    p.add_argument("--dropout", type=probability, default=None,
                   help="dropout rate (default: the model family's)")
    p.add_argument("--mode", choices=MODES, default=None,
                   help=f"how to train; with --plan, the plan's mode or, for a pipeline plan, "
                        f"local {_planned('mode')}")
    p.add_argument("--stages", type=positive_int, default=None,
                   help=f"local, pipeline, hybrid: pipeline stages {_planned('stages')}")
    p.add_argument("--chunks", type=positive_int, default=None,
                   help="local, pipeline, hybrid: chunks per epoch (default: 4 x stages, or the "
                        "plan's)")
    p.add_argument("--parts-per-chunk", type=positive_int, default=None,
                   help="local, pipeline, hybrid: METIS parts merged at random into each chunk "
                        "(default: 1, METIS's own parts; 4: the GNNPipe paper's merge)")
    p.add_argument("--ways", type=positive_int, default=None,
                   help=f"hybrid: pipelines side by side {_planned('ways')}")
    p.add_argument("--parts", type=positive_int, default=None,
                   help=f"graph: partitions, one rank each {_planned('parts')}")
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
    p.add_argument("--recompute", action="store_true", default=None,
                   help="chunked modes: keep only stage inputs and aggregations, rerun the "
                        "forward in the backward (less memory, more time) (default: off, or "
                        "the plan's)")
    p.add_argument("--history-dtype", default=None, choices=list(PRECISIONS),
                   help="chunked modes: what the historical buffers are stored in (16 bits "
                        f"halve their memory; products stay float32) {_planned('history_dtype')}")
    p.add_argument("--wire-dtype", default=None, choices=list(PRECISIONS),
                   help="distributed modes: what boundary activations, gradients and halo rows "
                        f"are sent in (16 bits halve the bytes) {_planned('wire_dtype')}")
    p.add_argument("--schedule", default=None, choices=list(SCHEDULES),
                   help="local, pipeline: the chunked epoch's order: gnnpipe (every forward, then "
                        "every backward) or 1f1b (each chunk's backward as soon as its loss: "
                        "fewer chunks' activations held, a different training rule) "
                        f"{_planned('schedule')}")
    p.add_argument("--checkpoint", default=None,
                   help="write checkpoints into this folder (every rank its shard, then a "
                        "manifest; distributed: a folder every worker sees) (default: none)")
    p.add_argument("--checkpoint-every", type=positive_int, default=10,
                   help="epochs between checkpoints (and after the last)")
    p.add_argument("--resume", default=None,
                   help="continue from the newest complete checkpoint in this folder, up to "
                        "--epochs (default: start from epoch 0)")
    p.add_argument("--restarts", type=nonneg_int, default=0,
                   help="distributed modes: restart every rank from the newest checkpoint this "
                        "many times when a worker dies or a rank fails (needs --checkpoint)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch threads (default: torch's)")
    p.add_argument("--out", default="runs", help="folder for the run folders")
    p.add_argument("--dashboard", action="store_true",
                   help="distributed modes: serve the live dashboard on localhost while training")


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
    sim.set_defaults(func=run_simulate)


def _add_plan(sub: Any) -> None:
    plan = sub.add_parser("plan", help="profile a model and choose how to train it on N "
                                       "workers: mode, stages or parts, split, chunks, options")
    _add_model_args(plan, tracked=False)
    plan.add_argument("--workers", type=positive_int, default=2,
                      help="Dask workers available (a layout may use fewer)")
    plan.add_argument("--memory-limit", type=byte_size, default=None,
                      help="bytes a rank may hold, e.g. 8GB or 512MiB (default: no limit)")
    plan.add_argument("--headroom", type=probability, default=0.15,  # planner.HEADROOM
                      help="share of --memory-limit kept free for what the estimate does not "
                           "see (default: 0.15)")
    plan.add_argument("--bandwidth", type=bandwidth, default=None,
                      help="bytes/s between workers, e.g. 1GB/s (default: measured between "
                           "two workers while profiling, else 1GB/s)")
    plan.add_argument("--modes", type=mode_list, default=None,
                      help=f"the modes to weigh, comma-separated, some of "
                           f"{','.join(PLANNED_MODES)} (default: all)")
    plan.add_argument("--chunks", type=positive_int, default=None,
                      help="the most chunks a staged layout may have (default: what the profile "
                           "measured, at most 64)")
    plan.add_argument("--compact", action=argparse.BooleanOptionalAction, default=None,
                      help="16-bit histories and wire: --compact chooses them on speed alone, "
                           "--no-compact never (default: chosen only when no float32 layout "
                           "fits --memory-limit)")
    plan.add_argument("--schedules", type=schedule_list, default=None,
                      help=f"the pipeline schedules to weigh, comma-separated, some of "
                           f"{','.join(SCHEDULES)} (default: both)")
    plan.add_argument("--repeats", type=positive_int, default=1,
                      help="timed profile epochs after the warm-up, their medians taken")
    plan.add_argument("--threads", type=positive_int, default=1,
                      help="torch threads of each profiling worker (gnnpipe train's ranks use 1)")
    plan.add_argument("--seed", type=nonneg_int, default=0, help="seeds weights and chunks")
    plan.add_argument("--out", default=None,
                      help="write the plan as JSON here, for 'gnnpipe train --plan' "
                           "(default: not written)")
    plan.set_defaults(func=run_plan)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand (plugins' too); imports no torch."""
    parser = Parser(prog="gnnpipe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a model and write a new run folder under --out")
    _add_train_args(train)
    train.set_defaults(func=run_train)

    demo = sub.add_parser("demo", help="GCNII-32 on Cora and on a 50,000-node graph: single vs "
                                       "2-stage pipeline vs graph, a live dashboard, a table")
    demo.add_argument("--epochs", type=positive_int, default=100, help="training epochs on Cora")
    demo.add_argument("--layers", type=positive_int, default=32, help="GNN layers")
    demo.add_argument("--nodes", type=positive_int, default=50_000,
                      help="nodes of the larger (synthetic) graph")
    demo.add_argument("--large-epochs", type=positive_int, default=5,
                      help="training epochs on the larger graph (a timing run)")
    demo.add_argument("--out", default="runs", help="folder for the run folders")
    demo.set_defaults(func=run_demo)
    _add_simulate(sub)
    _add_plan(sub)
    for plugin in plugins():
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
    if args.command in ("train", "demo", "plan"):
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
