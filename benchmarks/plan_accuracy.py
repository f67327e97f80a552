"""Does ``gp.plan``'s predicted epoch hold, with and without ``cluster=``?

For each model/graph below, three plans for a 2-stage pipeline:

- ``default``: ``gp.plan(model, data, workers=2)``: profiled on 2 workers started for the profile
  the way ``gp.train`` starts its ranks (one torch thread, gnnpipe's worker environment);
- ``cluster``: ``gp.plan(..., cluster=cluster)``: profiled on the cluster that then trains;
- ``process``: ``gp.plan(..., profile=profile_model(model, data))``: profiled in this process
  (what the default did before), for reference.

Each plan trains right after its profile in ``pipeline`` mode on one 2-worker ``gp.Cluster``
(``--epochs`` timed epochs after 1 warm-up, training only); error = predicted ÷ measured median
epoch − 1. ``--rounds`` rounds (each in a rotated order) give the median error per profile.

Cases: the issue's GCNII-16 on 20,000 nodes with 2,000 features, and GCN-32 / GCNII-32 (hidden
64) on 50,000 nodes with 64 features (synthetic, avg degree 10, 8 classes, homophily 0.8).

Run (from the repository root)::

    .venv/bin/python benchmarks/plan_accuracy.py          # ~15 min, writes results/plan_accuracy.*
    .venv/bin/python benchmarks/plan_accuracy.py --quick  # smoke test, writes nothing
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import pandas as pd
import torch
from _common import add_output_args, environment, finish, output_dir, write_results

import gnnpipe as gp
from gnnpipe.plan import profile_model

#: name -> (model family, layers, nodes, features)
CASES = {"gcnii16-2000f": ("gcnii", 16, 20_000, 2_000), "gcn32": ("gcn", 32, 50_000, 64),
         "gcnii32": ("gcnii", 32, 50_000, 64)}


def case(name: str, quick: bool) -> tuple[Any, Any]:
    family, layers, nodes, features = CASES[name]
    if quick:
        layers, nodes, features = 4, 2_000, min(features, 64)
    data = gp.datasets.synthetic(num_nodes=nodes, avg_degree=10, num_classes=8,
                                 num_features=features, homophily=0.8, seed=0)
    torch.manual_seed(0)
    return gp.models.build(family, features, 8, layers, 64), data


PROFILES = ("default", "cluster", "process")


def plan_then_train(how: str, model: Any, data: Any, cluster: Any,
                    args: argparse.Namespace) -> dict[str, Any]:
    """One plan profiled the ``how`` way, trained at once on ``cluster``: this machine's speed
    drifts by tens of percent over minutes, so a plan is measured right after its profile."""
    began = time.perf_counter()
    extra = ({"cluster": cluster} if how == "cluster" else
             {"profile": profile_model(model, data, 8)} if how == "process" else {})
    plan = gp.plan(model, data, workers=2, **extra)
    seconds = time.perf_counter() - began
    run = gp.train(model, data, "pipeline", plan=plan, epochs=args.epochs + 1,
                   eval_every=args.epochs + 10, cluster=cluster, progress=False, timeout=600.0)
    measured = statistics.median(run.history["epoch_time"].iloc[1:])
    return {"profile": how, "ranges": [list(r) for r in plan.ranges], "chunks": plan.chunks,
            "predicted_s": plan.epoch_time, "measured_s": measured,
            "error": plan.epoch_time / measured - 1, "planning_s": seconds}


def measure(name: str, args: argparse.Namespace, log: Any) -> list[dict[str, Any]]:
    """``args.rounds`` rounds of the three profiles, each round in a rotated order."""
    model, data = case(name, args.quick)
    rows = []
    with gp.Cluster(n_workers=2) as cluster:
        for r in range(args.rounds):
            turn = r % len(PROFILES)
            for how in PROFILES[turn:] + PROFILES[:turn]:
                rows.append({"case": name, "round": r,
                             **plan_then_train(how, model, data, cluster, args)})
                log(rows[-1])
    return rows


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per case and profile: the median error over rounds, and the largest |error|."""
    grouped = frame.assign(abs_error=frame["error"].abs()).groupby(["case", "profile"], sort=False)
    return grouped.agg(median_error=("error", "median"), worst_abs_error=("abs_error", "max"),
                       rounds=("error", "size")).reset_index()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    add_output_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        args.epochs, args.rounds, args.cases = 1, 1, args.cases[:1]
    start, env = time.perf_counter(), environment()
    rows = [r for name in args.cases for r in measure(name, args, print)]
    finish(env, start)
    frame = pd.DataFrame(rows)
    table = summary(frame)
    print(frame.to_string())
    print(table.to_string())
    out = output_dir(args)
    if out is None:
        return
    text = "\n".join([
        "# gp.plan: predicted vs measured epoch (2-stage pipeline)", "",
        (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs; load "
         f"{env['loadavg_start'][0]:.1f} at start, {env['loadavg_end'][0]:.1f} at end) · median "
         f"of {args.epochs} epochs after 1 warm-up, training only · wall "
         f"{env['wall_s'] / 60:.1f} min"),
        "", table.to_markdown(index=False, floatfmt=".3f"), "", "Every plan:", "",
        frame.to_markdown(index=False, floatfmt=".3f"), "",
        ("`default`: no `cluster=` (profiled on 2 workers started like gp.train's ranks); "
         "`cluster`: profiled on the training cluster; `process`: profiled in the calling "
         "process (the old default), for reference. Each plan trains right after its "
         "profile; the rounds rotate the order. Target: |error| ≤ 20%."), ""])
    write_results(out, "plan_accuracy", {"environment": env, "rows": rows}, text)


if __name__ == "__main__":
    main()
