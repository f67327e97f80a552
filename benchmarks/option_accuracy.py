"""Accuracy of the training options that change what the chunked epoch computes (issue #24,
items 3-5 and 8): ``schedule="1f1b"``, 16-bit histories, a 16-bit wire and the leanest
combination, each against the float32 fill-drain epoch with the same seeds.

Cases (``local``, 2 stages x 8 chunks, gnnpipe's default techniques and chunking; test accuracy
at the best-validation epoch, ``--epochs`` epochs, 500 by default):

* GCNII-32 (hidden 64, alpha 0.1, theta 0.5, dropout 0.6; Adam lr 0.01, weight decay 5e-4, GNN
  layers 0.01) and a PyG ``GAT`` (4 layers, hidden 64, 4 heads; lr 0.005, weight decay 5e-4);
* on Cora, Facebook (evaluated every 5th epoch) and a 50,000-node planted-partition graph (64
  features, 8 classes, average degree 10, homophily 0.8; evaluated every 5th epoch).

Options: ``float32`` (the reference), ``1f1b``, ``float16`` / ``bfloat16`` histories,
``bfloat16`` wire, and ``lean``: 1F1B with float16 histories, ``recompute`` and no snapshot
(two full-graph buffers per layer, not three), the layout ``capped.py`` trains in.

Run (from the repository root)::

    .venv/bin/python benchmarks/option_accuracy.py --workers 2            # CPU: many hours
    .venv/bin/python benchmarks/option_accuracy.py --device cuda --workers 14 --deadline 500
    .venv/bin/python benchmarks/option_accuracy.py --quick                # smoke test

Jobs run most-needed first (the float32 and 1F1B references, then float16 and the lean set,
then bfloat16); with ``--deadline`` the runs still going then are left out and the results say
so. Writes ``benchmarks/results/option_accuracy.{json,md}``.
"""

from __future__ import annotations

import argparse
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
    write_results,
)

GCNII32 = {"builder": "gcnii", "hidden": 64, "layers": 32, "alpha": 0.1, "theta": 0.5,
           "dropout": 0.6}
GAT = {"builder": "gat"}
DEEP = {"lr": 0.01, "weight_decay": 5e-4, "gnn_weight_decay": 0.01}
ATTENTION = {"lr": 0.005, "weight_decay": 5e-4}
CASES: dict[str, dict[str, Any]] = {
    "cora/gcnii32": {"data": "cora", "model": GCNII32, "optim": DEEP, "eval_every": 1},
    "facebook/gcnii32": {"data": "facebook", "model": GCNII32, "optim": DEEP, "eval_every": 5},
    "syn50k/gcnii32": {"data": "syn50k", "model": GCNII32, "optim": DEEP, "eval_every": 5},
    "cora/gat": {"data": "cora", "model": GAT, "optim": ATTENTION, "eval_every": 1},
    "facebook/gat": {"data": "facebook", "model": GAT, "optim": ATTENTION, "eval_every": 5},
    "syn50k/gat": {"data": "syn50k", "model": GAT, "optim": ATTENTION, "eval_every": 5},
}
#: option name -> gp.train keyword arguments, most needed first
OPTIONS: dict[str, dict[str, Any]] = {
    "float32": {},
    "1f1b": {"schedule": "1f1b"},
    "float16": {"history_dtype": "float16"},
    "lean": {"schedule": "1f1b", "history_dtype": "float16", "recompute": True,
             "techniques": {"snapshot": False}},
    "bfloat16": {"history_dtype": "bfloat16"},
    "bfloat16 wire": {"wire_dtype": "bfloat16"},
}


def _data(name: str) -> Any:
    import gnnpipe as gp

    if name == "syn50k":
        return gp.datasets.synthetic(num_nodes=50_000, avg_degree=10, num_classes=8,
                                     num_features=64, homophily=0.8, seed=0)
    return gp.datasets.load(name)


def _model(spec: dict[str, Any], data: Any) -> Any:
    import gnnpipe as gp

    spec, classes = dict(spec), int(data.y.max()) + 1
    if spec.pop("builder") == "gat":
        from torch_geometric.nn.models import GAT as PygGAT

        return PygGAT(data.num_features, 64, 4, out_channels=classes, heads=4)
    return gp.models.gcnii(data.num_features, out_dim=classes, **spec)


def run_one(case: str, option: str, seed: int, epochs: int, device: str) -> dict[str, Any]:
    import torch

    import gnnpipe as gp

    spec = CASES[case]
    data = _data(spec["data"])
    torch.manual_seed(seed)
    model = _model(spec["model"], data)
    began = time.perf_counter()
    run = gp.train(model, data, "local", stages=2, chunks=8, epochs=epochs, seed=seed,
                   eval_every=spec["eval_every"], progress=False, device=device,
                   **spec["optim"], **OPTIONS[option])
    return {"case": case, "option": option, "seed": seed, "epochs": epochs, **run.best,
            "final_loss": float(run.history.loss.iloc[-1]), "device": device,
            "median_epoch_s": float(run.history.epoch_time.median()),
            "wall_s": time.perf_counter() - began}


def _pool(jobs: list[tuple], workers: int, deadline: float | None,
          journal: Any) -> tuple[list[dict[str, Any]], list[tuple]]:
    """Run ``jobs`` in ``workers`` spawned processes (one torch thread each); stop waiting at
    ``deadline`` seconds. The results, and the jobs left unfinished."""
    import json
    import multiprocessing as mp
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from _common import _set_threads

    start, results = time.perf_counter(), []
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                               initializer=_set_threads, initargs=(1,))
    pending = {pool.submit(run_one, *job): job for job in jobs}
    while pending:
        left = None if deadline is None else deadline - (time.perf_counter() - start)
        if left is not None and left <= 0:
            break
        done, _ = wait(pending, timeout=left, return_when=FIRST_COMPLETED)
        for fut in done:
            pending.pop(fut)
            r = fut.result()
            results.append(r)
            print(f"[{time.perf_counter() - start:5.0f}s] {r['case']:17s} {r['option']:13s} "
                  f"seed {r['seed']} test@best-val {r['test_acc']:.3f}", flush=True)
            if journal is not None:
                journal.parent.mkdir(parents=True, exist_ok=True)
                with journal.open("a") as f:
                    f.write(json.dumps(r) + "\n")
    unfinished = list(pending.values())
    for fut in pending:
        fut.cancel()
    pool.shutdown(wait=False, cancel_futures=True)
    return results, unfinished


def _listed(jobs: list[tuple]) -> str:
    """``option: case (seeds), ...; ...`` for jobs ``(case, option, seed, ...)``."""
    by: dict[str, dict[str, list[int]]] = {}
    for case, option, seed, *_ in jobs:
        by.setdefault(option, {}).setdefault(case, []).append(seed)
    return "; ".join(f"{option}: " + ", ".join(f"{c} ({' '.join(map(str, sorted(s)))})"
                                                for c, s in cases.items())
                     for option, cases in by.items())


def markdown(df: Any, env: dict[str, Any], unfinished: list[tuple]) -> str:
    lines = ["# Options that change the chunked epoch: accuracy against float32 fill-drain", "",
             (f"{env['date']} · torch {env['torch']} · {env['device']} · {env['cpu']} · "
              "`local`, 2 stages × 8 chunks, default techniques"), "",
             ("| case | epochs | option | test acc per seed | mean ± std | vs float32 | "
              "best-val epochs |"), "|---|---:|---|---|---:|---:|---|"]
    for (case, epochs), rows in df.groupby(["case", "epochs"], sort=False):
        ref = rows[rows["option"] == "float32"]
        base = float(ref["mean"].iloc[0]) if len(ref) else None
        for r in rows.itertuples():
            gap = "" if r.option == "float32" or base is None else f"{r.mean - base:+.3f}"
            lines.append(f"| {case} | {epochs} | {r.option} | {r.per_seed} | {r.mean:.3f} ± "
                         f"{r.std:.3f} | {gap} | {r.best_epoch} |")
    lines += ["", ("Test accuracy at the best-validation epoch; std over seeds (sample). "
                   "`lean`: 1F1B, float16 histories, recompute and no snapshot.")]
    if unfinished:
        lines += ["", "Not finished by the deadline: " + _listed(unfinished) + "."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--options", nargs="+", default=list(OPTIONS), choices=list(OPTIONS))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=500)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--deadline", type=float, default=None, help="seconds to wait at most")
    add_output_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.seeds, args.cases, args.options = 3, [0], ["cora/gcnii32"], [
            "float32", "1f1b"]
    out = output_dir(args)
    env = environment(device=args.device, workers=args.workers)
    start = time.perf_counter()
    key = ("case", "option", "seed", "epochs")
    jobs = [(c, o, s, args.epochs, args.device)
            for o in args.options for s in args.seeds for c in args.cases]
    journal, recovered, jobs = resume_journal(out, "option_accuracy", jobs, key)
    results, unfinished = _pool(jobs, args.workers, args.deadline, journal)
    results += recovered
    finish(env, start)
    results.sort(key=lambda r: (list(CASES).index(r["case"]), list(OPTIONS).index(r["option"]),
                                r["seed"]))
    df = accuracy_rows(results, ["case", "epochs", "option"])
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if out is not None:
        write_results(out, "option_accuracy", payload(env, df, results, args),
                      markdown(df, env, unfinished))


if __name__ == "__main__":
    main()
