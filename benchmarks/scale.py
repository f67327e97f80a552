"""Large graphs: single vs a 2-rank pipeline, epoch time and peak memory per rank, and a
memory cap under which single training cannot run while the pipeline trains.

GCNII-32, hidden 64, on synthetic planted-partition graphs (avg degree 10, 8 classes, 64
features, homophily 0.8, seed 0), 8 chunks, one torch thread per process, training only.

Part 1, at each of ``--fit-nodes`` (default 200,000 and 300,000) and at ``--nodes`` (default
1,000,000): ``single`` in
a fresh child process vs ``pipeline`` (2 stages × 8 chunks, then with ``recompute=True``, then
recomputing with 16 chunks) on a 2-worker ``gp.Cluster``; median epoch time
and peak RSS (``VmHWM``) of the child and of each rank. ``single`` runs a second time with
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` (glibc maps every allocation above 32 MiB afresh, so
each full-graph tensor faults its pages in again; its minor page faults per epoch are recorded).
A size whose predicted peaks (a straight line through the sizes measured so far, peak = a + b·n;
one size: scaled by the node ratio) do not fit this machine's memory is not run; the record says
how much it would need, and the line's peaks and ratios there (an extrapolation, marked so).

Part 2, at the first ``--fit-nodes``: a 2-worker ``gp.Cluster`` whose workers each have ``memory_limit``
(default: halfway between the pipeline's per-rank peak and single's peak of part 1). ``single``
runs as a task on one capped worker (Dask's nanny terminates a worker at 95% of its limit), then
``pipeline`` with ``recompute=True`` on both capped workers. Both outcomes are recorded.

Run (from the repository root)::

    .venv/bin/python benchmarks/scale.py               # ~15 min, writes results/scale.*
    .venv/bin/python benchmarks/scale.py --quick       # smoke test, writes nothing
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from typing import Any

import dask
import psutil
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

LAYERS, HIDDEN, CHUNKS, GB = 32, 64, 8, 2**30
TERMINATE = 0.95  # distributed.worker.memory.terminate
#: glibc maps every allocation above 32 MiB afresh and unmaps it when freed, so each full-graph
#: tensor of ``single`` beyond ~131K nodes x 64 faults its pages in again; huge pages cut that
HUGE_PAGES = "glibc.malloc.hugetlb=1"


def graph(nodes: int) -> Any:
    return gp.datasets.synthetic(num_nodes=nodes, avg_degree=10, num_classes=8, num_features=64,
                                 homophily=0.8, seed=0)


def model(layers: int) -> Any:
    torch.manual_seed(0)
    return gp.models.gcnii(64, hidden=HIDDEN, out_dim=8, layers=layers, alpha=0.1, theta=0.5,
                           dropout=0.6)


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM")) * 1024


def train_single(nodes: int, layers: int, epochs: int) -> dict[str, Any]:
    """``single`` in this process (a child, or a task on a capped Dask worker)."""
    torch.set_num_threads(1)
    m, data = model(layers), graph(nodes)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    run = gp.train(m, data, "single", epochs=epochs + 1, eval_every=epochs + 10, progress=False)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"epoch_s": statistics.median(run.history["epoch_time"][1:]), "peak": peak_rss(),
            "minor_faults_per_epoch": faults / (epochs + 1)}


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    return train_single(cfg["nodes"], cfg["layers"], cfg["epochs"])


def train_pipeline(cluster: Any, nodes: int, layers: int, epochs: int,
                   recompute: bool = False, chunks: int = CHUNKS) -> dict[str, Any]:
    run = gp.train(model(layers), graph(nodes), "pipeline", stages=2, chunks=chunks,
                   epochs=epochs + 1, eval_every=epochs + 10, cluster=cluster, progress=False,
                   recompute=recompute, timeout=1800.0)
    return {"epoch_s": statistics.median(run.history["epoch_time"][1:]),
            # VmHWM since the rank started (run.memory(): the increment and what it started from)
            "peak_per_rank": (run.memory()["peak_bytes"] + run.memory()["baseline_bytes"]).tolist(),
            "efficiency": float(run.summary()["parallel_efficiency"].iloc[0])}


def compare(nodes: int, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    """Part 1 at one size."""
    cfg = {"nodes": nodes, "layers": args.layers, "epochs": args.epochs}
    single = run_child(__file__, cfg)
    log(f"{nodes:,} nodes single: {single}")
    huge = run_child(__file__, cfg, env={"GLIBC_TUNABLES": HUGE_PAGES})
    log(f"{nodes:,} nodes single, {HUGE_PAGES}: {huge}")
    with gp.Cluster(n_workers=2) as cluster:
        pipe = train_pipeline(cluster, nodes, args.layers, args.epochs)
        log(f"{nodes:,} nodes pipeline: {pipe}")
        recompute = train_pipeline(cluster, nodes, args.layers, args.epochs, recompute=True)
        log(f"{nodes:,} nodes pipeline, recompute: {recompute}")
        more = train_pipeline(cluster, nodes, args.layers, args.epochs, recompute=True,
                              chunks=2 * CHUNKS)
        log(f"{nodes:,} nodes pipeline, recompute, {2 * CHUNKS} chunks: {more}")
    return {"nodes": nodes, "single": single, "single_huge_pages": huge, "pipeline": pipe,
            "recompute": recompute, "recompute_more_chunks": more,
            "time_ratio": pipe["epoch_s"] / single["epoch_s"],
            "memory_ratio": max(pipe["peak_per_rank"]) / single["peak"],
            "recompute_memory_ratio": max(recompute["peak_per_rank"]) / single["peak"]}


def capped(nodes: int, limit: int, args: argparse.Namespace, log: Any) -> dict[str, Any]:
    """Part 2: single on one capped worker, then the pipeline with recompute on two."""
    outcome: dict[str, Any] = {"nodes": nodes, "memory_limit": limit}
    # no retries on another worker, no pausing at 80% (a paused worker runs no task): the
    # nanny's terminate threshold (95% of the limit) is the cap
    settings = {"distributed.scheduler.allowed-failures": 0,
                "distributed.worker.memory.pause": False}
    with dask.config.set(settings), gp.Cluster(n_workers=2, memory_limit=limit) as cluster:
        worker = cluster.workers()[0]
        future = cluster.client.submit(train_single, nodes, args.layers, args.epochs,
                                       workers=[worker], allow_other_workers=False, pure=False)
        try:
            outcome["single"] = {"trained": True, **future.result(timeout=3600)}
        except Exception as err:  # noqa: BLE001 - the outcome is the record
            outcome["single"] = {"trained": False, "error": f"{type(err).__name__}: {err}"[:300]}
        log(f"capped single: {outcome['single']}")
        try:
            outcome["pipeline"] = {"trained": True, **train_pipeline(
                cluster, nodes, args.layers, args.epochs, recompute=True)}
        except Exception as err:  # noqa: BLE001
            outcome["pipeline"] = {"trained": False, "error": f"{type(err).__name__}: {err}"[:300]}
        log(f"capped pipeline (recompute): {outcome['pipeline']}")
    return outcome


def peaks(row: dict[str, Any]) -> dict[str, float]:
    """The peaks of one measured size: single's, the largest rank's, both ranks' together."""
    return {"single": row["single"]["peak"],
            "pipeline_rank": max(row["pipeline"]["peak_per_rank"]),
            "recompute_rank": max(row["recompute"]["peak_per_rank"]),
            "recompute_more_chunks_rank": max(row["recompute_more_chunks"]["peak_per_rank"]),
            "pipeline_total": sum(row["pipeline"]["peak_per_rank"]),
            "recompute_total": sum(row["recompute"]["peak_per_rank"])}


def predicted_need(measured: list[dict[str, Any]], nodes: int) -> dict[str, float]:
    """Peak bytes at ``nodes``: a least-squares line ``a + b·n`` through the measured sizes
    (one size: scaled by the node ratio)."""
    sizes = [row["nodes"] for row in measured]
    out = {}
    for key in peaks(measured[0]):
        values = [peaks(row)[key] for row in measured]
        if len(sizes) == 1:
            out[key] = values[0] * nodes / sizes[0]
            continue
        slope, intercept = statistics.linear_regression(sizes, values)
        out[key] = intercept + slope * nodes
    return out


def not_run(measured: list[dict[str, Any]], nodes: int, available: float) -> dict[str, Any]:
    need = predicted_need(measured, nodes)
    sizes = ", ".join(f"{row['nodes']:,}" for row in measured)
    fit = f"a line through {sizes} nodes" if len(measured) > 1 else f"scaled from {sizes} nodes"
    return {"nodes": nodes, "need": need,
            "extrapolated_ratio": need["pipeline_rank"] / need["single"],
            "extrapolated_recompute_ratio": need["recompute_rank"] / need["single"],
            "extrapolated_recompute_more_chunks_ratio":
                need["recompute_more_chunks_rank"] / need["single"],
            "reason": (f"{fit}, single would peak at ~{need['single'] / GB:.0f} GiB and the two "
                       f"pipeline ranks at ~{need['pipeline_total'] / GB:.0f} GiB together "
                       f"(recomputing: ~{need['recompute_total'] / GB:.0f} GiB), against "
                       f"{available / GB:.0f} GiB available on this machine")}


def markdown(record: dict[str, Any], env: dict[str, Any]) -> str:
    lines = [f"# Scale: GCNII-{record['layers']} hidden {HIDDEN}, single vs 2-rank pipeline", "",
             (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs, "
             f"{env['memory_gb']:.0f} GB) · 1 torch thread per process · median of "
             f"{record['epochs']} epochs after 1 warm-up · wall {env['wall_s'] / 60:.1f} min"), "",
             ("| nodes | run | s/epoch | ÷ single | peak GiB (per rank) | peak per rank ÷ single "
              "| efficiency |"),
             "|---:|---|---:|---:|---|---:|---:|"]
    for row in record["compare"]:
        s = row["single"]
        lines.append(f"| {row['nodes']:,} | single | {s['epoch_s']:.2f} | 1.00 | "
                     f"{s['peak'] / GB:.2f} | 1.00 | – |")
        h = row["single_huge_pages"]
        lines.append(f"| {row['nodes']:,} | single, `GLIBC_TUNABLES={HUGE_PAGES}` | "
                     f"{h['epoch_s']:.2f} | {h['epoch_s'] / s['epoch_s']:.2f} | "
                     f"{h['peak'] / GB:.2f} | {h['peak'] / s['peak']:.2f} | – |")
        for key, label in (("pipeline", "pipeline 2 × 8"), ("recompute", "pipeline, recompute"),
                           ("recompute_more_chunks", f"pipeline 2 × {2 * CHUNKS}, recompute")):
            p = row[key]
            lines.append(f"| {row['nodes']:,} | {label} | {p['epoch_s']:.2f} | "
                         f"{p['epoch_s'] / s['epoch_s']:.2f} | "
                         f"{', '.join(f'{b / GB:.2f}' for b in p['peak_per_rank'])} | "
                         f"{max(p['peak_per_rank']) / s['peak']:.2f} | {p['efficiency']:.0%} |")
    for row in record["not_run"]:
        need = row["need"]
        lines.append(f"| {row['nodes']:,} | not run; extrapolated: single | – | – | "
                     f"~{need['single'] / GB:.1f} | – | – |")
        lines.append(f"| {row['nodes']:,} | not run; extrapolated: pipeline 2 × 8 | – | – | "
                     f"~{need['pipeline_rank'] / GB:.1f} | ~{row['extrapolated_ratio']:.2f} | – |")
        lines.append(f"| {row['nodes']:,} | not run; extrapolated: recompute | – | – | "
                     f"~{need['recompute_rank'] / GB:.1f} | "
                     f"~{row['extrapolated_recompute_ratio']:.2f} | – |")
        lines.append(f"| {row['nodes']:,} | not run; extrapolated: 2 × {2 * CHUNKS}, recompute "
                     f"| – | – | ~{need['recompute_more_chunks_rank'] / GB:.1f} | "
                     f"~{row['extrapolated_recompute_more_chunks_ratio']:.2f} | – |")
    cap = record["capped"]
    lines += ["", (f"## Memory cap: {cap['memory_limit'] / GB:.2f} GiB per Dask worker, "
              f"{cap['nodes']:,} nodes"), ""]
    for mode, label in (("single", "single"), ("pipeline", "pipeline, recompute=True")):
        o = cap[mode]
        text = (f"trained, {o['epoch_s']:.2f} s/epoch" if o["trained"] else
                f"did not train: {o['error']}")
        lines.append(f"- {label}: {text}")
    for row in record["not_run"]:
        lines += ["", f"{row['nodes']:,} nodes were not run here: {row['reason']}"]
    lines += ["", "Minor page faults per epoch of single: " + "; ".join(
        f"{row['nodes']:,} nodes {row['single']['minor_faults_per_epoch']:,.0f}, with huge pages "
        f"{row['single_huge_pages']['minor_faults_per_epoch']:,.0f}" for row in record["compare"])
        + " (glibc maps every allocation above 32 MiB afresh and unmaps it when freed)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--fit-nodes", type=int, nargs="+", default=[200_000, 300_000])
    ap.add_argument("--layers", type=int, default=LAYERS)
    ap.add_argument("--epochs", type=int, default=2, help="timed epochs after 1 warm-up")
    ap.add_argument("--memory-limit", type=float, default=None, help="GB per capped worker")
    add_output_args(ap, child=True)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    if args.quick:
        args.nodes, args.fit_nodes, args.layers, args.epochs = 20_000, [5_000, 8_000], 4, 1
    start, env = time.perf_counter(), environment()
    env["memory_gb"] = psutil.virtual_memory().total / GB

    def log(text: str) -> None:
        print(text, flush=True)

    record: dict[str, Any] = {"layers": args.layers, "epochs": args.epochs, "compare": [],
                              "not_run": []}
    for nodes in sorted(set(args.fit_nodes) | {args.nodes}):
        available = psutil.virtual_memory().available
        measured = record["compare"]
        if measured and max(predicted_need(measured, nodes).values()) >= 0.85 * available:
            record["not_run"].append(not_run(measured, nodes, available))
            log(f"{nodes:,} nodes not run: {record['not_run'][-1]['reason']}")
        else:
            record["compare"].append(compare(nodes, args, log))
    small = record["compare"][0]
    # Dask's nanny terminates a worker at 95% of its limit: put that halfway between the
    # recomputing pipeline's per-rank peak and single's peak
    between = (max(small["recompute"]["peak_per_rank"]) + small["single"]["peak"]) / 2
    limit = int(args.memory_limit * GB) if args.memory_limit else int(between / TERMINATE)
    record["capped"] = capped(small["nodes"], limit, args, log)
    finish(env, start)
    out = output_dir(args)
    if out is not None:
        write_results(out, "scale", {"environment": env, **record}, markdown(record, env))


if __name__ == "__main__":
    main()
