"""Parallel efficiency of every distributed mode against the one-process runs, side by side.

GCN-32 and GCNII-32 (hidden 64) on a synthetic 50K-node graph (avg degree 10, 8 classes, 64
features, homophily 0.8, seed 0), ``--chunks`` chunks (default 8), ``eval_every`` past the last
epoch (training only), for S = 2 and 4 ranks:

- ``single`` at 1 torch thread and at S threads, ``local`` (S stages × C chunks) at 1 thread:
  each in a fresh child process; ``single`` and ``local`` at 1 thread also as min(S, cores)
  copies running at once (the side-by-side reference: what the cores deliver together);
- ``pipeline`` S × 1 thread, ``graph`` S × 1 and (S = 4) ``hybrid`` 2 ways × 2 stages: on one
  4-worker ``gp.Cluster`` (gnnpipe's rank environment: no trim threshold, no profiler).

Every configuration runs ``--rounds`` times (default 2), the order reversed every other round so
the shared machine's drift meets all of them. Per configuration: the median epoch time of epochs
1.. of every round (epoch 0 is warm-up), bytes per epoch measured and
from ``gp.comm_volume``, peak RSS per rank, and from the measured timeline the ranks' compute /
communication / waiting / idle shares. Parallel efficiency = ideal ÷ measured epoch with ideal =
``local`` (measured in its child) ÷ R × (C' + S − 1) / C' (``graph``: ÷ R only, its one-process
reference being ``single``). On this 2-core machine R = 4 ranks cannot beat 2 cores, so the
table also gives the core-bound ideal (÷ min(R, cores)), and the side-by-side one, whose
reference is measured with the other cores busy too.

Run (from the repository root)::

    .venv/bin/python benchmarks/efficiency.py            # ~16 min, writes results/efficiency.*
    .venv/bin/python benchmarks/efficiency.py --quick    # smoke test, writes nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import pandas as pd
import torch
from _common import (
    add_output_args,
    environment,
    finish,
    output_dir,
    payload,
    run_child,
    run_children,
    serve_child,
    write_results,
)

import gnnpipe as gp
from gnnpipe.analysis.efficiency import CLASSES, Layout
from gnnpipe.core.job import TrainConfig

MODELS, HIDDEN = ("gcn", "gcnii"), 64
MB = 2**20


def graph(nodes: int) -> Any:
    return gp.datasets.synthetic(num_nodes=nodes, avg_degree=10, num_classes=8, num_features=64,
                                 homophily=0.8, seed=0)


def build(name: str, data: Any, layers: int) -> Any:
    torch.manual_seed(0)
    return gp.models.build(name, data.num_features, 8, layers, HIDDEN)


def kwargs_of(mode: str, ranks: int, chunks: int) -> dict[str, int]:
    return {"single": {}, "local": {"stages": ranks, "chunks": chunks},
            "pipeline": {"stages": ranks, "chunks": chunks}, "graph": {"parts": ranks},
            "hybrid": {"ways": 2, "stages": 2, "chunks": chunks}}[mode]


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM")) * 1024


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def train(cfg: dict[str, Any], data: Any, **extra: Any) -> Any:
    return gp.train(build(cfg["model"], data, cfg["layers"]), data, cfg["mode"],
                    epochs=cfg["epochs"] + 1, eval_every=cfg["epochs"] + 10, progress=False,
                    **kwargs_of(cfg["mode"], cfg["ranks"], cfg["chunks"]), **extra)


def summarize(run: Any, cfg: dict[str, Any], rss: dict[int, int]) -> dict[str, Any]:
    timed = run.history.iloc[1:]
    row = {**cfg, "epoch_times": timed["epoch_time"].tolist(),
           "median_epoch_s": float(timed["epoch_time"].median()),
           "measured_bytes": int(timed["comm_bytes"].median()),
           "peak_rss_mb": {int(k): v / MB for k, v in rss.items()}}
    if cfg["mode"] not in ("single", "local"):
        per_epoch = run.efficiency().iloc[1:]
        row["span_s"] = float(per_epoch["span"].median())
        row["shares"] = {c: float(per_epoch[f"{c}_share"].median()) for c in CLASSES}
        row["rank_shares"] = run.rank_shares().round(4).to_dict(orient="index")
    return row


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """``single`` / ``local`` in this fresh process at ``cfg['threads']`` torch threads."""
    torch.set_num_threads(cfg["threads"])
    data = graph(cfg["nodes"])
    return summarize(train(cfg, data), cfg, {0: peak_rss()})


def side_by_side(ranks: int) -> int:
    """How many copies of a one-process reference run at once for ``ranks`` ranks: as many as
    the ranks can keep busy, at most one per core."""
    return min(ranks, os.cpu_count() or 1)


def configs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every configuration; ``copies`` > 1: that many copies of a one-process run at once."""
    base = {"nodes": args.nodes, "layers": args.layers, "epochs": args.epochs, "copies": 1,
            "chunks": args.chunks}
    rows = []
    for model in MODELS:
        rows.append({**base, "model": model, "mode": "single", "ranks": 1, "threads": 1})
        for copies in sorted({side_by_side(r) for r in args.ranks} - {1}):
            rows.append({**base, "model": model, "mode": "single", "ranks": 1, "threads": 1,
                         "copies": copies})
        for ranks in args.ranks:
            rows.append({**base, "model": model, "mode": "single", "ranks": 1, "threads": ranks})
            rows += [{**base, "model": model, "mode": m, "ranks": ranks, "threads": 1}
                     for m in ("local", "pipeline", "graph")]
            if side_by_side(ranks) > 1:
                rows.append({**base, "model": model, "mode": "local", "ranks": ranks,
                             "threads": 1, "copies": side_by_side(ranks)})
            if ranks == 4:
                rows.append({**base, "model": model, "mode": "hybrid", "ranks": 4, "threads": 1})
    return rows


def key(r: dict[str, Any]) -> tuple:
    """A configuration's identity across rounds."""
    return r["model"], r["mode"], r["ranks"], r["threads"], r["copies"]


def run_copies(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg['copies']`` copies of a one-process run at once, as one row: every copy's epochs,
    the highest peak."""
    rows = run_children(__file__, [cfg] * cfg["copies"])
    times = [t for r in rows for t in r["epoch_times"]]
    return {**rows[0], "epoch_times": times, "median_epoch_s": statistics.median(times),
            "peak_rss_mb": {0: max(r["peak_rss_mb"]["0"] for r in rows)}}


def measure_one(cfg: dict[str, Any], data: Any, cluster: Any) -> dict[str, Any]:
    """One configuration: ``single``/``local`` in a fresh child, the others on ``cluster``."""
    if cfg["mode"] in ("single", "local"):
        return run_child(__file__, cfg) if cfg["copies"] == 1 else run_copies(cfg)
    cluster.client.run(reset_peak)
    run = train(cfg, data, cluster=cluster, timeout=600.0)
    hwm = cluster.client.run(peak_rss)
    ranks = cluster.workers()[:cfg["ranks"]]
    row = summarize(run, cfg, {r: hwm[w] for r, w in enumerate(ranks)})
    row["predicted_bytes"] = gp.comm_volume(build(cfg["model"], data, cfg["layers"]), data,
                                            cfg["mode"],
                                            **kwargs_of(cfg["mode"], cfg["ranks"], cfg["chunks"]))
    return row


def measure(args: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    """Every configuration once per round, the order reversed every other round so the
    machine's drift meets all of them; the rounds pooled (:func:`pool`). A round's one-process
    runs go first, with no cluster up (no worker processes beside them, as in a plain script);
    its distributed runs get a fresh cluster."""
    todo = configs(args)
    data = graph(args.nodes)
    rounds = []
    for k in range(args.rounds):
        order = todo if k % 2 == 0 else todo[::-1]
        done = []
        for cfg in (c for c in order if c["mode"] in ("single", "local")):
            done.append(measure_one(cfg, data, None))
            log(done[-1])
        with gp.Cluster(n_workers=max(args.ranks)) as cluster:
            for cfg in (c for c in order if c["mode"] not in ("single", "local")):
                done.append(measure_one(cfg, data, cluster))
                log(done[-1])
        rounds.append(done)
    return pool(rounds)


def pool(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per configuration: every round's timed epochs together (their median is the
    row's epoch time), the highest peak, the median of the rounds' shares."""
    runs: dict[tuple, list[dict[str, Any]]] = {}
    for r in (r for done in rounds for r in done):
        runs.setdefault(key(r), []).append(r)
    pooled = []
    for r in rounds[0]:
        same = runs[key(r)]
        row = {**r, "epoch_times": [t for s in same for t in s["epoch_times"]],
               "round_medians": [s["median_epoch_s"] for s in same],
               "peak_rss_mb": {k: max(s["peak_rss_mb"][k] for s in same) for k in r["peak_rss_mb"]}}
        row["median_epoch_s"] = statistics.median(row["epoch_times"])
        if "shares" in r:
            row["shares"] = {c: statistics.median(s["shares"][c] for s in same) for c in CLASSES}
            row["span_s"] = statistics.median(s["span_s"] for s in same)
        pooled.append(row)
    return pooled


def table(results: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per distributed run with its ratios and efficiencies."""
    cores = os.cpu_count() or 1
    by = {key(r): r["median_epoch_s"] for r in results}
    rows = []
    for r in (r for r in results if r["mode"] in ("pipeline", "graph", "hybrid")):
        m, R = r["model"], r["ranks"]
        single, local = by[(m, "single", 1, 1, 1)], by[(m, "local", R, 1, 1)]
        k = side_by_side(R)
        shared = by.get((m, "single", 1, 1, k) if r["mode"] == "graph" else (m, "local", R, 1, k))
        layout = Layout.of(TrainConfig.from_dict({
            "mode": r["mode"], "stages": R if r["mode"] == "pipeline" else 2,
            "ways": 2 if r["mode"] == "hybrid" else 1, "parts": R, "chunks": r["chunks"]}))
        reference = single if r["mode"] == "graph" else local
        ideal = layout.ideal(reference)
        core_ideal = ideal * R / min(R, cores)
        shared_ideal = core_ideal * shared / reference if shared is not None else float("nan")
        rows.append({"model": m, "ranks": R, "mode": r["mode"], "epoch_s": r["median_epoch_s"],
                     "x_single_1t": r["median_epoch_s"] / single,
                     "x_single_Rt": r["median_epoch_s"] / by[(m, "single", 1, R, 1)],
                     "local_x_single": local / single, "ideal_s": ideal,
                     "efficiency": ideal / r["median_epoch_s"],
                     "core_bound_efficiency": core_ideal / r["median_epoch_s"],
                     "side_by_side_efficiency": shared_ideal / r["median_epoch_s"],
                     **{f"{c}_share": r["shares"][c] for c in CLASSES},
                     "bytes": r["measured_bytes"], "predicted_bytes": r["predicted_bytes"],
                     "peak_rss_mb": max(r["peak_rss_mb"].values())})
    frame = pd.DataFrame(rows)
    graph_s = frame[frame["mode"] == "graph"].set_index(["model", "ranks"])["epoch_s"]
    frame["x_graph"] = [row.epoch_s / graph_s[(row.model, row.ranks)]
                        for row in frame.itertuples()]
    return frame


def markdown(results: list[dict[str, Any]], frame: pd.DataFrame, env: dict[str, Any],
             args: argparse.Namespace) -> str:
    head = (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs; load "
            f"{env['loadavg_start'][0]:.1f} at start, {env['loadavg_end'][0]:.1f} at end) · median "
            f"of {args.epochs} epochs after 1 warm-up × {args.rounds} rounds (alternating order), "
            f"training only · wall "
            f"{env['wall_s'] / 60:.1f} min")
    one = pd.DataFrame([{"model": r["model"], "mode": r["mode"], "ranks": r["ranks"],
                         "threads": r["threads"], "copies_at_once": r["copies"],
                         "epoch_s": r["median_epoch_s"],
                         "peak_rss_mb": max(r["peak_rss_mb"].values())}
                        for r in results if r["mode"] in ("single", "local")])
    title = (f"# Parallel efficiency ({args.nodes:,} nodes, {args.layers} layers, hidden "
             f"{HIDDEN}, {args.chunks} chunks)")
    lines = [title, "", head, "", "## One process", "",
             one.to_markdown(index=False, floatfmt=".3f"), "",
             locality(args.nodes, args.chunks), "",
             "## Distributed (1 thread per rank)",
             "", frame.drop(columns=["local_x_single"]).to_markdown(index=False, floatfmt=".3f"),
             "", NOTE, ""]
    for row in frame.itertuples():
        lines.append(f"- {row.model} {row.mode} × {row.ranks}: {row.x_single_1t:.2f}× single "
                     f"(1 thread), efficiency {row.efficiency:.0%} (core-bound "
                     f"{row.core_bound_efficiency:.0%}, side by side "
                     f"{row.side_by_side_efficiency:.0%}), {row.x_graph:.2f}× graph; bytes "
                     f"{'==' if row.bytes == row.predicted_bytes else '!='} gp.comm_volume.")
    return "\n".join(lines) + "\n"


def locality(nodes: int, chunks: int) -> str:
    """How much of a chunk's aggregation reads other chunks' rows (what the chunked epoch pays
    beyond single: those rows are cold in cache when the chunk runs)."""
    parts = gp.chunk(graph(nodes), chunks, seed=0)
    return (f"Chunks ({chunks}, `gp.chunk`, seed 0): {parts.edge_cut_fraction:.1%} of "
            f"the edges join two chunks; a chunk reads {parts.halo_rows.mean():,.0f} other "
            f"chunks' rows on average (its own: {parts.sizes.mean():,.0f}).")


NOTE = ("`x_single_1t`: epoch ÷ single at 1 thread; `x_single_Rt`: ÷ single at R threads; "
        "`efficiency` = ideal ÷ epoch with ideal = local (same S and chunks, 1 thread) ÷ R × "
        "(C'+S−1)/C' (graph: single ÷ R); `core_bound_efficiency` uses ÷ min(R, cores) instead "
        "of ÷ R (4 ranks on 2 cores can at best run 2 at a time); `side_by_side_efficiency` "
        "also takes its reference from min(R, cores) copies of it run at once (`copies_at_once` "
        "above): what this machine's cores deliver together, which on a machine whose cores "
        "share memory bandwidth is less than the number of cores times one core alone. Shares: "
        "the ranks' median split of each epoch (gnnpipe.analysis.efficiency). Bytes: training bytes per "
        "epoch, measured and predicted.")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=4, help="timed epochs after 1 warm-up")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--chunks", type=int, default=8, help="chunks per epoch of the chunked modes")
    ap.add_argument("--rounds", type=int, default=2,
                    help="measure every configuration this many times, alternating the order")
    add_output_args(ap, child=True)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    if args.quick:
        args.nodes, args.layers, args.epochs, args.rounds = 2_000, 4, 2, 1
    start, env = time.perf_counter(), environment()

    def log(r: dict[str, Any]) -> None:
        print(f"{r['model']} {r['mode']} R={r['ranks']} threads={r['threads']} "
              f"copies={r['copies']}: "
              f"{statistics.median(r['epoch_times']):.3f} s/epoch", flush=True)

    results = measure(args, log)
    frame = table(results)
    finish(env, start)
    print(frame.to_string(float_format=lambda v: f"{v:.3f}"))
    out = output_dir(args)
    if out is not None:
        write_results(out, "efficiency", payload(env, frame, results, args),
                      markdown(results, frame, env, args))


if __name__ == "__main__":
    main()
