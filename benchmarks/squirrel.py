"""Squirrel (issue #28): the chunked epoch against exact training on the GNNPipe paper's
dense, low-homophily graph, and an ablation of what differs from the paper's implementation.

Graph: Squirrel, split 0 (``gp.datasets.load("squirrel", split=0)``; 5,201 nodes, 2,089 binary
features as released, 5 classes, edges symmetrised). Its features are not row-normalised (the
loader's default for Squirrel): row-normalised, GCNII-16 does not train here (single, seed 0:
training loss 1.61 -> 1.57 in 300 epochs, train accuracy 0.28, test 0.30), where raw features
reproduce the issue's single 0.398 (seed 0: 0.397). Models (``--model``): GCNII-16 (the issue's),
GCNII-32 and ResGCN+-32 (the paper's depth), hidden 64, dropout 0.5, GCNII alpha 0.1, theta 0.5;
Adam lr 0.01, weight decay 5e-4 (``gp.train``'s default, GNN layers included); test accuracy at
the best-validation epoch (evaluated every epoch); seeds 0, 1, 2 (``torch.manual_seed(seed)``
before the model, ``seed=seed`` to ``train``).

Configurations, all ``local`` (the chunked epoch ``pipeline`` runs) with 2 stages x 8 chunks of
METIS's own parts and snapshot period 23 unless named: ``single`` (exact; ``graph`` equals it);
``all_on`` (every technique on: the paper's set, gnnpipe's default before issue #28);
``ppc_4`` (4·C METIS parts merged at random, the paper's chunks); ``no_random_order``,
``no_snapshot``, ``ppc4_no_snapshot``, ``no_unbiased_grad``, ``none`` (all three off);
``snapshot_5``, ``snapshot_100`` (snapshot period); ``chunks_4`` .. ``chunks_32``;
``default`` (gnnpipe's defaults: unbiased gradients off since issue #28); ``hybrid`` (2 ways x
2 stages x 8 chunks on 4 Dask worker processes, the defaults; run it with ``--workers 1``).

Run (from the repository root)::

    .venv/bin/python benchmarks/squirrel.py                      # all configurations, 300 epochs
    .venv/bin/python benchmarks/squirrel.py --epochs 150 --configs all_on no_snapshot
    .venv/bin/python benchmarks/squirrel.py --model gcnii32 --configs single default all_on
    .venv/bin/python benchmarks/squirrel.py --quick              # smoke test, writes nothing

A GCNII-16 run takes about 3 minutes at 300 epochs on one thread of the 2-core CI machine (a
32-layer one twice that). Writes ``benchmarks/results/squirrel.json`` and ``.md``; a run keeps
the earlier rows (model, configuration, epochs, seed) it did not rerun, so the table grows run
by run.
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

ALL_ON = {"random_order": True, "snapshot": True, "unbiased_grad": True}
#: Ablations one switch at a time from the paper's set (every technique on, snapshot period 23,
#: METIS's own parts as chunks: gnnpipe's defaults); ``no_unbiased_grad`` is the candidate
#: default the first runs point to (issue #28, results/squirrel.md).
CONFIGS: dict[str, dict[str, Any]] = {
    "single": {"mode": "single"},
    "all_on": {"techniques": ALL_ON},
    "ppc_4": {"parts_per_chunk": 4, "techniques": ALL_ON},
    "no_random_order": {"techniques": {**ALL_ON, "random_order": False}},
    "no_snapshot": {"techniques": {**ALL_ON, "snapshot": False}},
    "ppc4_no_snapshot": {"parts_per_chunk": 4, "techniques": {**ALL_ON, "snapshot": False}},
    "no_unbiased_grad": {"techniques": {**ALL_ON, "unbiased_grad": False}},
    "none": {"techniques": False},
    "default": {},
    "hybrid": {"mode": "hybrid", "ways": 2, "stages": 2},
    "snapshot_5": {"techniques": {**ALL_ON, "snapshot_period": 5}},
    "snapshot_100": {"techniques": {**ALL_ON, "snapshot_period": 100}},
    "chunks_4": {"chunks": 4, "techniques": ALL_ON},
    "chunks_16": {"chunks": 16, "techniques": ALL_ON},
    "chunks_32": {"chunks": 32, "techniques": ALL_ON},
}


#: Models (hidden 64, dropout 0.5; GCNII alpha 0.1, theta 0.5): the issue's GCNII-16 and the
#: paper's 32-layer GCNII and ResGCN+.
MODELS: dict[str, dict[str, Any]] = {
    "gcnii16": {"builder": "gcnii", "layers": 16, "alpha": 0.1, "theta": 0.5},
    "gcnii32": {"builder": "gcnii", "layers": 32, "alpha": 0.1, "theta": 0.5},
    "resgcn32": {"builder": "resgcn_plus", "layers": 32},
}


def run_one(model_name: str, config: str, seed: int, epochs: int) -> dict[str, Any]:
    import torch

    import gnnpipe as gp

    data = gp.datasets.load("squirrel", split=0)
    torch.manual_seed(seed)
    spec = dict(MODELS[model_name])
    model = gp.models.MODELS[spec.pop("builder")](data.num_features, hidden=64, out_dim=5,
                                                  dropout=0.5, **spec)
    cfg = {"mode": "local", "stages": 2, "chunks": 8, **CONFIGS[config]}
    if cfg["mode"] == "single":
        cfg = {"mode": "single"}
    run = gp.train(model, data, epochs=epochs, seed=seed, lr=0.01, weight_decay=5e-4,
                   eval_every=1, progress=False, timeout=7200.0, **cfg)
    return {"model": model_name, "config": config, "epochs": epochs, "seed": seed, **run.best,
            "final_loss": float(run.history.loss.iloc[-1]),
            "median_epoch_s": float(run.history.epoch_time.median())}


NOTES = """
## What the runs say (issue #28)

**The cause: technique 3, the unbiased historical gradients.** With every technique on (the
paper's set, gnnpipe's default until issue #28) the chunked epoch scored 3.4 points below exact
training on GCNII-16 (0.359 against 0.393, seeds 0–2); with only the unbiased gradients off it
scored 0.394 (+0.1). Seed 0, one switch at a time: 4·C METIS parts merged at random as chunks
0.365, snapshot off 0.369, both 0.381, all three off 0.376: each other switch moves a point or
so, the unbiased gradients four. The implementation is the paper's semantics (the chunked epoch
equals a hand-written dense reference of design §5 in `tests/engine/test_reference.py`); the
technique itself is biased on this graph. It zeroes `dZbuf` every epoch and doubles a chunk's
rows after its backward, which makes a gradient path that crosses one chunk boundary unbiased
(the reading chunk runs its backward first with probability 1/2) but weights a path through `k`
boundaries `2^k` when its chunks happen to run their backwards in path order (probability
`1/(k+1)!`) and drops it otherwise; a path that leaves a chunk and comes back never survives. On
Squirrel 57% of the edges join two chunks and 16–32 layers compose many boundaries, so the
gradient is biased: chunked training loss matched exact training's (1.109 vs 1.111, epochs
100–149, seed 0) while its exact train accuracy trailed by 9 points (0.641 vs 0.732). With the
technique off, `dZbuf` keeps each chunk's latest rows (this epoch's for chunks done, last
epoch's for the rest), an unbiased-in-the-limit, slightly stale gradient: train accuracy 0.720.

**Defaults chosen from these runs:** unbiased gradients off for built-in models (PyG models had
them off already, `pyg_accuracy.py`), random order and the snapshot (period 23) on, METIS's own
parts as chunks. The cost: `dZbuf` needs memory of its own, three full-graph buffers per
aggregating layer instead of two (`history_dtype=torch.bfloat16` halves them).
`techniques=True` restores the paper's set.

**The paper's depth.** GCNII-32: default 0.395 against exact 0.390 (+0.5); ResGCN+-32: 0.476
against 0.480 (−0.4), seeds 0–2. The hybrid, 2 ways × 2 stages × 8 chunks on 4 Dask worker
processes with the defaults, GCNII-32 seed 0 (one seed: 11 minutes with 4 ranks on 2 cores):
0.406 against single's 0.396 on that seed. `pipeline` computes exactly what `local` does (equal to 1e-5 in
`tests/runtime/test_modes.py`) and `graph` what `single` does, so these rows stand for them.
Hyperparameters that differ from the paper's, and why: hidden 64 (paper 100), Adam lr 0.01 (paper
1e-3), 300 epochs, dropout 0.5, 2 stages × 8 chunks (paper 8 GPUs × 32 chunks), features as
released: a 32-layer run takes 4–6 minutes on one core of this 2-core machine, and lr 1e-3
needs several times the epochs. Our exact GCNII-32 (0.390) is above the paper's exact 34.74%;
its pipelined 38.04% is where ours lands.

**Row-normalised features** (`load`'s default for Cora and Facebook): GCNII-16 does not train on
Squirrel (single, seed 0: 0.305, train accuracy 0.28), so the Squirrel loader keeps the features
as released.
"""


def markdown(df: Any, env: dict[str, Any]) -> str:
    lines = ["# Squirrel: the chunked epoch vs single (split 0)", "",
             (f"{env['date']} · torch {env['torch']} · 1 process × 1 thread · {env['cpu']} "
              f"({env['cpu_count']} CPUs, shared) · `local`, 2 stages × 8 chunks unless named"), "",
             ("| model | epochs | configuration | test acc per seed | mean ± std | vs single | "
              "best-val epochs |"), "|---|---:|---|---|---:|---:|---|"]
    for (model, epochs), rows in df.groupby(["model", "epochs"], sort=False):
        ref = rows[rows["config"] == "single"]
        single = float(ref["mean"].iloc[0]) if len(ref) else None
        for r in rows.itertuples():
            gap = "" if r.config == "single" or single is None else f"{r.mean - single:+.3f}"
            lines.append(f"| {model} | {epochs} | {r.config} | {r.per_seed} | "
                         f"{r.mean:.3f} ± {r.std:.3f} | {gap} | {r.best_epoch} |")
    lines += ["", "Test accuracy at the best-validation epoch; std over seeds (sample).", NOTES]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gcnii16", choices=list(MODELS))
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    ap.add_argument("--epochs", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--report", action="store_true", help="train nothing; rewrite the tables")
    add_output_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.seeds, args.configs = 3, [0], ["single", "all_on"]
    out = output_dir(args)
    env, start = environment(threads=1, workers=args.workers), time.perf_counter()
    jobs = [] if args.report else [(args.model, c, s, args.epochs) for s in args.seeds
                                   for c in args.configs]
    key = ("model", "config", "seed", "epochs")
    journal, recovered, jobs = resume_journal(out, "squirrel", jobs, key)
    results = run_pool(run_one, jobs, args.workers, 1, lambda r: (
        f"{r['model']} {r['config']:17s} seed {r['seed']} {r['epochs']} epochs  test@best-val "
        f"{r['test_acc']:.3f} (epoch {r['epoch']})"), journal)
    done = {tuple(r[k] for k in key) for r in results}
    results += [r for r in recovered if tuple(r[k] for k in key) not in done]
    finish(env, start)
    if out is not None and (out / "squirrel.json").exists():  # keep the other runs' rows
        earlier = [{"model": "gcnii16", **r}  # rows from before --model: GCNII-16
                   for r in json.loads((out / "squirrel.json").read_text())["runs"]]
        ran = {tuple(r[k] for k in key) for r in results}
        results = [r for r in earlier if tuple(r[k] for k in key) not in ran] + results
    order = list(CONFIGS)
    results.sort(key=lambda r: (list(MODELS).index(r["model"]), r["epochs"],
                                order.index(r["config"]), r["seed"]))
    df = accuracy_rows(results, ["model", "epochs", "config"])
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if out is not None:
        write_results(out, "squirrel", payload(env, df, results, args), markdown(df, env))
        journal.unlink(missing_ok=True)  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
