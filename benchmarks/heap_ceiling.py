"""What a rank under a Dask ``memory_limit`` holds with its heap trimmed near the limit
(issue #24): per-rank peaks and epoch times of one pipeline with no limit and with a limit its
estimate just fits.

Chunk tensors below glibc's mmap threshold (under the lean allocator, 1 MiB) live in the heap,
where the freed temporaries of every chunk op leave holes between the activations each chunk
stashes until its backward: a rank's resident set grows past what it uses, which is what
``gp.estimate_memory`` counts. A rank in a worker with a ``memory_limit`` hands the holes back
whenever it holds more than 80% of the limit (:class:`gnnpipe.engine.memory.HeapCeiling`).

Cases: GCN-16 (hidden 64) on a 50,000-node synthetic graph of average degree 20 (a chunk's
tensor of width 64 is 800 KB at 16 chunks), ``pipeline`` 2 × 16, in each schedule and with
bfloat16 histories. Each case runs in a fresh child process (lean allocator in it and its
workers, 1 torch thread): the estimate, then 5 epochs on 2 workers with no ``memory_limit``,
then 5 epochs on 2 workers whose limit the largest rank's baseline plus its estimate fills to
90% (the nanny kills a worker past 95% of the limit; trimming starts at 80%).

Run (from the repository root)::

    .venv/bin/python benchmarks/heap_ceiling.py           # every case (~6 min)
    .venv/bin/python benchmarks/heap_ceiling.py --quick   # smoke test, writes nothing

Writes ``benchmarks/results/heap_ceiling.{json,md}``.
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

CASES: dict[str, dict[str, Any]] = {
    "fill-drain": {"schedule": "gnnpipe"},
    "1f1b": {"schedule": "1f1b"},
    "1f1b, bf16 history": {"schedule": "1f1b", "history_dtype": "bfloat16"},
}
QUICK = {"quick": {"schedule": "1f1b"}}
EPOCHS = 5
#: The share of the workers' memory_limit a rank's start size plus its estimate fills.
FILLED = 0.9
MB = 1e6


def _train(model: Any, data: Any, layout: dict[str, Any], memory_limit: int) -> Any:
    import copy

    import gnnpipe as gp

    with gp.Cluster(n_workers=2, memory_limit=memory_limit) as cluster:
        return gp.train(copy.deepcopy(model), data, "pipeline", epochs=EPOCHS,
                        eval_every=EPOCHS + 1, cluster=cluster, progress=False, **layout)


def _measured(run: Any) -> dict[str, Any]:
    memory = run.memory().set_index("rank")
    return {"peaks": [int(p) for p in memory["peak_bytes"]],
            "baselines": [int(b) for b in memory["baseline_bytes"]],
            "trims": [int(t) for t in memory["heap_trims"]],
            "epoch_s": statistics.median(run.history["epoch_time"].iloc[1:])}


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One case: the estimate, a run with no limit, a run under a limit the estimate fits."""
    import torch

    import gnnpipe as gp
    from gnnpipe.runtime.launch import RankFailure

    torch.set_num_threads(1)
    nodes = 3000 if cfg["quick"] else 50_000
    data = gp.datasets.synthetic(num_nodes=nodes, avg_degree=20, num_classes=8,
                                 num_features=64, seed=0)
    torch.manual_seed(0)
    model = gp.models.build("gcn", data.num_features, 8, 16, 64)
    layout = {"stages": 2, "chunks": 16, **cfg["layout"]}
    estimate = [int(b) for b in gp.estimate_memory(model, data, "pipeline", **layout)[
        "peak_bytes"]]
    free = _measured(_train(model, data, layout, 0))
    limit = int((max(free["baselines"]) + max(estimate)) / FILLED)
    try:
        capped: dict[str, Any] = _measured(_train(model, data, layout, limit))
    except RankFailure as e:  # a rank killed past the limit: the row says so
        capped = {"failed": str(e).splitlines()[0][:300]}
    return {"case": cfg["name"], "estimate": estimate, "free": free, "limit": limit,
            "capped": capped}


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    def mb(values: list[int]) -> str:
        return " / ".join(f"{v / MB:.0f}" for v in values)

    def ratio(values: list[int], est: list[int]) -> str:
        return " / ".join(f"{v / e:.2f}" for v, e in zip(values, est))

    lines = ["# A rank's heap trimmed near its memory limit", "",
             (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs, "
              f"shared) · GCN-16 hidden 64, 50,000 nodes, degree 20 · pipeline 2 × 16 on 2 "
              f"workers, 1 thread each, lean allocator · {EPOCHS} epochs"), "",
             ("| case | estimate MB | no limit: peak MB | ÷ estimate | s/epoch | limit MB | "
              "under it: peak MB | ÷ estimate | s/epoch | trims |"),
             "|---|---|---|---|---:|---:|---|---|---:|---|"]
    for r in rows:
        est, free, capped = r["estimate"], r["free"], r["capped"]
        under = (f"failed: {capped['failed']} | | | " if "failed" in capped else
                 f"{mb(capped['peaks'])} | {ratio(capped['peaks'], est)} | "
                 f"{capped['epoch_s']:.3f} | {' / '.join(map(str, capped['trims']))}")
        lines.append(f"| {r['case']} | {mb(est)} | {mb(free['peaks'])} | "
                     f"{ratio(free['peaks'], est)} | {free['epoch_s']:.3f} | "
                     f"{r['limit'] / MB:.0f} | {under} |")
    lines += ["", ("Peaks per rank (rank 0 / rank 1) above each worker's resident size at the "
                   "run's start. The largest rank's start size plus its estimate fill 90% of the "
                   "limit; ranks trim their heaps past 80% (trims: how often, per rank, "
                   "`run.memory()['heap_trims']`), the nanny kills a worker past 95%.")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_output_args(ap, child=True)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    from gnnpipe.runtime.workerenv import Allocator

    env_vars = {**Allocator("lean").environ(), "GNNPIPE_ALLOCATOR": "lean"}
    cases = QUICK if args.quick else CASES
    env, start = environment(), time.perf_counter()
    rows = []
    for name, layout in cases.items():
        rows.append(run_child(__file__, {"name": name, "layout": layout, "quick": args.quick},
                              env_vars))
        print(rows[-1], flush=True)
    finish(env, start)
    text = markdown(rows, env)
    print(text)
    out = output_dir(args)
    if out is not None:
        import pandas as pd

        summary = pd.DataFrame([{"case": r["case"], "limit": r["limit"],
                                 "capped_failed": "failed" in r["capped"]} for r in rows])
        write_results(out, "heap_ceiling", payload(env, summary, rows, args), text)


if __name__ == "__main__":
    main()
