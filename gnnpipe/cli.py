"""`gnnpipe` command line: train, demo, simulate (and dashboard, when installed)."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

logger = logging.getLogger(__name__)


def _add_train_args(p: argparse.ArgumentParser) -> None:
    from gnnpipe.models import MODELS
    from gnnpipe.train import MODES

    p.add_argument("--dataset", default="cora",
                   help="cora, citeseer, pubmed, or synthetic:NODES (planted partition)")
    p.add_argument("--model", default="gcnii", choices=sorted(MODELS))
    p.add_argument("--layers", type=int, default=32, help="GNN layers (1-128)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--dropout", type=float, default=None, help="default: the model family's")
    p.add_argument("--mode", default="single", choices=MODES)
    p.add_argument("--stages", type=int, default=1)
    p.add_argument("--chunks", type=int, default=None, help="default: 4 x stages")
    p.add_argument("--ways", type=int, default=1, help="hybrid: pipelines side by side")
    p.add_argument("--parts", type=int, default=2, help="graph: partitions (ranks)")
    p.add_argument("--scheduler", default=None,
                   help="Dask scheduler address (tcp://host:8786); default: a local cluster")
    p.add_argument("--epochs", type=int, default=200)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--weight-decay", type=float, default=5e-4)
    p.add_argument("--gnn-weight-decay", type=float, default=None,
                   help="weight decay of the GNN layers (default: --weight-decay)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=1,
                   help="evaluate after every N-th epoch and the last (default: every epoch)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cuda: train on GPUs (distributed ranks: one per worker, NCCL)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", default="runs", help="folder for runs/<id>/ results")
    p.add_argument("--dashboard", action="store_true",
                   help="serve the live dashboard on localhost while training (distributed modes)")


def load_data(spec: str):
    """``cora``/``citeseer``/``pubmed`` or ``synthetic:NODES``."""
    from gnnpipe import datasets

    if spec.startswith("synthetic"):
        _, _, nodes = spec.partition(":")
        return datasets.synthetic(num_nodes=int(nodes or 10_000), seed=0)
    return datasets.load(spec)


def _train(args: argparse.Namespace) -> int:
    import gnnpipe as gp

    if args.threads:
        torch.set_num_threads(args.threads)
    data = load_data(args.dataset)
    torch.manual_seed(args.seed)
    extra = {"alpha": 0.1, "theta": 0.5} if args.model == "gcnii" else {}
    model = gp.models.build(args.model, data.num_features, int(data.y.max()) + 1, args.layers,
                            hidden=args.hidden, dropout=args.dropout, **extra)
    live = args.dashboard and args.mode in ("pipeline", "graph", "hybrid")
    run = gp.train(model, data, args.mode, epochs=args.epochs, lr=args.lr,
                   weight_decay=args.weight_decay, gnn_weight_decay=args.gnn_weight_decay,
                   seed=args.seed, stages=args.stages, chunks=args.chunks, ways=args.ways,
                   parts=args.parts, cluster=args.scheduler, eval_every=args.eval_every,
                   device=args.device, background=live)
    viewer = _viewer() if args.dashboard else None
    server = None
    if live and viewer is not None:
        server, url = viewer.serve_run(run)
        print(f"dashboard at {url}", flush=True)
        run.wait()
    folder = run.save(Path(args.out) / time.strftime(f"%Y%m%d-%H%M%S-{args.mode}"))
    if viewer is not None:
        print(f"dashboard snapshot: {viewer.snapshot(run, folder)}")
    if server is not None:
        server.stop()
    print(run.summary().to_string(index=False))
    print(f"results in {folder}/ (history.csv, trace.json for Perfetto, config.json)")
    return 0


def _demo(args: argparse.Namespace) -> int:
    """GCNII on Cora: a 2-stage GNNPipe pipeline on a local 2-worker Dask cluster, beside the
    exact single-process reference and graph parallelism on the same cluster."""
    import gnnpipe as gp

    torch.set_num_threads(1)
    viewer = _viewer()
    data = gp.datasets.load("cora")
    stamp = time.strftime("%Y%m%d-%H%M%S")
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
                run.wait()
                server.stop()
            folder = run.save(Path(args.out) / f"{stamp}-demo-{mode}")
            if viewer is not None and mode == "pipeline":
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
    path = timeline.to_chrome_trace(args.trace)
    print(f"trace written to {path} (open in https://ui.perfetto.dev)")
    return 0


def _plan(args: argparse.Namespace) -> int:
    import gnnpipe as gp
    from gnnpipe.engine.local import stage_ranges

    torch.set_num_threads(args.threads)
    data = load_data(args.dataset)
    torch.manual_seed(args.seed)
    extra = {"alpha": 0.1, "theta": 0.5} if args.model == "gcnii" else {}
    model = gp.models.build(args.model, data.num_features, int(data.y.max()) + 1, args.layers,
                            hidden=args.hidden, **extra)
    plan = gp.plan(model, data, workers=args.workers, memory_limit=args.memory_limit,
                   bandwidth=args.bandwidth, seed=args.seed, repeats=args.repeats)
    print(plan)
    uniform = plan.predict(stage_ranges(len(model), args.workers))
    print(f"uniform split, same chunks: predicted epoch {uniform.makespan():.4g} s")
    print(f"train with: gnnpipe train --mode pipeline --stages {args.workers} "
          f"--chunks {plan.chunks} (or gp.train(..., plan=plan))")
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gnnpipe", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a model and write runs/<id>/")
    _add_train_args(train)
    train.set_defaults(func=_train)

    demo = sub.add_parser("demo", help="Cora GCNII-32: single vs 2-stage pipeline vs graph, live dashboard")
    demo.add_argument("--epochs", type=int, default=200)
    demo.add_argument("--layers", type=int, default=32)
    demo.add_argument("--out", default="runs")
    demo.set_defaults(func=_demo)

    sim = sub.add_parser("simulate", help="simulate a pipeline schedule and write a trace")
    sim.add_argument("--schedule", default="gnnpipe", choices=["gnnpipe", "gpipe", "1f1b"])
    sim.add_argument("--stages", type=int, default=4)
    sim.add_argument("--chunks", type=int, default=16)
    sim.add_argument("--forward", type=float, default=1.0, help="seconds per forward op")
    sim.add_argument("--backward", type=float, default=2.0, help="seconds per backward op")
    sim.add_argument("--comm", type=float, default=0.0, help="seconds per stage-to-stage transfer")
    sim.add_argument("--trace", default="schedule_trace.json")
    sim.set_defaults(func=_simulate)

    from gnnpipe.models import MODELS

    plan = sub.add_parser("plan", help="profile a model and choose stage boundaries and chunks")
    plan.add_argument("--dataset", default="cora",
                      help="cora, citeseer, pubmed, or synthetic:NODES (planted partition)")
    plan.add_argument("--model", default="gcnii", choices=sorted(MODELS))
    plan.add_argument("--layers", type=int, default=32, help="GNN layers (1-128)")
    plan.add_argument("--hidden", type=int, default=64)
    plan.add_argument("--workers", type=int, default=2, help="pipeline stages, one worker each")
    plan.add_argument("--memory-limit", default=None, help="bytes per stage, e.g. 8GB or 512MiB")
    plan.add_argument("--bandwidth", default=None, help="stage-to-stage bytes/s, e.g. 1GB/s")
    plan.add_argument("--repeats", type=int, default=3,
                      help="profiled epochs at each of two chunk counts (medians)")
    plan.add_argument("--threads", type=int, default=1, help="torch threads while profiling")
    plan.add_argument("--seed", type=int, default=0)
    plan.set_defaults(func=_plan)
    for plugin in _plugins():
        plugin.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (ValueError, TypeError) as err:
        print(f"gnnpipe: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

