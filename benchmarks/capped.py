"""Capped workers (issue #24, item 8): what trains when every worker's Dask ``memory_limit`` is a
share of single's peak, and what a run that does not fit says.

GCNII-32 (hidden 64) on a ``--nodes`` planted-partition graph (average degree 10, 64 features).
First single's peak is measured (2 epochs in a fresh process), and the resident size of a
worker once gnnpipe is loaded and the graph has arrived (where a run's ``peak_bytes`` count
from). A cap is what a rank may add to that, a share of single's peak: each worker's Dask
``memory_limit`` is the worker's size plus the cap, over 95% (the nanny kills a worker there).
Then, each in a fresh process with workers so capped:

- ``single`` in a capped worker (the run is a task on the worker): the nanny kills it;
- a 2-stage pipeline with gnnpipe's defaults: the run fails, naming the limit, the rank's
  estimated need and the options that need less;
- a 2-stage pipeline at 0.55 × and a 4-stage one at 0.35 ×, in the leanest layout: 1F1B,
  float16 histories, ``recompute`` and no snapshot.

Every process uses the lean allocator (``GNNPIPE_ALLOCATOR=lean``: freed tensors go back to the
OS, so a worker's resident size is what it uses, as the memory model predicts it). One torch
thread per process.

Run (from the repository root)::

    .venv/bin/python benchmarks/capped.py              # 200,000 nodes (~15 min)
    .venv/bin/python benchmarks/capped.py --quick      # smoke test, writes nothing

Writes ``benchmarks/results/capped.{json,md}`` (``capped_<N>k`` for other ``--nodes``).
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
from plan_choice import _worker_baseline

LEAN = {"schedule": "1f1b", "history_dtype": "float16", "recompute": True,
        "techniques": {"snapshot": False}}
#: name -> (share of single's peak, mode, workers, gp.train layout)
SCENARIOS: dict[str, tuple[float, str, int, dict[str, Any]]] = {
    "single at 0.55x": (0.55, "single", 1, {}),
    "pipeline 2 x 16, defaults, at 0.55x": (0.55, "pipeline", 2, {"stages": 2, "chunks": 16}),
    "pipeline 2 x 16, lean, at 0.55x": (0.55, "pipeline", 2, {"stages": 2, "chunks": 16, **LEAN}),
    "pipeline 4 x 32, lean, at 0.35x": (0.35, "pipeline", 4, {"stages": 4, "chunks": 32, **LEAN}),
}


def _case(nodes: int) -> tuple[Any, Any]:
    import torch

    import gnnpipe as gp

    data = gp.datasets.synthetic(num_nodes=nodes, avg_degree=10, num_classes=8,
                                 num_features=64, seed=0)
    torch.manual_seed(0)
    return gp.models.gcnii(64, hidden=64, out_dim=8, layers=32, dropout=0.5), data


def _single_task(model: Any, data: Any, epochs: int) -> int:
    """Run on a worker: single's training there; its peak."""
    import gnnpipe as gp

    run = gp.train(model, data, "single", epochs=epochs, progress=False)
    return int(run.memory()["peak_bytes"].max())


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    import dask
    import torch
    from distributed import KilledWorker

    import gnnpipe as gp
    from gnnpipe.runtime.launch import RankFailure

    torch.set_num_threads(1)
    model, data = _case(cfg["nodes"])
    if cfg["what"] == "single peak":
        need = int(gp.estimate_memory(model, data, "single")["peak_bytes"].max())
        run = gp.train(model, data, "single", epochs=2, progress=False)
        return {"estimated": need, "measured": int(run.memory()["peak_bytes"].max()),
                "epoch_s": float(run.history["epoch_time"].median()),
                "worker_baseline": _worker_baseline(data)}
    share, mode, workers, layout = SCENARIOS[cfg["what"]]
    cap = int(share * cfg["single_peak"])
    limit = int((cfg["worker_baseline"] + cap) / 0.95)
    estimated = [int(b) for b in gp.estimate_memory(model, data, mode, **layout)["peak_bytes"]]
    began = time.perf_counter()
    # the nanny restarts a killed worker however long that takes on a loaded machine (a local
    # cluster gives up on a slow restart and drops the worker: single's task then waits forever)
    with (dask.config.set({"distributed.deploy.lost-worker-timeout": "3600s"}),
          gp.Cluster(n_workers=workers, memory_limit=limit) as cluster):
        try:
            if mode == "single":  # a task on the capped worker
                peak = cluster.client.submit(_single_task, model, data, cfg["epochs"],
                                             pure=False).result(timeout=3000)
                return {**cfg, "cap": cap, "estimated": estimated, "outcome": "trained",
                        "peaks": [peak]}
            run = gp.train(model, data, mode, epochs=cfg["epochs"], cluster=cluster,
                           progress=False, timeout=900.0, eval_every=cfg["epochs"], **layout)
        except (RankFailure, KilledWorker, TimeoutError) as err:  # the run that does not fit
            return {**cfg, "cap": cap, "estimated": estimated, "outcome": "failed",
                    "error": f"{type(err).__name__}: {err}", "seconds": time.perf_counter() - began}
    return {**cfg, "cap": cap, "estimated": estimated, "outcome": "trained",
            "peaks": run.memory()["peak_bytes"].astype(int).tolist(),
            "epoch_s": statistics.median(run.history["epoch_time"].iloc[1:]),
            "test_acc": run.best.get("test_acc")}


def _environ() -> dict[str, str]:
    from gnnpipe.runtime.workerenv import Allocator

    return {**Allocator("lean").environ(), "GNNPIPE_ALLOCATOR": "lean"}


def markdown(single: dict[str, Any], rows: list[dict[str, Any]], env: dict[str, Any],
             nodes: int) -> str:
    mib = 2**20
    lines = [f"# Capped workers: GCNII-32, hidden 64, {nodes:,} nodes", "",
             (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs, "
              "shared) · 1 torch thread per process · the lean allocator everywhere"), "",
             (f"single's peak: **{single['measured'] / mib:,.0f} MiB** measured "
              f"({single['estimated'] / mib:,.0f} MiB estimated), {single['epoch_s']:.1f} s per "
              f"epoch. A loaded worker: {single['worker_baseline'] / mib:,.0f} MiB; the cap is "
              "what a rank may add to it (a worker's Dask `memory_limit`: its size plus the cap, "
              "over 0.95)."), "",
             ("| scenario | cap MiB | estimated peak per rank MiB | outcome | measured peak "
              "per rank MiB | ÷ single | epoch s |"),
             "|---|---:|---|---|---|---|---:|"]
    for r in rows:
        peaks = r.get("peaks", [])
        shares = ", ".join(f"{b / single['measured']:.2f}" for b in peaks)
        lines.append(
            f"| {r['what']} | {r['cap'] / mib:,.0f} | "
            f"{', '.join(f'{b / mib:,.0f}' for b in r['estimated'])} | {r['outcome']} | "
            f"{', '.join(f'{b / mib:,.0f}' for b in peaks)} | "
            f"{shares} | "
            f"{r.get('epoch_s', float('nan')):.1f} |")
    lines += ["", ("Lean: `schedule='1f1b'`, `history_dtype=torch.float16`, `recompute=True`, "
                   "`techniques={'snapshot': False}`. What the runs that failed said:"), ""]
    lines += [f"- **{r['what']}**: `{r['error'][:1200]}`" for r in rows if r["outcome"] == "failed"]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_args(ap, child=True)
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    nodes = 20_000 if args.quick else args.nodes
    out = output_dir(args)
    env, start = environment(), time.perf_counter()
    single = run_child(__file__, {"what": "single peak", "nodes": nodes}, env=_environ())
    print(f"single: {single}", flush=True)
    rows = []
    for what in SCENARIOS:
        rows.append(run_child(__file__, {"what": what, "nodes": nodes, "epochs": args.epochs,
                                         "single_peak": single["measured"],
                                         "worker_baseline": single["worker_baseline"]},
                              env=_environ()))
        print(f"{what}: {rows[-1]['outcome']} {rows[-1].get('peaks', '')}", flush=True)
    finish(env, start)
    text = markdown(single, rows, env, nodes)
    print(text)
    if out is not None:
        import pandas as pd

        name = "capped" if args.nodes == 200_000 else f"capped_{args.nodes // 1000}k"
        write_results(out, name, payload(env, pd.DataFrame(rows), [single, *rows], args),
                      text, default=str)


if __name__ == "__main__":
    main()
