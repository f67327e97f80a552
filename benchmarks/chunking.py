"""Chunking: METIS's own parts (``parts_per_chunk=1``, the default) against the GNNPipe paper's
random merge of 4 METIS parts per chunk (``parts_per_chunk=4``), side by side.

Part ``speed``: GCN-32 and GCNII-32 (hidden 64) on the synthetic 50K-node graph of
``efficiency.py``, 1 torch thread, ``single`` and ``local`` (2 stages x 8 chunks) at both chunkings,
each in a fresh child process, rounds alternating; median epoch time of epochs 1.. (training only).
Also the chunks' locality per graph (synthetic 50K, Cora, Facebook): the share of edges between
two chunks and the other chunks' rows a chunk's aggregation reads.

Part ``accuracy``: test accuracy at the best-validation epoch, 500 epochs, of
``pyg_accuracy.py``'s Cora cases (PyG ``GAT`` without and with dropout 0.6): ``single`` and the
chunked epoch (``local``, 2 x 8; what ``pipeline`` runs) with every technique on and with gnnpipe's
default for PyG models (``local_fresh``: snapshot and unbiased gradients off), at both chunkings.

Run (from the repository root)::

    .venv/bin/python benchmarks/chunking.py                    # both parts (~20 min on 2 cores)
    .venv/bin/python benchmarks/chunking.py --parts speed      # one part (keeps the other's rows)
    .venv/bin/python benchmarks/chunking.py --quick            # smoke test, writes nothing
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import pandas as pd
import torch
from _common import (
    accuracy_rows,
    add_output_args,
    environment,
    finish,
    output_dir,
    run_child,
    run_pool,
    serve_child,
    write_results,
)
from efficiency import build, graph

import gnnpipe as gp

CHUNKINGS = (1, 4)  # parts_per_chunk
ACCURACY_CASES = ("cora/gat", "cora/gat_dropout")
ACCURACY_CONFIGS = ("local", "local_fresh")


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One ``single`` or ``local`` run in this fresh process."""
    torch.set_num_threads(1)
    data = graph(cfg["nodes"])
    extra = {} if cfg["mode"] == "single" else {
        "stages": 2, "chunks": 8, "parts_per_chunk": cfg["parts_per_chunk"]}
    run = gp.train(build(cfg["model"], data, cfg["layers"]), data, cfg["mode"],
                   epochs=cfg["epochs"] + 1, eval_every=cfg["epochs"] + 10, progress=False,
                   **extra)
    return {**cfg, "median_epoch_s": float(run.history["epoch_time"].iloc[1:].median())}


def speed(args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = [{"mode": "single", "parts_per_chunk": None}] + [
        {"mode": "local", "parts_per_chunk": p} for p in CHUNKINGS]
    rows = []
    for rnd in range(args.rounds):
        for model in ("gcn", "gcnii"):
            for run in runs if rnd % 2 == 0 else runs[::-1]:
                cfg = {**run, "model": model, "nodes": args.nodes, "layers": args.layers,
                       "epochs": args.epochs, "round": rnd}
                rows.append(run_child(__file__, cfg))
                print(f"{model:6s} {run['mode']:6s} ppc {run['parts_per_chunk']}  "
                      f"{rows[-1]['median_epoch_s']:.3f} s/epoch", flush=True)
    return rows


def locality(nodes: int) -> list[dict[str, Any]]:
    graphs = {f"synthetic {nodes:,}": graph(nodes), "cora": gp.datasets.load("cora"),
              "facebook": gp.datasets.load("facebook")}
    rows = []
    for name, data in graphs.items():
        for ppc in CHUNKINGS:
            p = gp.chunk(data, 8, seed=0, parts_per_chunk=ppc)
            rows.append({"graph": name, "parts_per_chunk": ppc,
                         "edges_between_chunks": float(p.edge_cut_fraction),
                         "other_rows_read": float(p.halo_rows.mean()),
                         "own_rows": float(p.sizes.mean())})
    return rows


def accuracy_job(case: str, config: str, seed: int, epochs: int,
                 parts_per_chunk: int | None) -> dict[str, Any]:
    from pyg_accuracy import run_one

    extra = {} if parts_per_chunk is None else {"parts_per_chunk": parts_per_chunk}
    return {**run_one(case, config, seed, epochs, **extra), "parts_per_chunk": parts_per_chunk}


def accuracy(args: argparse.Namespace) -> list[dict[str, Any]]:
    jobs = [(case, "single", seed, args.acc_epochs, None)
            for case in ACCURACY_CASES for seed in args.seeds]
    jobs += [(case, config, seed, args.acc_epochs, ppc) for case in ACCURACY_CASES
             for config in ACCURACY_CONFIGS for ppc in CHUNKINGS for seed in args.seeds]
    return run_pool(accuracy_job, jobs, 2, 1, lambda r: (
        f"{r['case']:17s} {r['config']:12s} ppc {r['parts_per_chunk']}  seed {r['seed']}  "
        f"test@best-val {r['test_acc']:.3f}"))


def speed_table(rows: list[dict[str, Any]]) -> list[str]:
    df = pd.DataFrame(rows).fillna({"parts_per_chunk": 0})
    med = df.groupby(["model", "mode", "parts_per_chunk"]).median_epoch_s.median()
    lines = ["| model | single s/epoch | local, ppc 1 | ÷ single | local, ppc 4 | ÷ single |",
             "|---|---:|---:|---:|---:|---:|"]
    for model in ("gcn", "gcnii"):
        single, one, four = med[(model, "single", 0)], med[(model, "local", 1)], \
            med[(model, "local", 4)]
        lines.append(f"| {model} | {single:.3f} | {one:.3f} | {one / single:.2f} | {four:.3f} | "
                     f"{four / single:.2f} |")
    return lines


def accuracy_table(rows: list[dict[str, Any]]) -> list[str]:
    df = accuracy_rows(rows, ["case", "config", "parts_per_chunk"])
    single = {r.case: r.mean for r in df.itertuples() if r.config == "single"}
    lines = ["| case | configuration | parts per chunk | test acc per seed | mean | vs single |",
             "|---|---|---:|---|---:|---:|"]
    for r in df.itertuples():
        ppc = "–" if r.config == "single" else int(r.parts_per_chunk)
        gap = "" if r.config == "single" else f"{r.mean - single[r.case]:+.3f}"
        lines.append(f"| {r.case} | {r.config} | {ppc} | {r.per_seed} | {r.mean:.3f} | {gap} |")
    return lines


def markdown(record: dict[str, Any], env: dict[str, Any]) -> str:
    lines = ["# Chunking: METIS's own parts vs 4 parts merged at random", "",
             (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs) · "
             "1 torch thread per process"), "", "## Locality (8 chunks, seed 0)", "",
             ("| graph | parts per chunk | edges between chunks | other chunks' rows a chunk "
             "reads | its own rows |"), "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['graph']} | {r['parts_per_chunk']} | {r['edges_between_chunks']:.1%} | "
              f"{r['other_rows_read']:,.0f} | {r['own_rows']:,.0f} |" for r in record["locality"]]
    if record.get("speed"):
        lines += ["", (f"## Speed ({record['nodes']:,} nodes, 32 layers, hidden 64, 2 stages × 8 "
                  f"chunks; median over {record['rounds']} alternating rounds of each run's "
                  "median epoch)"), "", *speed_table(record["speed"])]
    if record.get("accuracy"):
        lines += ["", (f"## Accuracy (test at best validation, {record['acc_epochs']} epochs, chunked = `local` "
                  "2 × 8)"), "", *accuracy_table(record["accuracy"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="+", choices=("speed", "accuracy"),
                    default=["speed", "accuracy"])
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=4, help="timed epochs after 1 warm-up")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--acc-epochs", type=int, default=500)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    add_output_args(ap, child=True)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    if args.quick:
        args.nodes, args.layers, args.epochs, args.rounds = 5_000, 4, 1, 1
        args.acc_epochs, args.seeds = 3, [0]
    out = output_dir(args)
    earlier = None if out is None else out / "chunking.json"  # a run of one part keeps the other's
    record = json.loads(earlier.read_text()) if earlier is not None and earlier.exists() else {}
    env, start = environment(), time.perf_counter()
    record.update(nodes=args.nodes, rounds=args.rounds, acc_epochs=args.acc_epochs,
                  locality=locality(args.nodes))
    if "speed" in args.parts:
        record["speed"] = speed(args)
    if "accuracy" in args.parts:
        record["accuracy"] = accuracy(args)
    finish(env, start)
    record["environment"] = env
    if out is not None:
        write_results(out, "chunking", record, markdown(record, env))
    else:
        print(markdown(record, env))


if __name__ == "__main__":
    main()
