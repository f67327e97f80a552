"""Accuracy of compact historical buffers (issue #24, item 3): the chunked epoch with ``Hbuf``,
its snapshot and ``dZbuf`` stored in bfloat16 or float16 against float32, same seeds.

Cases (``local``, 2 stages x 8 chunks, gnnpipe's default techniques and chunking; test accuracy
at the best-validation epoch):

* ``cora/gcnii32``: GCNII-32 (hidden 64, alpha 0.1, theta 0.5, dropout 0.6), Adam lr 0.01,
  weight decay 5e-4 (GNN layers 0.01), 500 epochs: the settings of ``tests/test_accuracy.py``;
* ``squirrel/gcnii16``: GCNII-16 (hidden 64, dropout 0.5), lr 0.01, weight decay 5e-4, 300
  epochs: ``squirrel.py``'s settings;
* ``facebook/gcnii32``: GCNII-32 as on Cora, 200 epochs, evaluated every 5th;
* ``cora/gat``: PyG ``GAT`` (4 layers, hidden 64, 4 heads, no dropout), lr 0.005, weight decay
  5e-4, 500 epochs (``pyg_accuracy.py``'s).

Configurations: ``float32`` (the reference), ``bfloat16``, ``float16``.

Run (from the repository root)::

    .venv/bin/python benchmarks/history_dtype.py                     # every case, seeds 0-2
    .venv/bin/python benchmarks/history_dtype.py --cases cora/gcnii32 --dtypes float32 bfloat16
    .venv/bin/python benchmarks/history_dtype.py --quick             # smoke test, writes nothing

Writes ``benchmarks/results/history_dtype.json`` and ``.md``; a run keeps the earlier rows
(case, dtype, seed, epochs) it did not rerun.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from _common import (
    accuracy_rows,
    add_output_args,
    environment,
    finish,
    output_dir,
    payload,
    resume_journal,
    run_pool,
    write_results,
)

GCNII32 = {"builder": "gcnii", "hidden": 64, "layers": 32, "alpha": 0.1, "theta": 0.5,
           "dropout": 0.6}
DEEP_OPTIM = {"lr": 0.01, "weight_decay": 5e-4, "gnn_weight_decay": 0.01}
CASES: dict[str, dict[str, Any]] = {
    "cora/gcnii32": {"data": "cora", "model": GCNII32, "optim": DEEP_OPTIM, "epochs": 500,
                     "eval_every": 1},
    "squirrel/gcnii16": {"data": "squirrel", "epochs": 300, "eval_every": 1,
                         "model": {**GCNII32, "layers": 16, "dropout": 0.5},
                         "optim": {"lr": 0.01, "weight_decay": 5e-4}},
    "facebook/gcnii32": {"data": "facebook", "model": GCNII32, "optim": DEEP_OPTIM,
                         "epochs": 200, "eval_every": 5},
    "cora/gat": {"data": "cora", "model": {"builder": "gat"}, "epochs": 500, "eval_every": 1,
                 "optim": {"lr": 0.005, "weight_decay": 5e-4}},
}
DTYPES = ("float32", "bfloat16", "float16")


def build(spec: dict[str, Any], data: Any) -> Any:
    import gnnpipe as gp

    spec, classes = dict(spec), int(data.y.max()) + 1
    builder = spec.pop("builder")
    if builder == "gat":
        from torch_geometric.nn.models import GAT

        return GAT(data.num_features, 64, 4, out_channels=classes, heads=4)
    return gp.models.MODELS[builder](data.num_features, out_dim=classes, **spec)


def run_one(case: str, dtype: str, seed: int, epochs: int) -> dict[str, Any]:
    import torch

    import gnnpipe as gp

    spec = CASES[case]
    data = gp.datasets.load(spec["data"])
    torch.manual_seed(seed)
    model = build(spec["model"], data)
    run = gp.train(model, data, "local", stages=2, chunks=8, epochs=epochs, seed=seed,
                   eval_every=spec["eval_every"], progress=False, history_dtype=dtype,
                   **spec["optim"])
    return {"case": case, "dtype": dtype, "seed": seed, "epochs": epochs, **run.best,
            "final_loss": float(run.history.loss.iloc[-1]),
            "median_epoch_s": float(run.history.epoch_time.median()),
            "peak_bytes": int(run.memory()["peak_bytes"].max())}


def markdown(df: Any, env: dict[str, Any]) -> str:
    lines = ["# Compact historical buffers: accuracy against float32", "",
             (f"{env['date']} · torch {env['torch']} · 1 process × 1 thread · {env['cpu']} "
              f"({env['cpu_count']} CPUs, shared) · `local`, 2 stages × 8 chunks, default "
              "techniques"), "",
             ("| case | epochs | history | test acc per seed | mean ± std | vs float32 | "
             "best-val epochs | s/epoch |"), "|---|---:|---|---|---:|---:|---|---:|"]
    for (case, epochs), rows in df.groupby(["case", "epochs"], sort=False):
        ref = rows[rows["dtype"] == "float32"]
        base = float(ref["mean"].iloc[0]) if len(ref) else None
        for r in rows.itertuples():
            gap = "" if r.dtype == "float32" or base is None else f"{r.mean - base:+.3f}"
            lines.append(f"| {case} | {epochs} | {r.dtype} | {r.per_seed} | {r.mean:.3f} ± "
                         f"{r.std:.3f} | {gap} | {r.best_epoch} | {r.epoch_s:.2f} |")
    lines += ["", "Test accuracy at the best-validation epoch; std over seeds (sample)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=DTYPES)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=None, help="default: each case's own")
    ap.add_argument("--workers", type=int, default=2)
    add_output_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.seeds, args.cases = 3, [0], ["cora/gcnii32"]
    out = output_dir(args)
    env, start = environment(threads=1, workers=args.workers), time.perf_counter()
    key = ("case", "dtype", "seed", "epochs")
    jobs = [(c, d, s, args.epochs or CASES[c]["epochs"])
            for c in args.cases for s in args.seeds for d in args.dtypes]
    journal, recovered, jobs = resume_journal(out, "history_dtype", jobs, key)
    results = run_pool(run_one, jobs, args.workers, 1, lambda r: (
        f"{r['case']:17s} {r['dtype']:9s} seed {r['seed']}  test@best-val {r['test_acc']:.3f} "
        f"(epoch {r['epoch']})"), journal)
    done = {tuple(r[k] for k in key) for r in results}
    results += [r for r in recovered if tuple(r[k] for k in key) not in done]
    finish(env, start)
    if out is not None and (out / "history_dtype.json").exists():  # keep the other runs' rows
        ran = {tuple(r[k] for k in key) for r in results}
        earlier = json.loads((out / "history_dtype.json").read_text())["runs"]
        results = [r for r in earlier if tuple(r[k] for k in key) not in ran] + results
    results.sort(key=lambda r: (list(CASES).index(r["case"]), -r["epochs"],
                                DTYPES.index(r["dtype"]), r["seed"]))
    df = accuracy_rows(results, ["case", "epochs", "dtype"])
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if out is not None:
        write_results(out, "history_dtype", payload(env, df, results, args), markdown(df, env))
        journal.unlink(missing_ok=True)  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
