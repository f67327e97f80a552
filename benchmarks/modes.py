"""Every training mode side by side: epoch time, bytes per epoch and memory, plus the
communication ratio graph-parallel ÷ pipeline.

Part 1 (measured) trains a 32-layer GCN and a 32-layer GCNII (hidden 64) on a synthetic
50K-node graph (avg degree 10, 8 classes, 64 features, homophily 0.8, seed 0) with 2 and 4
ranks in every mode: ``single``, ``local`` (stages=R, chunks=4R), ``pipeline`` (stages=R,
chunks=4R), ``graph`` (parts=R) and, with 4 ranks, ``hybrid`` (2 ways × 2 stages, 16 chunks).
For each: median of ``run.history["epoch_time"]`` after 2 warm-up epochs (training only, the
per-epoch evaluation excluded), bytes per epoch measured (``run.history["comm_bytes"]``) and
predicted (``gp.comm_volume``), and peak RSS per rank (``VmHWM``). ``single`` and ``local`` run
in a fresh child process each; distributed runs share one 4-worker Dask cluster whose workers'
high-water marks are reset before each run (``clear_refs``; each rank also reports its own,
``run.memory()``, counted from when the rank started). Every process uses one torch thread.

Part 2 (no training) compares ``gp.comm_volume`` of ``graph`` (4 METIS parts) and
``pipeline`` (4 stages) for GCN-32 and GCNII-32 on Cora and on synthetic 50K-node graphs of
homophily 0.9 and 0.5, beside the formula ``L·M / ((S−1)·n)`` of docs/design.md §5.

Run (from the repository root)::

    .venv/bin/python benchmarks/modes.py                 # full size, writes results/
    .venv/bin/python benchmarks/modes.py --quick         # smoke test, writes nothing
    .venv/bin/python benchmarks/modes.py --nodes 20000 --epochs 3

Writes ``benchmarks/results/modes.json`` (raw numbers, environment) and ``modes.md``. The full
run took 70 min on 2 cores shared with other jobs (load 15–20); expect far less on a quiet host.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import math
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _common import (
    add_output_args,
    environment,
    finish,
    output_dir,
    run_child,
    serve_child,
    write_results,
)

import gnnpipe as gp

MODELS, HIDDEN, WARMUP, RANKS = ("gcn", "gcnii"), 64, 2, (2, 4)
PAPER_GEOMEAN = 8.69  # GNNPipe paper: communication volume down 8.69x (geometric mean)
MB = 2**20
TIMES = [("| model | ranks | mode | median epoch s | × single | bytes/epoch measured | predicted "
         "| peak RSS/rank MB (max) |"), "|---|---:|---|---:|---:|---:|---:|---:|"]
RATIOS = [("| graph | model | n | M (4-way halo rows) | pipeline MB | graph MB | ratio "
          "| formula L·M/((S−1)·n) |"), "|---|---|---:|---:|---:|---:|---:|---:|"]
NOTE = ("Epoch time: training only (forward, backward, step) of the slowest rank; the per-epoch "
        "full-graph evaluation is excluded. All ranks share 2 cores, so with 2 ranks the ideal "
        "is 0.5 × single, and 4 ranks can do no better. On a shared machine other jobs' load "
        "moves these times by 2–4× between runs (the children run first, the Dask runs later), "
        "so read the ratios as rough; bytes and memory do not depend on the load.")


def graph(nodes: int, homophily: float = 0.8) -> Any:
    return gp.datasets.synthetic(num_nodes=nodes, avg_degree=10, num_classes=8, num_features=64,
                                 homophily=homophily, seed=0)


def build(name: str, data: Any, layers: int) -> Any:
    torch.manual_seed(0)
    return gp.models.build(name, data.num_features, gp.datasets.num_classes(data), layers, HIDDEN)


def mode_kwargs(mode: str, ranks: int) -> dict[str, int]:
    return {"single": {}, "local": {"stages": ranks, "chunks": 4 * ranks},
            "pipeline": {"stages": ranks, "chunks": 4 * ranks}, "graph": {"parts": ranks},
            "hybrid": {"ways": 2, "stages": 2, "chunks": 16}}[mode]


def reset_peak() -> None:
    """Drop freed memory and restart this process's RSS high-water mark (Linux ≥ 4.0)."""
    gc.collect(), ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")


def peak_rss() -> int:
    """``VmHWM`` of this process in bytes."""
    status = Path("/proc/self/status").read_text().splitlines()
    return next(int(ln.split()[1]) for ln in status if ln.startswith("VmHWM")) * 1024


def summarize_run(run: Any, cfg: dict[str, Any], rss: dict[int, int]) -> dict[str, Any]:
    timed = run.history.iloc[WARMUP:]
    return {**cfg, "epoch_times": timed["epoch_time"].tolist(),
            "median_epoch_s": float(timed["epoch_time"].median()),
            "measured_bytes": int(timed["comm_bytes"].median()), "best": run.best,
            "peak_rss_mb": {int(k): v / MB for k, v in rss.items()}}


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """``single``/``local`` in this fresh process: train, report times and peak RSS."""
    torch.set_num_threads(1)
    data = graph(cfg["nodes"])
    run = gp.train(build(cfg["model"], data, cfg["layers"]), data, cfg["mode"],
                   **mode_kwargs(cfg["mode"], cfg["ranks"]), epochs=WARMUP + cfg["epochs"],
                   progress=False)
    return summarize_run(run, cfg, {0: peak_rss()})


def measure(args: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    """Part 1: all configurations; children first, then one 4-worker cluster for the rest."""
    pairs = [("single", 1)] + [(m, r) for r in RANKS for m in ("local", "pipeline", "graph")]
    pairs += [("hybrid", 4)]  # (mode, ranks); single has no ranks
    todo = [{"model": m, "mode": mode, "ranks": r, "nodes": args.nodes, "layers": args.layers,
             "epochs": args.epochs} for m in MODELS for mode, r in pairs]
    results = [run_child(__file__, c) for c in todo if c["mode"] in ("single", "local")]
    for r in results:
        log(r)
    data = graph(args.nodes)
    with gp.Cluster(n_workers=max(RANKS)) as cluster:
        for cfg in (c for c in todo if c["mode"] not in ("single", "local")):
            cluster.client.run(reset_peak)
            run = gp.train(build(cfg["model"], data, cfg["layers"]), data, cfg["mode"],
                           **mode_kwargs(cfg["mode"], cfg["ranks"]), epochs=WARMUP + cfg["epochs"],
                           cluster=cluster, progress=False, timeout=600.0)
            hwm = cluster.client.run(peak_rss)  # rank r ran on the r-th worker address
            ranks = cluster.workers()[:cfg["ranks"]]
            results.append(summarize_run(run, cfg, {r: hwm[w] for r, w in enumerate(ranks)}))
            mem = run.memory()  # the ranks' own VmHWM: the increment plus its starting point
            results[-1]["run_peak_rss_mb"] = {int(r.rank): (r.peak_bytes + r.baseline_bytes) / MB
                                              for r in mem.itertuples()}
            log(results[-1])
    for r in results:
        r["predicted_bytes"] = gp.comm_volume(build(r["model"], data, r["layers"]), data, r["mode"],
                                              **mode_kwargs(r["mode"], r["ranks"]))
    return results


def ratios(nodes: int, layers: int) -> list[dict[str, Any]]:
    """Part 2: graph ÷ pipeline bytes with 4 ranks, no training."""
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
    order = ("single", "local", "pipeline", "graph", "hybrid")
    results = sorted(results, key=lambda r: (r["model"], r["ranks"], order.index(r["mode"])))
    head = (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs, "
            f"shared, load {env['loadavg_start'][0]:.1f} at start, {env['loadavg_end'][0]:.1f} at "
            f"end) · 1 torch thread per process · median of {args.epochs} epochs after {WARMUP} "
            f"warm-up · wall {env['wall_s'] / 60:.1f} min")
    lines = [f"# Modes side by side ({args.nodes:,} nodes, {args.layers} layers, hidden {HIDDEN})",
             "", head, "", *TIMES]
    lines += [f"| {r['model']} | {r['ranks']} | {r['mode']} | {r['median_epoch_s']:.2f} | "
              f"{r['median_epoch_s'] / single[r['model']]:.2f} | {r['measured_bytes']:,} | "
              f"{r['predicted_bytes']:,} | {max(r['peak_rss_mb'].values()):.0f} |" for r in results]
    lines += ["", NOTE, ""]
    for m in MODELS:
        for R in RANKS:
            t = {r["mode"]: r["median_epoch_s"] for r in results
                 if r["model"] == m and r["ranks"] in (R, 1)}
            ps, pg = t["pipeline"] / t["single"], t["pipeline"] / t["graph"]
            worse = " and ".join(w for w, x in (("single", ps), ("graph", pg)) if x > 1)
            verdict = f" — **pipelining does not pay here** (slower than {worse})" * bool(worse)
            lines.append(f"- {m}-{args.layers}, {R} ranks: pipeline/single {ps:.2f} (ideal 0.50), "
                         f"pipeline/graph {pg:.2f}{verdict}.")
    lines += ["", f"## Communication ratio graph ÷ pipeline (4 ranks, {args.layers} layers)", "",
              *RATIOS]
    lines += [f"| {c['graph']} | {c['model']} | {c['n']:,} | {c['M']:,} | "
              f"{c['pipeline_bytes'] / MB:.1f} | {c['graph_bytes'] / MB:.1f} | "
              f"{c['ratio']:.2f} | {c['formula']:.2f} |" for c in comm]
    geo = math.exp(statistics.mean(math.log(c["ratio"]) for c in comm))
    low = ", ".join(f"{c['graph']} {c['model']}" for c in comm if c["ratio"] < 1) or "none"
    least = min(comm, key=lambda c: c["ratio"])
    lines += ["", (f"Geometric mean of these ratios: {geo:.2f}; the GNNPipe paper reports "
                   f"{PAPER_GEOMEAN} (its datasets, 32 layers, 8 GPUs). GCNII's pipeline also "
                   "ships `h0`, doubling its bytes, so its ratio is about half the formula's."), "",
              (f"Ratio below 1 (pipelining sends more than graph parallelism): {low}. Lowest "
               f"ratio, where pipelining saves least: {least['graph']} {least['model']} "
               f"({least['ratio']:.2f}).")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs after 2 warm-up epochs")
    add_output_args(ap, child=True)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    torch.set_num_threads(1)
    if args.quick:
        args.nodes, args.layers, args.epochs = 2_000, 4, 1
    out = output_dir(args)
    env, start = environment(), time.perf_counter()

    def log(r: dict[str, Any]) -> None:
        print(f"[{time.perf_counter() - start:5.0f}s] {r['model']:5s} {r['mode']:8s} "
              f"R={r['ranks']} epoch {r['median_epoch_s']:.2f}s  "
              f"rss {max(r['peak_rss_mb'].values()):.0f} MB", flush=True)

    comm = ratios(args.nodes, args.layers)
    results = measure(args, log)
    finish(env, start)
    text = markdown(results, comm, env, args)
    print(text)
    if out is not None:
        payload = {"environment": env, "args": {k: str(v) for k, v in vars(args).items()},
                   "runs": results, "comm_ratio": comm}
        write_results(out, "modes", payload, text)


if __name__ == "__main__":
    main()
