"""What subnormal floats cost a deep model's epochs, and what flushing them (gnnpipe's default) saves.

A GCN-32 (hidden 64, no residuals) trained on a synthetic 50,000-node graph: its early layers'
gradients shrink as it trains, and once some fall below float32's smallest normal value
(1.18e-38) x86 arithmetic on them runs many times slower. Each configuration trains in a fresh
child process, once with ``GNNPIPE_DENORMALS=keep`` (IEEE subnormals) and once with the default
(flushed to zero), the two alternating; ``single`` at 1 torch thread and ``pipeline`` on 2 ranks ×
1 thread (8 chunks, its own 2-worker cluster, started in the child so the workers inherit the
setting). Reported: the median epoch over the first and the last ``--window`` epochs, and the
share of the first block's weight gradient that is subnormal at the end (single only: the
pipeline's weights come back, its gradients stay on the ranks).

Run (from the repository root)::

    .venv/bin/python benchmarks/denormals.py          # ~10 min, writes results/denormals.*
    .venv/bin/python benchmarks/denormals.py --quick  # smoke test, writes nothing
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import pandas as pd
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

SETTINGS = {"flushed": {}, "kept": {"GNNPIPE_DENORMALS": "keep"}}


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train one configuration; its per-epoch times and, in single mode, the first block's
    subnormal gradient share."""
    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    data = gp.datasets.synthetic(num_nodes=cfg["nodes"], avg_degree=10, num_classes=8,
                                 num_features=64, homophily=0.8, seed=0)
    torch.manual_seed(0)
    model = gp.models.gcn(64, hidden=64, out_dim=8, layers=cfg["layers"])
    extra = {"stages": 2, "chunks": 8} if cfg["mode"] == "pipeline" else {}
    run = gp.train(model, data, cfg["mode"], epochs=cfg["epochs"], eval_every=cfg["epochs"],
                   progress=False, timeout=1800.0, **extra)
    grad = next(model.blocks[0].parameters()).grad
    tiny = torch.finfo(torch.float32).tiny
    share = (None if grad is None else
             float(((grad != 0) & (grad.abs() < tiny)).float().mean()))
    return {"epoch_s": run.history["epoch_time"].tolist(), "subnormal_grad_share": share}


def measure(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for mode in ("single", "pipeline"):
        for setting in (("flushed", "kept") if mode == "single" else ("kept", "flushed")):
            cfg = {"mode": mode, "nodes": args.nodes, "layers": args.layers, "epochs": args.epochs}
            got = run_child(__file__, cfg, env=SETTINGS[setting])
            times, w = got["epoch_s"], args.window
            rows.append({"mode": mode, "denormals": setting,
                         "first_epochs_s": statistics.median(times[1:1 + w]),
                         "last_epochs_s": statistics.median(times[-w:]),
                         "subnormal_grad_share": got["subnormal_grad_share"], "epoch_s": times})
            print({k: v for k, v in rows[-1].items() if k != "epoch_s"}, flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows).drop(columns="epoch_s")
    frame["slowdown"] = frame["last_epochs_s"] / frame["first_epochs_s"]
    kept = frame[frame["denormals"] == "kept"].set_index("mode")["last_epochs_s"]
    frame["kept_over_flushed"] = [kept[m] / t if d == "flushed" else float("nan")
                                  for m, d, t in frame[["mode", "denormals", "last_epochs_s"]]
                                  .itertuples(index=False)]
    return frame


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--window", type=int, default=5)
    add_output_args(ap, child=True)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    if args.quick:
        args.nodes, args.layers, args.epochs, args.window = 2_000, 4, 4, 1
    start, env = time.perf_counter(), environment(threads=1, cpus=os.cpu_count())
    rows = measure(args)
    finish(env, start)
    frame = table(rows)
    print(frame.to_string())
    out = output_dir(args)
    if out is None:
        return
    text = "\n".join([
        f"# Subnormal floats: GCN-{args.layers}, {args.nodes:,} nodes, {args.epochs} epochs", "",
        (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs; load "
         f"{env['loadavg_start'][0]:.1f} at start, {env['loadavg_end'][0]:.1f} at end) · 1 torch "
         f"thread per process · medians of epochs 2-{1 + args.window} and of the last "
         f"{args.window} · wall {env['wall_s'] / 60:.1f} min"), "",
        frame.to_markdown(index=False, floatfmt=".3f"), "",
        ("`kept`: `GNNPIPE_DENORMALS=keep` (IEEE subnormals); `flushed`: gnnpipe's default. "
         "`slowdown`: last epochs ÷ first; `kept_over_flushed`: the kept run's last epochs ÷ "
         "the flushed run's. `subnormal_grad_share`: of the first block's weight gradient's "
         "nonzero-or-not entries, the subnormal ones, after the last epoch (single only)."), ""])
    write_results(out, "denormals", payload(env, frame, rows, args), text)


if __name__ == "__main__":
    main()
