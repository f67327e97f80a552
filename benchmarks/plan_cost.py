"""What ``gp.plan`` costs at the sizes users run (issue #25): planning seconds, by phase, against
epochs of the layout it picks.

GCNII-32 (hidden 64; ``capped.py``'s model) on planted-partition graphs of ``--nodes`` nodes (average degree 10, 64
features), 2 workers, one torch thread per rank. Per size, in a fresh process: ``gp.plan`` on a
cluster already running (``cluster=``, as before a training run on it), then the pick trained
``--epochs`` epochs on that cluster (its median epoch after the first), then ``gp.plan`` again
without ``cluster=`` (the workers it starts and closes count). Planning epochs: planning seconds
÷ the pick's median epoch (the issue asks for fewer than ten).

Run (from the repository root)::

    .venv/bin/python benchmarks/plan_cost.py               # 50K, 100K, 200K nodes (~8 min)
    .venv/bin/python benchmarks/plan_cost.py --quick       # smoke test, writes nothing

Writes ``benchmarks/results/plan_cost.{json,md}``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from _common import (
    add_output_args,
    environment,
    finish,
    output_dir,
    payload,
    run_child,
    serve_child,
    write_results,
)
from capped import _case

WORKERS = 2


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    import copy

    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    model, data = _case(cfg["nodes"])
    with gp.Cluster(n_workers=WORKERS) as cluster:
        began = time.perf_counter()
        plan = gp.plan(model, data, workers=WORKERS, cluster=cluster)
        planning_s = time.perf_counter() - began
        run = gp.train(copy.deepcopy(model), data, plan=plan, epochs=cfg["epochs"],
                       cluster=cluster, progress=False, eval_every=cfg["epochs"] + 1,
                       timeout=1800.0)
    times = run.history["epoch_time"].tolist()
    began = time.perf_counter()
    own = gp.plan(model, data, workers=WORKERS)
    own_s = time.perf_counter() - began
    return {**cfg, "pick": plan.layout.describe(), "predicted_s": plan.epoch_time,
            "epoch_times": times, "epoch_s": statistics.median(times[1:]),
            "planning_s": planning_s, "phases": plan.seconds,
            "own_pick": own.layout.describe(), "own_planning_s": own_s,
            "own_phases": own.seconds}


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    lines = ["# What planning costs: GCNII-32, hidden 64, 2 workers", "",
             (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs, "
              f"shared; load {env['loadavg_start'][0]:.1f} at start, "
              f"{env['loadavg_end'][0]:.1f} at end) · 1 torch thread per rank"), "",
             ("| nodes | pick | epoch s (predicted) | `cluster=`: planning s | phases s | "
             "planning epochs | own workers: planning s | planning epochs |"),
             "|---:|---|---|---:|---|---:|---:|---:|"]
    for r in rows:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items() if v >= 0.05)
        own = "" if r["own_pick"] == r["pick"] else f" (picked {r['own_pick']})"
        lines.append(
            f"| {r['nodes']:,} | {r['pick']} | {r['epoch_s']:.2f} ({r['predicted_s']:.2f}) | "
            f"{r['planning_s']:.1f} | {phases} | **{r['planning_s'] / r['epoch_s']:.1f}** | "
            f"{r['own_planning_s']:.1f}{own} | {r['own_planning_s'] / r['epoch_s']:.1f} |")
    lines += ["", ("Epoch: the pick's median epoch after the first, trained on the cluster it "
                   "was planned on. Phases: the plan's own (`plan.seconds`); `profile` includes "
                   "sending the graph and measuring the link, `swap_wait` the short `graph` run "
                   "made when a graph layout contends.")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_args(ap, child=True)
    ap.add_argument("--nodes", type=int, nargs="+", default=[50_000, 100_000, 200_000])
    ap.add_argument("--epochs", type=int, default=4)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    sizes = [5_000] if args.quick else args.nodes
    out = output_dir(args)
    env, start = environment(), time.perf_counter()
    rows = []
    for nodes in sizes:
        rows.append(run_child(__file__, {"nodes": nodes, "epochs": 3 if args.quick
                                         else args.epochs}))
        r = rows[-1]
        print(f"{nodes:,}: pick {r['pick']}, epoch {r['epoch_s']:.2f} s, planning "
              f"{r['planning_s']:.1f} s = {r['planning_s'] / r['epoch_s']:.1f} epochs", flush=True)
    finish(env, start)
    text = markdown(rows, env)
    print(text)
    if out is not None:
        import pandas as pd

        write_results(out, "plan_cost", payload(env, pd.DataFrame(rows), rows, args), text,
                      default=str)


if __name__ == "__main__":
    main()
