"""Ablation of GNNPipe's three convergence techniques (docs/design.md §5) on Cora.

Measures the test accuracy at the best validation epoch (``run.best["test_acc"]``) of a
32-layer GCNII (hidden 64, alpha 0.1, theta 0.5, dropout 0.6) trained with ``mode="local"``,
2 stages, 8 chunks, 500 epochs (Adam lr 0.01, weight decay 5e-4, GNN-layer weight decay 0.01),
for seeds 0, 1, 2 and these switches of :class:`gnnpipe.Techniques`:

* ``all``: every technique on (the default);
* ``no_random_order`` / ``no_snapshot`` / ``no_unbiased_grad``: one technique off;
* ``none``: all three off;
* ``single``: exact full-graph training, the reference.

``torch.manual_seed(seed)`` precedes building each model, and ``seed=seed`` goes to ``train``,
so every configuration of a seed starts from the same weights. Runs go to 2 spawned worker
processes (``torch.set_num_threads(1)`` each).

Run (from the repository root)::

    .venv/bin/python benchmarks/techniques.py               # full size (~25-45 min on 2 cores)
    .venv/bin/python benchmarks/techniques.py --quick       # smoke test, writes nothing
    .venv/bin/python benchmarks/techniques.py --epochs 200 --seeds 0 1

Writes ``benchmarks/results/techniques.json`` (per-run numbers, environment) and ``.md``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from _common import add_output_args, environment, finish, output_dir, payload, write_results

CONFIGS: dict[str, dict[str, Any]] = {
    "all": {"mode": "local", "techniques": {}},
    "no_random_order": {"mode": "local", "techniques": {"random_order": False}},
    "no_snapshot": {"mode": "local", "techniques": {"snapshot": False}},
    "no_unbiased_grad": {"mode": "local", "techniques": {"unbiased_grad": False}},
    "none": {"mode": "local",
             "techniques": {"random_order": False, "snapshot": False, "unbiased_grad": False}},
    "single": {"mode": "single", "techniques": None},
}
STAGES, CHUNKS, LR, WD, GNN_WD = 2, 8, 0.01, 5e-4, 0.01


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def run_one(name: str, seed: int, epochs: int, threads: int) -> dict[str, Any]:
    """Train one (configuration, seed) in the worker process; return its best epoch and timing."""
    import torch

    import gnnpipe as gp

    torch.set_num_threads(threads)
    cfg = CONFIGS[name]
    data = gp.datasets.load("cora")
    torch.manual_seed(seed)
    model = gp.models.gcnii(data.num_features, hidden=64, out_dim=7, layers=32, alpha=0.1,
                            theta=0.5, dropout=0.6)
    kw: dict[str, Any] = {}
    if cfg["mode"] == "local":
        kw = {"stages": STAGES, "chunks": CHUNKS, "techniques": gp.Techniques(**cfg["techniques"])}
    start = time.perf_counter()
    run = gp.train(model, data, cfg["mode"], epochs=epochs, lr=LR, weight_decay=WD,
                   gnn_weight_decay=GNN_WD, seed=seed, progress=False, **kw)
    h = run.history
    return {"config": name, "seed": seed, **run.best, "final_test_acc": float(h.test_acc.iloc[-1]),
            "final_loss": float(h.loss.iloc[-1]), "min_loss": float(h.loss.min()),
            "median_epoch_s": float(h.epoch_time.median()), "wall_s": time.perf_counter() - start,
            "threads": torch.get_num_threads()}


def summarize(results: list[dict[str, Any]]) -> Any:
    import pandas as pd

    rows = []
    for name in CONFIGS:
        rs = sorted((r for r in results if r["config"] == name), key=lambda r: r["seed"])
        if not rs:
            continue
        accs = [r["test_acc"] for r in rs]
        rows.append({"config": name, "mode": CONFIGS[name]["mode"],
                     "per_seed": " ".join(f"{a:.3f}" for a in accs),
                     "mean": statistics.mean(accs),
                     "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                     "best_epoch": " ".join(str(r["epoch"]) for r in rs),
                     "final_loss": statistics.mean(r["final_loss"] for r in rs),
                     "epoch_s": statistics.median(r["median_epoch_s"] for r in rs)})
    return pd.DataFrame(rows)


def markdown(df: Any, env: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"# GNNPipe convergence techniques: ablation on Cora (GCNII-32, {args.epochs} epochs)",
             "", (f"{env['date']} · torch {env['torch']} · {env['workers']} worker processes × "
                  f"{env['threads']} thread · {env['cpu']} ({env['cpu_count']} CPUs, shared) · "
                  f"`mode=\"local\"`, {STAGES} stages, {CHUNKS} chunks; Adam lr {LR}, weight decay "
                  f"{WD} (GNN layers {GNN_WD}); seeds {' '.join(map(str, args.seeds))}"), "",
             ("| configuration | test acc per seed | mean ± std | best-val epoch per seed "
              "| final train loss (mean) |"), "|---|---|---:|---|---:|"]
    for r in df.itertuples():
        lines.append(f"| {r.config} | {r.per_seed} | {r.mean:.3f} ± {r.std:.3f} | {r.best_epoch} "
                     f"| {r.final_loss:.3f} |")
    ref = df.set_index("config")
    lines += ["", ("Test accuracy is taken at the epoch of best validation accuracy (exact "
                   "full-graph evaluation). std is the sample standard deviation over seeds."), ""]
    if {"all", "single"} <= set(ref.index):
        gap = ref.loc["all", "mean"] - ref.loc["single", "mean"]
        lines.append(f"- all techniques vs exact `single`: {gap:+.3f} mean test accuracy.")
    for name in ("no_random_order", "no_snapshot", "no_unbiased_grad", "none"):
        if name in ref.index and "all" in ref.index:
            d = ref.loc[name, "mean"] - ref.loc["all", "mean"]
            lines.append(f"- {name} vs all: {d:+.3f}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=500)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--workers", type=int, default=2)
    add_output_args(ap)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.quick:
        args.epochs, args.seeds = 5, [0]
    out = output_dir(args)

    env = environment(threads=args.threads, workers=args.workers)
    results, start = [], time.perf_counter()
    jobs = [(name, seed) for seed in args.seeds for name in CONFIGS]
    with ProcessPoolExecutor(max_workers=args.workers, mp_context=mp.get_context("spawn"),
                             initializer=_init_worker, initargs=(args.threads,)) as pool:
        futures = [pool.submit(run_one, name, seed, args.epochs, args.threads) for name, seed in jobs]
        for fut in as_completed(futures):
            r = fut.result()
            results.append(r)
            print(f"[{time.perf_counter() - start:6.0f}s] {r['config']:17s} seed {r['seed']}  "
                  f"test@best-val {r['test_acc']:.3f} (epoch {r['epoch']})  "
                  f"epoch {r['median_epoch_s']:.3f}s", flush=True)
    finish(env, start)
    df = summarize(results)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if out is not None:
        runs = sorted(results, key=lambda r: (r["config"], r["seed"]))
        write_results(out, "techniques", payload(env, df, runs, args), markdown(df, env, args))


if __name__ == "__main__":
    main()
