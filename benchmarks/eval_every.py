"""What the exact full-graph evaluation costs, and what ``eval_every`` saves.

Trains a 32-layer GCNII (hidden 64) on Cora for ``--epochs`` epochs in ``single`` mode and in
``pipeline`` mode (2 stages, 8 chunks, on one 2-worker local Dask cluster reused by every run),
each with ``eval_every=1`` (the default: evaluate after every epoch) and ``eval_every=10``.
Reports the wall-clock seconds of the whole ``gp.train`` call per epoch (it includes the run's
start-up, the same for both settings) and the median training epoch (which excludes evaluation),
and the speed-up of evaluating every 10th epoch. Settings alternate within each round (order
reversed every other round) so machine noise hits both.

Run (from the repository root)::

    .venv/bin/python benchmarks/eval_every.py             # ~5 min on 2 cores
    .venv/bin/python benchmarks/eval_every.py --quick     # smoke test, writes nothing

Writes ``benchmarks/results/eval_every.{json,md}``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import pandas as pd
from _common import add_output_args, environment, finish, output_dir, payload, write_results

GCNII = {"hidden": 64, "layers": 32, "alpha": 0.1, "theta": 0.5, "dropout": 0.6}
MODES: dict[str, dict[str, int]] = {"single": {}, "pipeline": {"stages": 2, "chunks": 8}}
EVERY = (1, 10)


def measure(mode: str, every: int, epochs: int, data: Any, cluster: Any) -> dict[str, Any]:
    import torch

    import gnnpipe as gp

    torch.manual_seed(0)
    model = gp.models.gcnii(data.num_features, out_dim=int(data.y.max()) + 1, **GCNII)
    extra = {"cluster": cluster} if mode != "single" else {}
    began = time.perf_counter()
    run = gp.train(model, data, mode, epochs=epochs, eval_every=every, progress=False,
                   **MODES[mode], **extra)
    wall = time.perf_counter() - began
    return {"mode": mode, "eval_every": every, "wall_s_per_epoch": wall / epochs,
            "median_train_epoch_s": float(run.history["epoch_time"].median()),
            "evaluations": int(run.history["val_acc"].notna().sum()),
            "best_test_acc": run.best["test_acc"]}


def summarize(results: list[dict[str, Any]]) -> pd.DataFrame:
    df = (pd.DataFrame(results).groupby(["mode", "eval_every"], sort=False)
          .agg(wall_s_per_epoch=("wall_s_per_epoch", "median"),
               median_train_epoch_s=("median_train_epoch_s", "median"),
               evaluations=("evaluations", "first")).reset_index())
    every_epoch = df[df["eval_every"] == 1].set_index("mode")["wall_s_per_epoch"]
    df["speedup_vs_every_epoch"] = every_epoch.loc[df["mode"]].to_numpy() / df["wall_s_per_epoch"]
    return df


def markdown(df: pd.DataFrame, env: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"# Cost of evaluation: Cora GCNII-32, {args.epochs} epochs, `eval_every` 1 vs 10",
             "", (f"{env['date']} · torch {env['torch']} · {env['cpu_count']} CPUs, shared · load "
                  f"{env['loadavg_start'][0]:.1f} at start · {args.rounds} rounds, medians"), "",
             ("| mode | eval_every | evaluations | wall s/epoch | median training epoch s | "
              "speed-up vs every epoch |"), "|---|---:|---:|---:|---:|---:|"]
    for r in df.itertuples():
        lines.append(f"| {r.mode} | {r.eval_every} | {r.evaluations} | {r.wall_s_per_epoch:.3f} | "
                     f"{r.median_train_epoch_s:.3f} | {r.speedup_vs_every_epoch:.2f}× |")
    lines += ["", ("Wall s/epoch: the whole `gp.train` call over the epochs (includes start-up). "
                   "Training epochs exclude evaluation, so they should not move. Pipeline "
                   "evaluation is one exact full-graph forward through the stages in turn, with "
                   "nothing to overlap it.")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    add_output_args(ap)
    args = ap.parse_args()
    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    if args.quick:
        args.epochs, args.rounds = 10, 1
    out = output_dir(args)
    env, start = environment(), time.perf_counter()
    data = gp.datasets.load("cora")
    results = []
    with gp.Cluster(n_workers=2) as cluster:
        for rnd in range(args.rounds):
            for mode in MODES:
                for every in EVERY if rnd % 2 == 0 else EVERY[::-1]:
                    r = measure(mode, every, args.epochs, data, cluster)
                    results.append({**r, "round": rnd})
                    print(f"[{time.perf_counter() - start:4.0f}s] {mode:8s} every {every:2d}: "
                          f"{r['wall_s_per_epoch']:.3f} s/epoch wall, training "
                          f"{r['median_train_epoch_s']:.3f} s", flush=True)
    finish(env, start)
    df = summarize(results)
    text = markdown(df, env, args)
    print(text)
    if out is not None:
        write_results(out, "eval_every", payload(env, df, results, args), text)


if __name__ == "__main__":
    main()
