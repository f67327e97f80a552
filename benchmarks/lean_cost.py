"""What the lean layout costs in epoch time (issue #24): the layout ``capped.py`` trains in
(1F1B, float16 histories, ``recompute``, no snapshot), and the same without ``recompute``,
against gnnpipe's defaults (fill-drain, float32), the same stages and chunks, side by side in
one run.

GCNII-32 (hidden 64) on a ``--nodes`` planted-partition graph (average degree 10, 64 features),
``pipeline`` 2 x 16 on 2 workers and 4 x 32 on 4 workers, one torch thread per rank, the lean
allocator everywhere (as in ``capped.py``), no memory limit. Each layout trains in a fresh
process on a fresh cluster; each stage count's layouts run in turn, reversed every other round, over
``--rounds`` rounds so that a drift in the machine's load falls on both alike. The median epoch
of each run leaves out the first (warm-up) epoch; evaluation runs once, after the last.

With 4 ranks on a 2-core machine two ranks share each core: the 4-stage times compare the two
layouts with each other, not with the 2-stage ones.

Run (from the repository root)::

    .venv/bin/python benchmarks/lean_cost.py               # 200,000 nodes (~25 min)
    .venv/bin/python benchmarks/lean_cost.py --quick       # smoke test, writes nothing

Writes ``benchmarks/results/lean_cost.{json,md}``.
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
from capped import LEAN, _case, _environ

#: name -> (workers, gp.train layout)
LAYOUTS: dict[str, tuple[int, dict[str, Any]]] = {
    f"{s} x {c}, {name}": (s, {"stages": s, "chunks": c, **options})
    for s, c in ((2, 16), (4, 32))
    for name, options in (("defaults", {}), ("lean", LEAN),
                          ("lean without recompute", {**LEAN, "recompute": False}))}


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    model, data = _case(cfg["nodes"])
    workers, layout = LAYOUTS[cfg["what"]]
    with gp.Cluster(n_workers=workers) as cluster:
        run = gp.train(model, data, "pipeline", epochs=cfg["epochs"], cluster=cluster,
                       progress=False, timeout=1800.0, eval_every=cfg["epochs"], **layout)
    times = run.history["epoch_time"].tolist()
    return {**cfg, "epoch_times": times, "epoch_s": statistics.median(times[1:]),
            "peaks": run.memory()["peak_bytes"].astype(int).tolist()}


def _order(rounds: int) -> list[str]:
    """Each stage count's layouts in turn, the order reversed every other round (ABC CBA...)."""
    names = []
    for r in range(rounds):
        for stages in ("2 x 16", "4 x 32"):
            group = [name for name in LAYOUTS if name.startswith(stages)]
            names += group if r % 2 == 0 else group[::-1]
    return names


def markdown(rows: list[dict[str, Any]], env: dict[str, Any], nodes: int) -> str:
    by: dict[str, list[float]] = {}
    peaks: dict[str, list[int]] = {}
    for r in rows:
        by.setdefault(r["what"], []).append(r["epoch_s"])
        peaks[r["what"]] = r["peaks"]
    mib = 2**20
    lines = [f"# The lean layout's epoch time: GCNII-32, hidden 64, {nodes:,} nodes", "",
             (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs, "
              f"shared; load {env['loadavg_start'][0]:.1f} at start, "
              f"{env['loadavg_end'][0]:.1f} at end) · 1 torch thread per rank · "
              "lean allocator · `pipeline`, one worker per rank, no memory limit"), "",
             "| layout | epoch s per run | median epoch s | ÷ defaults | peak MiB per rank |",
             "|---|---|---:|---:|---|"]
    for name in LAYOUTS:
        if name not in by:
            continue
        base = statistics.median(by[name.split(",")[0] + ", defaults"])  # the same stages
        med = statistics.median(by[name])
        lines.append(f"| {name} | {', '.join(f'{t:.1f}' for t in by[name])} | {med:.1f} | "
                     f"{med / base:.2f} | {', '.join(f'{p / mib:,.0f}' for p in peaks[name])} |")
    lines += ["", ("Lean: `schedule='1f1b'`, `history_dtype=torch.float16`, `recompute=True`, "
                   "`techniques={'snapshot': False}`; without recompute: the same with "
                   "`recompute=False`. Per run: the median of its epochs after "
                   "the first. With 4 ranks on 2 cores two ranks share a core.")]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_args(ap, child=True)
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    nodes = 10_000 if args.quick else args.nodes
    out = output_dir(args)
    env, start = environment(), time.perf_counter()
    rows = []
    for what in _order(1 if args.quick else args.rounds):
        rows.append(run_child(__file__, {"what": what, "nodes": nodes, "epochs": args.epochs},
                              env=_environ()))
        print(f"{what}: {rows[-1]['epoch_s']:.2f} s", flush=True)
    finish(env, start)
    text = markdown(rows, env, nodes)
    print(text)
    if out is not None:
        import pandas as pd

        write_results(out, "lean_cost", payload(env, pd.DataFrame(rows), rows, args), text,
                      default=str)


if __name__ == "__main__":
    main()
