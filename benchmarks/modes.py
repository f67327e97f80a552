"""Every training mode side by side: epoch time, bytes per epoch and memory, plus the
communication ratio graph-parallel ÷ pipeline.

Part 1 (measured) trains a 32-layer GCN and a 32-layer GCNII (hidden 64) on a synthetic
50K-node graph (avg degree 10, 8 classes, 64 features, homophily 0.8, seed 0) with 2 and 4
ranks in every mode: ``single``, ``local`` (stages=R, chunks=4R), ``pipeline`` (stages=R,
chunks=4R), ``graph`` (parts=R) and, with 4 ranks, ``hybrid`` (2 ways × 2 stages, 16 chunks).
For each: median of ``run.history["epoch_time"]`` after 2 warm-up epochs (training only, the
per-epoch evaluation excluded), bytes per epoch measured (``run.history["comm_bytes"]``) and
predicted (``gp.comm_volume``), and peak RSS per rank. ``single`` and ``local`` run in a fresh
child process each (their own ``ru_maxrss``); distributed runs share one 4-worker Dask cluster
whose workers are restarted before each run (``run.peak_rss`` is the worker's lifetime
``ru_maxrss``). Every process uses one torch thread.

Part 2 (no training) compares ``gp.comm_volume`` of ``graph`` (4 METIS parts) and
``pipeline`` (4 stages) for GCN-32 and GCNII-32 on Cora and on synthetic 50K-node graphs of
homophily 0.9 and 0.5, beside the formula ``L·M / ((S−1)·n)`` of DESIGN.md §4.

Run (from the repository root)::

    .venv/bin/python benchmarks/modes.py                 # full size (~15 min), writes results/
    .venv/bin/python benchmarks/modes.py --quick         # smoke test, writes nothing
    .venv/bin/python benchmarks/modes.py --nodes 20000 --epochs 3

Writes ``benchmarks/results/modes.json`` (raw numbers, environment) and ``modes.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODELS, HIDDEN, WARMUP, RANKS = ("gcn", "gcnii"), 64, 2, (2, 4)
PAPER_GEOMEAN = 8.69  # GNNPipe paper: communication volume down 8.69x (geometric mean)
MB = 2**20


def graph(nodes: int, homophily: float = 0.8) -> Any:
    import gnnpipe as gp

    return gp.datasets.synthetic(num_nodes=nodes, avg_degree=10, num_classes=8, num_features=64,
                                 homophily=homophily, seed=0)


def build(name: str, data: Any, layers: int) -> Any:
    import torch

    import gnnpipe as gp

    torch.manual_seed(0)
    return gp.models.build(name, data.num_features, gp.datasets.num_classes(data), layers, HIDDEN)


def mode_kwargs(mode: str, ranks: int) -> dict[str, int]:
    return {"single": {}, "local": {"stages": ranks, "chunks": 4 * ranks},
            "pipeline": {"stages": ranks, "chunks": 4 * ranks}, "graph": {"parts": ranks},
            "hybrid": {"ways": 2, "stages": 2, "chunks": 16}}[mode]


def configs() -> list[tuple[str, int]]:
    """(mode, ranks) pairs; ``single`` once (it has no ranks)."""
    out = [("single", 1)]
    for r in RANKS:
        out += [(m, r) for m in ("local", "pipeline", "graph")] + ([("hybrid", r)] if r == 4 else [])
    return out


def summarize_run(run: Any, cfg: dict[str, Any], rss: dict[int, int]) -> dict[str, Any]:
    timed = run.history.iloc[WARMUP:]
    return {**cfg, "epoch_times": timed["epoch_time"].tolist(),
            "median_epoch_s": float(timed["epoch_time"].median()),
            "measured_bytes": int(timed["comm_bytes"].median()), "best": run.best,
            "peak_rss_mb": {int(k): v / MB for k, v in rss.items()}}


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """``single``/``local`` in this fresh process: train, report times and ``ru_maxrss``."""
    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    data = graph(cfg["nodes"])
    run = gp.train(build(cfg["model"], data, cfg["layers"]), data, cfg["mode"],
                   **mode_kwargs(cfg["mode"], cfg["ranks"]), epochs=WARMUP + cfg["epochs"],
                   progress=False)
    return summarize_run(run, cfg, {0: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024})


def run_child(cfg: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)],
                          check=False, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"child {cfg} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure(args: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    """Part 1: all configurations; children first, then one 4-worker cluster for the rest."""
    import gnnpipe as gp

    todo = [{"model": m, "mode": mode, "ranks": r, "nodes": args.nodes, "layers": args.layers,
             "epochs": args.epochs} for m in MODELS for mode, r in configs()]
    results = [run_child(c) for c in todo if c["mode"] in ("single", "local")]
    for r in results:
        log(r)
    data = graph(args.nodes)
    with gp.Cluster(n_workers=max(RANKS)) as cluster:
        for cfg in (c for c in todo if c["mode"] not in ("single", "local")):
            cluster.restart()  # fresh worker processes: ru_maxrss of this run only
            run = gp.train(build(cfg["model"], data, cfg["layers"]), data, cfg["mode"],
                           **mode_kwargs(cfg["mode"], cfg["ranks"]), epochs=WARMUP + cfg["epochs"],
                           cluster=cluster, progress=False, timeout=600.0)
            results.append(summarize_run(run, cfg, run.peak_rss))
            log(results[-1])
    for r in results:
        model = build(r["model"], data, r["layers"])
        r["predicted_bytes"] = gp.comm_volume(model, data, r["mode"], **mode_kwargs(r["mode"], r["ranks"]))
    return results


def ratios(nodes: int, layers: int) -> list[dict[str, Any]]:
    """Part 2: graph ÷ pipeline bytes with 4 ranks, no training."""
    import gnnpipe as gp

    rows, ranks = [], 4
    graphs = {"cora": gp.datasets.load("cora"), f"synthetic h=0.9 ({nodes:,})": graph(nodes, 0.9),
              f"synthetic h=0.5 ({nodes:,})": graph(nodes, 0.5)}
    for name, data in graphs.items():
        part = gp.partition(data, ranks, method="metis", seed=0)
        n, M = data.num_nodes, part.total_halo_rows
        for m in MODELS:
            model = build(m, data, layers)
            pipe = gp.comm_volume(model, data, "pipeline", stages=ranks)
            par = gp.comm_volume(model, data, "graph", parts=ranks, partitioning=part)
            rows.append({"graph": name, "model": m, "n": n, "M": M, "pipeline_bytes": pipe,
                         "graph_bytes": par, "ratio": par / pipe,
                         "formula": layers * M / ((ranks - 1) * n)})
    return rows


def markdown(results: list[dict[str, Any]], comm: list[dict[str, Any]], env: dict[str, Any],
             args: argparse.Namespace) -> str:
    single = {r["model"]: r["median_epoch_s"] for r in results if r["mode"] == "single"}
    lines = [f"# Modes side by side ({args.nodes:,} nodes, {args.layers} layers, hidden {HIDDEN})",
             "", f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs, "
             f"shared, load {env['loadavg_start'][0]:.1f} at start, {env['loadavg_end'][0]:.1f} at end)"
             f" · 1 torch thread per process · median of {args.epochs} epochs after {WARMUP} warm-up"
             f" · wall {env['wall_s'] / 60:.1f} min", "",
             "| model | ranks | mode | median epoch s | × single | bytes/epoch measured "
             "| predicted | peak RSS/rank MB (max) |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        rss = max(r["peak_rss_mb"].values())
        lines.append(f"| {r['model']} | {r['ranks']} | {r['mode']} | {r['median_epoch_s']:.2f} | "
                     f"{r['median_epoch_s'] / single[r['model']]:.2f} | {r['measured_bytes']:,} | "
                     f"{r['predicted_bytes']:,} | {rss:.0f} |")
    lines += ["", "Epoch time = training only (forward, backward, step), the slowest rank's; the "
              "per-epoch full-graph evaluation is excluded. All ranks share 2 cores, so with 2 ranks "
              "the ideal is 0.5 × single and with 4 ranks it can be no better than that.", ""]
    for m in MODELS:
        for R in RANKS:
            t = {r["mode"]: r["median_epoch_s"] for r in results
                 if r["model"] == m and r["ranks"] in (R, 1)}
            ps, pg = t["pipeline"] / t["single"], t["pipeline"] / t["graph"]
            note = " — **pipelining does not pay here**" if pg > 1 else ""
            lines.append(f"- {m}-{args.layers}, {R} ranks: pipeline/single {ps:.2f} (ideal "
                         f"{1 / min(R, 2):.2f}), pipeline/graph {pg:.2f}{note}.")
    lines += ["", f"## Communication ratio graph ÷ pipeline (4 ranks, {args.layers} layers, no training)",
              "", "| graph | model | n | M (4-way halo rows) | pipeline MB | graph MB | ratio | "
              "formula L·M/((S−1)·n) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for c in comm:
        lines.append(f"| {c['graph']} | {c['model']} | {c['n']:,} | {c['M']:,} | "
                     f"{c['pipeline_bytes'] / MB:.1f} | {c['graph_bytes'] / MB:.1f} | "
                     f"{c['ratio']:.2f} | {c['formula']:.2f} |")
    geo = math.exp(statistics.mean(math.log(c["ratio"]) for c in comm))
    low = [f"{c['graph']} {c['model']}" for c in comm if c["ratio"] < 1]
    lines += ["", f"Geometric mean of the ratios: {geo:.2f} (the GNNPipe paper reports "
              f"{PAPER_GEOMEAN} over its datasets, 32 layers, 8 GPUs). GCNII's pipeline also ships "
              "`h0`, doubling its bytes, so its ratio is about half the formula; GCN's first layer "
              "aggregates its 64-wide input, its last the 8-wide output, so its ratio is close to it.",
              ("Ratio below 1 (pipelining sends more): " + ", ".join(low) + ".") if low else
              "No ratio below 1 here: graph parallelism always sends more than the pipeline at 32 "
              "layers; fewer bytes do not mean a faster epoch on one shared host, see above."]
    return "\n".join(lines) + "\n"


def environment() -> dict[str, Any]:
    import torch

    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    return {"torch": torch.__version__, "python": platform.python_version(), "cpu": cpu,
            "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs after 2 warm-up epochs")
    ap.add_argument("--quick", action="store_true", help="tiny smoke test; writes nothing")
    ap.add_argument("--out", type=Path, help="results folder (default: benchmarks/results)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    import torch

    torch.set_num_threads(1)
    if args.quick:
        args.nodes, args.layers, args.epochs = 2_000, 4, 1
    out = args.out or (None if args.quick else Path(__file__).parent / "results")
    env, start = environment(), time.perf_counter()

    def log(r: dict[str, Any]) -> None:
        print(f"[{time.perf_counter() - start:5.0f}s] {r['model']:5s} {r['mode']:8s} R={r['ranks']} "
              f"epoch {r['median_epoch_s']:.2f}s  rss {max(r['peak_rss_mb'].values()):.0f} MB",
              flush=True)

    comm = ratios(args.nodes, args.layers)
    results = measure(args, log)
    env["loadavg_end"], env["wall_s"] = os.getloadavg(), time.perf_counter() - start
    text = markdown(results, comm, env, args)
    print(text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        payload = {"environment": env, "args": {k: str(v) for k, v in vars(args).items()},
                   "runs": results, "comm_ratio": comm}
        (out / "modes.json").write_text(json.dumps(payload, indent=1) + "\n")
        (out / "modes.md").write_text(text)
        print(f"wrote {out / 'modes.json'} and {out / 'modes.md'}")


if __name__ == "__main__":
    main()
