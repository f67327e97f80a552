"""``gp.estimate_memory`` against measured per-rank peaks (issue #24), and what the ranks'
allocator costs and saves.

Every case is a model on a graph in one mode and layout; it runs in a fresh child process that
first estimates every rank's peak (``gp.estimate_memory``, timed), then trains 2 epochs
(evaluating after the second) and reads ``run.memory()``. Every process — the child and the Dask
workers it starts — uses the lean allocator (``GNNPIPE_ALLOCATOR=lean``: freed tensors go back
to the OS), whose resident peak is what the run needs, the quantity the estimate predicts.

Models: GCNII (hidden 64), a custom PyG ``MessagePassing`` stack (mean aggregation, linear,
residual: the layer of issue #24's new-user trial) and a PyG ``GAT`` (hidden 64, 2 heads), on
synthetic graphs (average degree 10, 64 features, 8 classes) and Facebook. One torch thread per
process.

A second table (``--allocator``) runs one pipeline with each
:class:`~gnnpipe.runtime.workerenv.Allocator` in its workers (``glibc``, ``huge``, ``lean``),
alternating, twice: per-rank peak and median epoch time.

Run (from the repository root)::

    .venv/bin/python benchmarks/memory_estimate.py              # the grid (~40 min)
    .venv/bin/python benchmarks/memory_estimate.py --allocator  # the allocator table (~15 min)
    .venv/bin/python benchmarks/memory_estimate.py --at 1000000 # estimates only, 1M nodes
    .venv/bin/python benchmarks/memory_estimate.py --quick      # smoke test, writes nothing

Writes ``benchmarks/results/memory_estimate.{json,md}`` (or ``memory_allocator.*``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from _common import (
    add_output_args,
    environment,
    finish,
    output_dir,
    payload,
    resume_journal,
    run_child,
    serve_child,
    write_results,
)

#: (model, graph, mode, layout) of the grid
GRID: list[tuple[str, str, str, dict[str, Any]]] = [
    *[(m, g, mode, lay) for m, g in (("gcnii32", "syn50k"), ("gcnii32", "syn200k"),
                                     ("gcnii32", "facebook"), ("mp16", "syn100k"),
                                     ("gat8", "syn50k"))
      for mode, lay in (("single", {}), ("local", {"stages": 2, "chunks": 8}),
                        ("pipeline", {"stages": 2, "chunks": 8}), ("graph", {"parts": 2}))],
    ("gcnii32", "syn100k", "pipeline", {"stages": 2, "chunks": 8, "recompute": True}),
    ("gcnii32", "syn100k", "pipeline", {"stages": 2, "chunks": 8, "history_dtype": "bfloat16"}),
    ("gcnii32", "syn100k", "pipeline", {"stages": 4, "chunks": 16}),
    ("gcnii32", "syn100k", "hybrid", {"stages": 2, "ways": 2, "chunks": 8}),
    ("gcnii32", "syn300k", "pipeline", {"stages": 2, "chunks": 8}),
]


def _model(name: str, data: Any) -> Any:
    import torch
    from torch import nn
    from torch_geometric.nn import MessagePassing, Sequential
    from torch_geometric.nn.models import GAT

    import gnnpipe as gp

    torch.manual_seed(0)
    classes = int(data.y.max()) + 1
    if name.startswith("gcnii"):
        return gp.models.gcnii(data.num_features, hidden=64, out_dim=classes,
                               layers=int(name[5:]), dropout=0.5)
    if name.startswith("gat"):
        # no dropout inside the layers: graph parallelism refuses it (it cannot equal single)
        return GAT(data.num_features, 64, num_layers=int(name[3:]), out_channels=classes,
                   heads=2, dropout=0.0)

    class MeanLinear(MessagePassing):
        """Mean of the neighbours, a linear map."""

        def __init__(self, width: int) -> None:
            super().__init__(aggr="mean")
            self.lin = nn.Linear(width, width)

        def forward(self, x: Any, edge_index: Any) -> Any:
            return self.lin(self.propagate(edge_index, x=x))

    layers: list[Any] = [(nn.Linear(data.num_features, 64), "x -> x")]
    for _ in range(int(name[2:])):
        layers += [(MeanLinear(64), "x, edge_index -> h"), (lambda x, h: x + h.relu(), "x, h -> x")]
    layers.append((nn.Linear(64, classes), "x -> x"))
    return Sequential("x, edge_index", layers)


def _graph(name: str) -> Any:
    import gnnpipe as gp

    if name == "facebook":
        return gp.datasets.load("facebook")
    nodes = int(name[3:-1]) * 1000
    return gp.datasets.synthetic(num_nodes=nodes, avg_degree=10, num_classes=8, num_features=64,
                                 seed=0)


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One case in this fresh process: the estimate, then 2 epochs and their measured peaks."""
    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    data = _graph(cfg["graph"])
    model = _model(cfg["model"], data)
    began = time.perf_counter()
    est = gp.estimate_memory(model, data, cfg["mode"], **cfg["layout"])
    estimate_s = time.perf_counter() - began
    run = gp.train(model, data, cfg["mode"], epochs=cfg["epochs"], eval_every=cfg["epochs"],
                   progress=False, **cfg["layout"])
    measured = run.memory().set_index("rank")["peak_bytes"]
    epochs = run.history["epoch_time"].tolist() if "epoch_time" in run.history else []
    return {**cfg, "nodes": data.num_nodes, "estimate_s": estimate_s,
            "epoch_s": statistics.median(epochs) if epochs else None,
            "ranks": [{"rank": int(r), "estimated": int(est.loc[r, "peak_bytes"]),
                       "measured": int(measured[r]),
                       "items": {k: int(v) for k, v in est.loc[r].items()}}
                      for r in measured.index]}


def _environ(allocator: str) -> dict[str, str]:
    """A child's environment with ``allocator`` for itself and the workers it starts."""
    from gnnpipe.runtime.workerenv import Allocator

    return {**Allocator(allocator).environ(), "GNNPIPE_ALLOCATOR": allocator}


def _layout(lay: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in lay.items()) or "-"


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = ["# Estimated against measured peak memory per rank", "",
             (f"{env['date']} · torch {env['torch']} · 1 thread per process · {env['cpu']} "
              f"({env['cpu_count']} CPUs, shared) · 2 epochs, evaluation after the second · "
              "the lean allocator (freed tensors unmapped) in every process"), "",
             ("| model | graph | nodes | mode | layout | rank | estimated MiB | measured MiB | "
              "estimated ÷ measured | estimate s | epoch s |"),
             "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|"]
    worst = 0.0
    for r in rows:
        for k in r["ranks"]:
            ratio = k["estimated"] / max(k["measured"], 1)
            worst = max(worst, abs(ratio - 1))
            epoch = f"{r['epoch_s']:.2f}" if r["epoch_s"] else ""
            lines.append(f"| {r['model']} | {r['graph']} | {r['nodes']:,} | {r['mode']} | "
                         f"{_layout(r['layout'])} | {k['rank']} | {k['estimated'] / 2**20:,.0f} | "
                         f"{k['measured'] / 2**20:,.0f} | {ratio:.3f} | {r['estimate_s']:.1f} | "
                         f"{epoch} |")
    lines += ["", f"Largest error: {worst:.1%} of the measured peak."]
    return "\n".join(lines) + "\n"


def allocator_child(cfg: dict[str, Any]) -> dict[str, Any]:
    """The pipeline of the allocator table in this process's environment."""
    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    data = _graph(cfg["graph"])
    run = gp.train(_model(cfg["model"], data), data, cfg["mode"], epochs=cfg["epochs"],
                   eval_every=cfg["epochs"], progress=False, **cfg["layout"])
    times = run.history["epoch_time"].tolist()[1:]
    return {**cfg, "epoch_s": statistics.median(times),
            "peaks": run.memory()["peak_bytes"].astype(int).tolist()}


#: Layouts estimated (not run) at ``--at`` nodes: GCNII-32, hidden 64
AT_SCALE: list[tuple[str, dict[str, Any]]] = [
    ("single", {}),
    ("pipeline", {"stages": 2, "chunks": 8}),
    ("pipeline", {"stages": 2, "chunks": 8, "history_dtype": "float16", "recompute": True}),
    ("pipeline", {"stages": 4, "chunks": 16}),
    ("pipeline", {"stages": 4, "chunks": 16, "history_dtype": "float16", "recompute": True,
                  "techniques": {"snapshot": False}}),
    ("graph", {"parts": 4}),
]


def _at_scale(nodes: int, env: dict[str, Any], start: float, out: Any, args: Any) -> None:
    """``gp.estimate_memory`` only, for :data:`AT_SCALE` on a synthetic graph of ``nodes``."""
    import pandas as pd
    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    data = _graph(f"syn{nodes // 1000}k")
    model = _model("gcnii32", data)
    rows = []
    for mode, layout in AT_SCALE:
        began = time.perf_counter()
        est = gp.estimate_memory(model, data, mode, **layout)
        rows.append({"mode": mode, "layout": _layout(layout), "ranks": len(est),
                     "peak_bytes": int(est["peak_bytes"].max()),
                     "history": int(est["history"].max()), "stash": int(est["stash"].max()),
                     "seconds": time.perf_counter() - began})
        print(f"{mode:8s} {rows[-1]['layout']:70s} {rows[-1]['peak_bytes'] / 2**30:7.2f} GiB "
              f"({rows[-1]['seconds']:.0f} s)", flush=True)
    finish(env, start)
    if out is not None:
        single = rows[0]["peak_bytes"]
        lines = [f"# Estimated peak per rank at {nodes:,} nodes (GCNII-32, hidden 64)", "",
                 (f"{env['date']} · `gp.estimate_memory`, not run · synthetic graph, average "
                 "degree 10, 64 features"), "",
                 ("| mode | layout | ranks | peak GiB per rank | ÷ single | history GiB | "
                 "stash GiB | estimate s |"), "|---|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {r['mode']} | {r['layout']} | {r['ranks']} | "
                  f"{r['peak_bytes'] / 2**30:.2f} | {r['peak_bytes'] / single:.2f} | "
                  f"{r['history'] / 2**30:.2f} | {r['stash'] / 2**30:.2f} | {r['seconds']:.0f} |"
                  for r in rows]
        write_results(out, f"memory_estimate_{nodes // 1000}k",
                      payload(env, pd.DataFrame(rows), rows, args), "\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocator", action="store_true", help="the allocator table instead")
    ap.add_argument("--at", type=int, default=None,
                    help="only estimate (not run) GCNII-32 layouts at this many nodes")
    ap.add_argument("--epochs", type=int, default=2)
    add_output_args(ap, child=True)
    args = ap.parse_args()
    if serve_child(args, lambda cfg: (allocator_child if "allocator" in cfg else child)(cfg)):
        return
    out = output_dir(args)
    env, start = environment(threads=1), time.perf_counter()
    if args.allocator:
        _allocator_table(args, env, start, out)
        return
    if args.at is not None:
        _at_scale(args.at, env, start, out, args)
        return
    grid = GRID[:2] if args.quick else GRID
    jobs = [("gcnii4" if args.quick else model, "syn5k" if args.quick else graph, mode,
             json.dumps(layout)) for model, graph, mode, layout in grid]
    journal, rows, jobs = resume_journal(out, "memory_estimate", jobs, ("model", "graph", "mode",
                                                                        "layout_key"))
    for model, graph, mode, key in jobs:
        cfg = {"model": model, "graph": graph, "mode": mode, "layout": json.loads(key),
               "layout_key": key, "epochs": args.epochs}
        rows.append(run_child(__file__, cfg, env=_environ("lean")))
        if journal is not None:  # a stopped run picks up here
            with journal.open("a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
        layout = cfg["layout"]
        for k in rows[-1]["ranks"]:
            print(f"{model:8s} {graph:9s} {mode:8s} {_layout(layout):40s} rank {k['rank']}: "
                  f"estimated {k['estimated'] / 2**20:8.0f} MiB, measured "
                  f"{k['measured'] / 2**20:8.0f} MiB ({k['estimated'] / k['measured']:.3f})",
                  flush=True)
    finish(env, start)
    if out is not None:
        import pandas as pd

        flat = pd.DataFrame([{**{k: v for k, v in r.items() if k != "ranks"}, **k}
                             for r in rows for k in r["ranks"]])
        write_results(out, "memory_estimate", payload(env, flat, rows, args),
                      markdown(rows, env))
        if journal is not None:
            journal.unlink(missing_ok=True)


def _allocator_table(args: argparse.Namespace, env: dict[str, Any], start: float,
                     out: Any) -> None:
    """Pipeline 2 × 8 with each allocator in its workers, alternating."""
    cfg = {"model": "gcnii8", "graph": "syn5k" if args.quick else "syn100k", "mode": "pipeline",
           "layout": {"stages": 2, "chunks": 8}, "epochs": 3 if args.quick else 8,
           "allocator": True}
    rows = []
    for repeat in range(1 if args.quick else 2):
        for name in ("glibc", "huge", "lean"):
            rows.append({**run_child(__file__, cfg, env={"GNNPIPE_ALLOCATOR": name}),
                         "allocator": name,
                         "repeat": repeat})
            print(f"{name:6s} epoch {rows[-1]['epoch_s']:.3f} s, peaks "
                  f"{[round(p / 2**20) for p in rows[-1]['peaks']]} MiB", flush=True)
    finish(env, start)
    if out is not None:
        import pandas as pd

        lines = ["# The ranks' allocator: glibc's defaults, huge pages, freed tensors unmapped", "",
                 (f"{env['date']} · GCNII-8, hidden 64, 100,000 nodes, pipeline 2 × 8, 1 thread "
                  f"per rank · {env['cpu']} ({env['cpu_count']} CPUs, shared)"), "",
                 "| allocator | repeat | median epoch s | peak MiB per rank |", "|---|---:|---:|---|"]
        lines += [f"| {r['allocator']} | {r['repeat']} | {r['epoch_s']:.3f} | "
                  + " ".join(f"{p / 2**20:,.0f}" for p in r["peaks"]) + " |" for r in rows]
        write_results(out, "memory_allocator", payload(env, pd.DataFrame(rows), rows, args),
                      "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
