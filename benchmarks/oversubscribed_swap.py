"""What a lockstep swap waits when ranks outnumber the cores (issue #25's hybrid predictions):
the physical reference behind ``gp.plan``'s hybrid error on this 2-core machine.

A ``hybrid`` rank swaps halo rows with its other ways at every aggregation of every chunk; a
``graph`` rank at every aggregation. ``gp.plan`` charges a rank sharing a core with others its
share of the core (``ranks × threads / cores``) and each swap its bytes at the link's speed.
This script measures what else a swap costs when ranks take turns on the cores: ``--procs``
processes (one torch thread each, in pairs, talking through gloo as ranks do) each run a fixed
amount of work — ``--work-ms`` milliseconds of matrix products when alone — then swap a small
tensor with their pair, ``--rounds`` times. Per round, the median over processes of the median
round, against what the planner's cost model gives for it: the work times
``max(1, procs / cores)`` plus the swap's time with the cores to spare (measured with 2
processes and no work). The difference is each swap's wait on the scheduler.

Run (from the repository root)::

    .venv/bin/python benchmarks/oversubscribed_swap.py            # ~1 min
    .venv/bin/python benchmarks/oversubscribed_swap.py --quick    # smoke test, writes nothing

Writes ``benchmarks/results/oversubscribed_swap.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from _common import add_output_args, environment, finish, output_dir, payload, write_results

SIZE = 256  # the matrix products' side
SWAP_VALUES = 20_000  # float32 values swapped per round (80 KB)


def _products_per_ms() -> float:
    """Matrix products of :data:`SIZE` one thread does per millisecond, alone."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(SIZE, SIZE)
    for _ in range(20):
        a @ a
    began = time.perf_counter()
    for _ in range(300):
        a @ a
    return 300 / ((time.perf_counter() - began) * 1e3)


def _rank(rank: int, world: int, port: int, products: int, rounds: int, out: Any) -> None:
    """One process: ``rounds`` times ``products`` matrix products, then a swap with its pair."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    a = torch.randn(SIZE, SIZE)
    sent, got = torch.ones(SWAP_VALUES), torch.empty(SWAP_VALUES)
    took = []
    dist.barrier()
    for _ in range(rounds + 1):  # the first round sets the connection up
        began = time.perf_counter()
        for _ in range(products):
            a @ a
        for work in (dist.isend(sent, rank ^ 1), dist.irecv(got, rank ^ 1)):
            work.wait()
        took.append(time.perf_counter() - began)
    dist.barrier()
    out.put((rank, statistics.median(took[1:])))
    dist.destroy_process_group()


def measure(procs: int, products: int, rounds: int) -> float:
    """Median over ``procs`` processes of their median round, in seconds."""
    import socket

    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ranks = [ctx.Process(target=_rank, args=(r, procs, port, products, rounds, out))
             for r in range(procs)]
    for p in ranks:
        p.start()
    rounds_s = [out.get(timeout=600)[1] for _ in ranks]
    for p in ranks:
        p.join(timeout=60)
    return statistics.median(rounds_s)


def run(procs_list: list[int], work_ms: list[float], rounds: int) -> list[dict[str, Any]]:
    cores = len(os.sched_getaffinity(0))
    rate = _products_per_ms()
    swap = measure(2, 0, rounds)  # a swap with the cores to spare
    rows = []
    for ms in work_ms:
        products = max(1, round(ms * rate))
        alone = products / rate / 1e3
        for procs in procs_list:
            measured = measure(procs, products, rounds)
            modelled = alone * max(1.0, procs / cores) + swap
            rows.append({"procs": procs, "cores": cores, "work_ms": alone * 1e3,
                         "swap_ms": swap * 1e3, "round_ms": measured * 1e3,
                         "modelled_ms": modelled * 1e3,
                         "wait_ms": (measured - modelled) * 1e3,
                         "ratio": measured / modelled})
            print(f"{procs} processes, {alone * 1e3:.1f} ms work: round {measured * 1e3:.2f} ms,"
                  f" modelled {modelled * 1e3:.2f} ms", flush=True)
    return rows


def markdown(rows: list[dict[str, Any]], env: dict[str, Any]) -> str:
    import pandas as pd

    table = pd.DataFrame(rows)[["procs", "cores", "work_ms", "round_ms", "modelled_ms",
                                "wait_ms", "ratio"]]
    return "\n".join([
        "# A lockstep swap when ranks outnumber the cores", "",
        (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs, "
         f"shared; load {env['loadavg_start'][0]:.1f} at start, {env['loadavg_end'][0]:.1f} "
         f"at end) · 1 torch thread per process, pairs swapping {SWAP_VALUES * 4 // 1000} KB "
         f"through gloo after each round's work"), "",
        table.to_markdown(index=False, floatfmt=(".0f", ".0f", ".2f", ".2f", ".2f", ".2f",
                                                 ".2f")), "",
        ("`work_ms`: a round's matrix products alone; `modelled_ms`: that work times "
         "max(1, procs / cores) plus a swap with the cores to spare (the planner's model); "
         "`wait_ms`: what a round took beyond it — each swap's wait for a peer that is not on a "
         "core."), ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_args(ap)
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--work-ms", type=float, nargs="+", default=[1.0, 3.0, 10.0])
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    out = output_dir(args)
    env, start = environment(), time.perf_counter()
    rows = run(args.procs, [1.0] if args.quick else args.work_ms, 20 if args.quick
               else args.rounds)
    finish(env, start)
    text = markdown(rows, env)
    print(text)
    if out is not None:
        import pandas as pd

        write_results(out, "oversubscribed_swap", payload(env, pd.DataFrame(rows), rows, args),
                      text)


if __name__ == "__main__":
    main()
