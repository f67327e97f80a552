"""Where a run's peak memory goes (issue #24): what autograd keeps for the backward, the
historical buffers, and what glibc's heap retains, for ``single`` and ``local``.

GCNII-8, hidden 64, dropout 0.5, on a synthetic graph (avg degree 10, 64 features), 4 epochs,
one torch thread, each configuration in a fresh child process. Measured per run:

* ``peak``: ``run.memory()``'s ``peak_bytes`` (resident memory the run added at its highest);
* ``saved``: the bytes of every tensor autograd keeps for the backward in one epoch
  (``torch.autograd.graph.saved_tensors_hooks``), all chunks together (fill-drain stashes every
  chunk until the backward);
* ``buffers``: ``Hbuf``, its snapshot and ``dZbuf`` of every aggregating layer;
* ``cpu s/epoch``: process CPU time per epoch.

Allocators: glibc as it comes (``default``: its mmap threshold rises to 32 MiB as large blocks
are freed, so freed chunk- and graph-sized tensors stay in the heap) and
``MALLOC_MMAP_THRESHOLD_=1048576`` (``mmap_1MiB``: every block above 1 MiB is mapped afresh and
unmapped when freed, so the peak is what is live, at the cost of page faults). Sizes are in
units of one ``n × 64`` float32 tensor.

Run (from the repository root)::

    .venv/bin/python benchmarks/memory_itemise.py                  # 100,000 nodes, ~3 min
    .venv/bin/python benchmarks/memory_itemise.py --nodes 200000
    .venv/bin/python benchmarks/memory_itemise.py --quick          # smoke test, writes nothing

Writes ``benchmarks/results/memory_itemise.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
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

LAYERS, HIDDEN = 8, 64
ALLOCATORS = {"default": {}, "mmap_1MiB": {"MALLOC_MMAP_THRESHOLD_": "1048576"}}
LAYOUTS: dict[str, dict[str, Any]] = {"single": {}, "local": {"stages": 2, "chunks": 8}}


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One configuration in this fresh process."""
    import torch

    import gnnpipe as gp
    from gnnpipe.engine.chunked import StageExecutor

    torch.set_num_threads(1)
    data = gp.datasets.synthetic(num_nodes=cfg["nodes"], avg_degree=10, num_classes=8,
                                 num_features=64, seed=0)
    torch.manual_seed(0)
    model = gp.models.gcnii(64, hidden=HIDDEN, out_dim=8, layers=LAYERS, dropout=0.5)
    saved, buffers = [0], {}

    def pack(t: Any) -> Any:
        saved[0] += t.numel() * t.element_size()
        return t

    original = StageExecutor.end_epoch

    def spy(self: Any) -> None:
        buffers[id(self)] = sum(t.numel() * t.element_size() for b in self.buffers.values()
                                for t in b.tensors().values())
        original(self)

    StageExecutor.end_epoch = spy  # type: ignore[method-assign]
    began = time.process_time()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run = gp.train(model, data, cfg["mode"], epochs=cfg["epochs"], eval_every=100,
                       progress=False, **LAYOUTS[cfg["mode"]])
    unit = cfg["nodes"] * HIDDEN * 4
    return {**cfg, "cpu_s_per_epoch": (time.process_time() - began) / cfg["epochs"],
            "peak_units": int(run.memory()["peak_bytes"][0]) / unit,
            "saved_units": saved[0] / cfg["epochs"] / unit,
            "buffer_units": sum(buffers.values()) / unit}


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    nodes = rows[0]["nodes"]
    lines = [f"# Where the peak goes: GCNII-{LAYERS}, hidden {HIDDEN}, {nodes:,} nodes", "",
             (f"{env['date']} · torch {env['torch']} · 1 thread · {env['cpu']} "
              f"({env['cpu_count']} CPUs, shared) · units of one {nodes:,} × {HIDDEN} float32 "
              f"tensor ({nodes * HIDDEN * 4 / 2**20:.1f} MiB) · `local` is 2 stages × 8 chunks"),
             "", ("| mode | allocator | peak | kept for backward | buffers | peak − kept − buffers "
             "| per layer: peak | CPU s/epoch |"), "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        rest = r["peak_units"] - r["saved_units"] - r["buffer_units"]
        lines.append(f"| {r['mode']} | {r['allocator']} | {r['peak_units']:.1f} | "
                     f"{r['saved_units']:.1f} | {r['buffer_units']:.1f} | {rest:.1f} | "
                     f"{r['peak_units'] / LAYERS:.2f} | {r['cpu_s_per_epoch']:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--epochs", type=int, default=4)
    add_output_args(ap, child=True)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    if args.quick:
        args.nodes, args.epochs = 5_000, 2
    out = output_dir(args)
    env, start = environment(threads=1), time.perf_counter()
    rows = []
    for mode in LAYOUTS:
        for name, variables in ALLOCATORS.items():
            cfg = {"mode": mode, "allocator": name, "nodes": args.nodes, "epochs": args.epochs}
            rows.append(run_child(__file__, cfg, env=variables))
            print(f"{mode:6s} {name:10s} peak {rows[-1]['peak_units']:.1f} units, kept "
                  f"{rows[-1]['saved_units']:.1f}, buffers {rows[-1]['buffer_units']:.1f}, "
                  f"{rows[-1]['cpu_s_per_epoch']:.2f} CPU s/epoch", flush=True)
    finish(env, start)
    if out is not None:
        import pandas as pd

        write_results(out, "memory_itemise", payload(env, pd.DataFrame(rows), rows, args),
                      markdown(rows, env))


if __name__ == "__main__":
    main()
