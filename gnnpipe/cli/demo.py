"""``gnnpipe demo`` (what ``make demo`` runs): the same deep GCNII on a small graph, where one
process is faster, and on a larger one, where the pipeline pays, measured side by side in one
run on one 2-worker Dask cluster, and a table that says what its columns mean."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnnpipe.cli.args import writable_folder
from gnnpipe.cli.runs import finish

__all__ = ["COLUMNS", "Case", "run"]

#: What each column of the demo's table means, printed under it.
COLUMNS = {
    "s/epoch": "median seconds of a training epoch (the first is skipped: warm-up)",
    "x single": "s/epoch / single's (1 thread) on the same graph: below 1, faster than single",
    "MB sent": "megabytes the ranks sent per epoch; 'predicted' is gp.comm_volume, from the "
               "layout alone",
    "efficiency": "ideal / measured epoch (docs/concepts/efficiency.md): 100% loses only the "
                  "pipeline's fill-and-drain bubble",
    "peak MiB": "the most memory one rank (or this process) added while training; 'need' is "
                "gp.estimate_memory's prediction of it, made before the run (single's peak is "
                "higher: this process keeps freed blocks in glibc's heap, "
                "docs/concepts/memory.md)",
}


@dataclass
class Case:
    """One graph of the demo and the layouts it trains there."""

    name: str
    data: Any
    epochs: int
    layouts: dict[str, tuple[str, dict[str, Any]]]
    eval_every: int = 1
    rows: list[dict[str, Any]] = field(default_factory=list)


def _model(data: Any, layers: int) -> Any:
    import torch

    import gnnpipe as gp

    torch.manual_seed(0)
    return gp.models.gcnii(data.num_features, hidden=64, out_dim=gp.datasets.num_classes(data),
                           layers=layers, alpha=0.1, theta=0.5, dropout=0.6)


def _row(label: str, run: Any, model: Any, data: Any, mode: str, layout: dict[str, Any],
         folder: Path) -> dict[str, Any]:
    import gnnpipe as gp

    history = run.history
    times = history["epoch_time"].iloc[1:] if len(history) > 1 else history["epoch_time"]
    summary = run.summary().iloc[0]
    need = gp.estimate_memory(model, data, mode, **layout)
    return {"layout": label, "test acc": run.best.get("test_acc", float("nan")),
            "s/epoch": float(times.median()),
            "MB sent": float(history["comm_bytes"].median()) / 1e6,
            "predicted MB": gp.comm_volume(model, data, mode, stages=layout.get("stages", 1),
                                           parts=layout.get("parts", 1)) / 1e6,
            "efficiency": summary.get("parallel_efficiency", float("nan")),
            "peak MiB": int(run.memory()["peak_bytes"].max()) / 2**20,
            "need MiB": float(need["peak_bytes"].max()) / 2**20, "folder": str(folder)}


def _train(case: Case, layers: int, cluster: Any, out: Path, viewer: Any) -> None:
    """Train every layout of ``case`` from the same initial weights and record its row."""
    import torch

    import gnnpipe as gp

    for label, (mode, options) in case.layouts.items():
        layout = {k: v for k, v in options.items() if k != "threads"}
        model = _model(case.data, layers)
        live = viewer is not None and mode == "pipeline"
        where = {"cluster": cluster} if gp.Mode(mode).distributed else {}
        torch.set_num_threads(options.get("threads", 1))
        run = gp.train(model, case.data, mode, epochs=case.epochs, lr=0.01, weight_decay=5e-4,
                       gnn_weight_decay=0.01, eval_every=case.eval_every, background=live,
                       progress=not live and sys.stderr.isatty(), **where, **layout)
        torch.set_num_threads(1)
        server = None
        if live:
            server, url = viewer.serve_run(run)
            print(f"live dashboard of the {case.name} pipeline: {url}", flush=True)
        slug = "-".join(f"{case.name.split()[0]} {label}".replace(",", "").split())
        folder = finish(run, out, f"demo-{slug}", progress=sys.stderr.isatty())
        if server is not None:
            server.stop()
            print(f"dashboard snapshot: {viewer.snapshot(run, folder)}")
        case.rows.append(_row(label, run, model, case.data, mode, layout, folder))


def _table(case: Case) -> Any:
    import pandas as pd

    table = pd.DataFrame(case.rows).set_index("layout")
    table.insert(2, "x single", table["s/epoch"] / table.loc["single", "s/epoch"])
    return table


def _print(case: Case, table: Any, layers: int) -> None:
    print(f"\n{case.name}: GCNII-{layers}, hidden 64, {case.epochs} epochs, "
          f"{case.data.num_nodes:,} nodes, {case.data.num_edges:,} edges")
    shown = table.drop(columns="folder")
    print(shown.to_string(float_format=lambda v: f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}",
                          na_rep="-"))


def _explain(small: Any, large: Any, large_case: Case) -> None:
    """The columns, then what this run's numbers say, in words."""
    print("\ncolumns:")
    for name, text in COLUMNS.items():
        print(f"  {name:<11} {text}")
    pipe, graph = "pipeline 2 x 8", "graph 2 parts"
    s = small.loc[pipe, "x single"]
    print(f"\nOn Cora the pipeline took {s:.2f}x single's time. Its 2,708 nodes make chunks of "
          "~340 rows, which compute in well under a millisecond per layer, while every chunk "
          "step sends its activations to the next rank and waits for them: on a graph this "
          "small the messages cost more than the second core computes.")
    one, two = large.loc[pipe, "x single"], large.loc[pipe, "s/epoch"] / large.loc[
        "single, 2 threads", "s/epoch"]
    vs_graph = large.loc[pipe, "s/epoch"] / large.loc[graph, "s/epoch"]
    fewer = large.loc[graph, "MB sent"] / max(large.loc[pipe, "MB sent"], 1e-9)
    print(f"On {large_case.name} nodes the pipeline took {one:.2f}x single's time (one torch "
          f"thread each, as each rank has one), {two:.2f}x single's with two threads (both "
          f"cores), and {vs_graph:.2f}x graph parallelism's on the same two ranks, sending "
          f"{fewer:.1f}x fewer bytes than it.")
    if one < 1:
        print(f"Chunks of ~{large_case.data.num_nodes // 8:,} rows keep each rank busy between "
              "messages, so the second rank's core pays.", end=" ")
    if two > 0.9:
        print("Given both cores, one process is about as fast on a 2-core machine: a pipeline "
              "pays in time where there are more ranks (cores, GPUs, hosts) than one process "
              "uses well, and in memory where a deep model on a whole graph does not fit one "
              "process (docs/concepts/memory.md, docs/performance.md).")
    else:
        print("It is faster than one process using both cores, too.")


def run(args: argparse.Namespace, viewer: Any) -> int:
    import torch

    import gnnpipe as gp

    out = writable_folder(args.out, "--out")
    torch.set_num_threads(1)
    piped = {"stages": 2, "chunks": 8}
    small = Case("Cora", gp.datasets.load("cora"), args.epochs, {
        "single": ("single", {}), "pipeline 2 x 8": ("pipeline", dict(piped)),
        "graph 2 parts": ("graph", {"parts": 2})}, eval_every=1)
    large = Case(f"synthetic {args.nodes:,}", gp.datasets.synthetic(
        args.nodes, avg_degree=10, num_features=64, seed=0), args.large_epochs, {
        "single": ("single", {}), "single, 2 threads": ("single", {"threads": 2}),
        "pipeline 2 x 8": ("pipeline", dict(piped)), "graph 2 parts": ("graph", {"parts": 2})},
        eval_every=args.large_epochs)
    with gp.Cluster(n_workers=2) as cluster:
        print(f"started {cluster}")
        _train(small, args.layers, cluster, out, viewer)
        _train(large, args.layers, cluster, out, None)
    tables = [_table(small), _table(large)]
    for case, table in zip((small, large), tables):
        _print(case, table, args.layers)
    _explain(tables[0], tables[1], large)
    print("\nruns written to:\n  " + "\n  ".join(t for tb in tables for t in tb["folder"]))
    print("open a run's trace.json in https://ui.perfetto.dev, or: gnnpipe dashboard <folder>")
    return 0
