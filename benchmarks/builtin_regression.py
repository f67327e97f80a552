"""Built-in models' epoch time now against a baseline commit (issue: no regression from the PyG
work).

The baseline's ``gnnpipe/`` is extracted with ``git archive`` into a temporary folder and put
first on ``PYTHONPATH`` of its child processes (each child reports which ``gnnpipe`` it
imported). Workload: GCN-32 and GCNII-32 (hidden 64, dropout 0.5) on
``gp.datasets.synthetic(50_000, avg_degree=10)``, ``single`` and ``local`` (2 stages x 8
chunks), 1 torch thread, ``eval_every=100``; median training-epoch time of epochs 1..N-1. The
two trees alternate in rounds (order reversed every other round) so machine noise hits both;
the ratio now / baseline is the median over rounds of the per-round ratios.

Run (from the repository root)::

    .venv/bin/python benchmarks/builtin_regression.py                   # ~6 min on 2 cores
    .venv/bin/python benchmarks/builtin_regression.py --baseline HEAD~5
    .venv/bin/python benchmarks/builtin_regression.py --quick           # smoke test, writes nothing

Writes ``benchmarks/results/builtin_regression.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
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

#: The last commit before the PyG work (and this round's other engine changes) began.
BASELINE = "9641f26"
MODELS = ("gcn", "gcnii")
MODES = {"single": {}, "local": {"stages": 2, "chunks": 8}}
REPO = Path(__file__).resolve().parent.parent


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One (model, mode) with whichever gnnpipe this interpreter imports."""
    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    data = gp.datasets.synthetic(cfg["nodes"], avg_degree=10, seed=0)
    torch.manual_seed(0)
    model = gp.models.build(cfg["model"], data.num_features, 8, layers=32, hidden=64, dropout=0.5)
    run = gp.train(model, data, cfg["mode"], epochs=cfg["epochs"], eval_every=100,
                   progress=False, **MODES[cfg["mode"]])
    times = run.history["epoch_time"].tolist()[1:]
    return {**cfg, "epoch_s": statistics.median(times), "gnnpipe": gp.__file__}


def extract(ref: str, into: Path) -> str:
    """``gnnpipe/`` of ``ref`` under ``into``; returns the full commit id."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", ref], check=True,
                            capture_output=True, text=True).stdout.strip()
    tar = subprocess.run(["git", "-C", str(REPO), "archive", commit, "gnnpipe"], check=True,
                         capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return commit


def summarize(results: list[dict[str, Any]]) -> Any:
    import pandas as pd

    df = pd.DataFrame(results)
    rows = []
    for (model, mode), g in df.groupby(["model", "mode"], sort=False):
        by = g.pivot(index="round", columns="tree", values="epoch_s")
        rows.append({"model": model, "mode": mode, "baseline_s": by["baseline"].median(),
                     "now_s": by["now"].median(),
                     "ratio": float((by["now"] / by["baseline"]).median())})
    return pd.DataFrame(rows)


def markdown(df: Any, env: dict[str, Any], args: argparse.Namespace, commit: str) -> str:
    lines = ["# Built-in models: epoch time now vs before the PyG work", "",
             (f"{env['date']} · torch {env['torch']} · 1 thread · {env['cpu']} "
              f"({env['cpu_count']} CPUs, shared) · synthetic {args.nodes:,} nodes, 32 layers, "
              f"hidden 64 · baseline `{commit[:10]}` ({args.baseline}) · {args.rounds} rounds"), "",
             "| model | mode | baseline s/epoch | now s/epoch | now ÷ baseline |",
             "|---|---|---:|---:|---:|"]
    for r in df.itertuples():
        lines.append(f"| {r.model} | {r.mode} | {r.baseline_s:.3f} | {r.now_s:.3f} | "
                     f"{r.ratio:.2f} |")
    lines += ["", "Ratio: median over rounds of the per-round ratio (the trees alternate)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", default=BASELINE, help="git revision to compare with")
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    add_output_args(ap, child=True)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    if args.quick:
        args.nodes, args.epochs, args.rounds = 2_000, 3, 1
    out = output_dir(args)
    env, start = environment(threads=1), time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        commit = extract(args.baseline, Path(tmp))
        trees = {"baseline": {"PYTHONPATH": tmp}, "now": {"PYTHONPATH": str(REPO)}}
        for rnd in range(args.rounds):
            order = list(trees) if rnd % 2 == 0 else list(reversed(trees))
            for model in MODELS:
                for mode in MODES:
                    for tree in order:
                        cfg = {"model": model, "mode": mode, "nodes": args.nodes,
                               "epochs": args.epochs}
                        r = run_child(__file__, cfg, env=trees[tree])
                        expected = tmp if tree == "baseline" else str(REPO)
                        if not r["gnnpipe"].startswith(expected):
                            raise RuntimeError(f"{tree}: imported {r['gnnpipe']}, not {expected}")
                        results.append({**r, "tree": tree, "round": rnd})
                        print(f"round {rnd} {model:6s} {mode:7s} {tree:9s} "
                              f"{r['epoch_s']:.3f} s/epoch", flush=True)
    finish(env, start)
    df = summarize(results)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if out is not None:
        write_results(out, "builtin_regression", payload(env, df, results, args),
                      markdown(df, env, args, commit))


if __name__ == "__main__":
    main()
