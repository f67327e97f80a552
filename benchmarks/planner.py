"""Planned vs uniform stage split (``gp.plan``) on heterogeneous GCNIIs: measured and predicted.

GCNIIs (hidden 64) on synthetic planted-partition graphs (avg degree 10, 8 classes, homophily
0.8, seed 0), each uneven in its own way:

- ``showcase`` (issue #25's): GCNII-16 on 20,000 nodes with 2,000 features; the input
  projection's forward (dropout and matmul over 2,000 columns) costs as much as a dozen GCNII
  layers, its backward (weights only) little.
- ``wide-input``: the same input on GCNII-32, 15,000 nodes.
- ``wide-head``: GCNII-32 with its classifier replaced by appended blocks, an MLP head
  ``64 → 1024 → 1024 → 8``, heavy forward and backward (15,000 nodes).

``gp.plan(model, data, workers=2, cluster=cluster, modes=["pipeline"])`` profiles the model on
both Dask workers at once (one torch thread each, in context: the chunked epoch with one stage
per block), splits the blocks by dynamic programming and picks the chunk count and schedule
(fill-drain or 1F1B) by simulation. The uniform split (``stage_ranges``, ``gp.train``'s
default: the GNN layers split evenly) runs with the same chunk count and schedule, so the two
differ only in where the stage boundary lies. Target: the planned split's measured epoch at
most 0.9 × the uniform one's.

Both splits train in ``pipeline`` mode on one 2-worker Dask cluster, alternating (uniform,
planned, planned, uniform, ...) for ``--rounds`` rounds of ``--epochs`` timed epochs after one
warm-up epoch. Measured epoch time: median of ``run.history["epoch_time"]`` (training only, the
per-epoch evaluation excluded). Predicted: the simulated makespan of the plan's costs for each
split (``plan.predict(ranges)``). Because this shared machine's speed drifts from minute to
minute, each later round also re-profiles the model just before its runs and predicts both
splits from that fresh profile ("re-profiled"). Per rank, the measured busy seconds (forward +
backward ops of the timeline) sit beside the predicted ones.

Run (from the repository root)::

    .venv/bin/python benchmarks/planner.py             # ~10 min, writes results/planner.{json,md}
    .venv/bin/python benchmarks/planner.py --quick     # smoke test, writes nothing
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import add_output_args, environment, finish, output_dir, write_results

HIDDEN, CLASSES, WARMUP, WORKERS = 64, 8, 1, 2
#: model name -> (input features, MLP head width or 0 for GCNII's own classifier, layers, nodes)
MODELS = {"showcase": (2000, 0, 16, 20_000), "wide-input": (2000, 0, 32, 15_000),
          "wide-head": (64, 1024, 32, 15_000)}
TARGET_ERROR = 0.25
#: The planned split's measured epoch ÷ the uniform one's must be at most this.
TARGET_RATIO = 0.9
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def graph(nodes: int, features: int) -> Any:
    import gnnpipe as gp

    return gp.datasets.synthetic(num_nodes=nodes, avg_degree=10, num_classes=CLASSES,
                                 num_features=features, homophily=0.8, seed=0)


def build(features: int, head: int, layers: int) -> Any:
    """GCNII; with ``head``, its classifier swapped for an MLP ``64 → head → head → classes``."""
    import torch

    import gnnpipe as gp
    from gnnpipe.models import Dense, LayerStack

    torch.manual_seed(0)
    model = gp.models.gcnii(features, hidden=HIDDEN, out_dim=CLASSES, layers=layers)
    if not head:
        return model
    mlp = [Dense(HIDDEN, head, 0.5, act=True, kind="output"),
           Dense(head, head, 0.5, act=True, kind="output"),
           Dense(head, CLASSES, 0.5, act=False, kind="output")]
    return LayerStack([*model.blocks[:-1], *mlp], norm=model.norm, name="gcnii-mlp")


@contextlib.contextmanager
def session_workers(n: int) -> Iterator[str]:
    """A ``dask scheduler`` and ``n`` ``dask worker`` processes, each in a session of its own.

    Where the kernel shares CPU per session (``sched_autogroup_enabled``), a ``LocalCluster``'s
    workers split one session's share; here each rank gets a share of its own, as ranks on
    separate hosts would. Every process started here is stopped on exit.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tcp://127.0.0.1:{port}"
    dask = str(Path(sys.executable).with_name("dask"))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True,
             "env": env}
    procs = [subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", "127.0.0.1:0"], **quiet)]
    try:
        procs += [subprocess.Popen([dask, "worker", address, "--nthreads", "1", "--nworkers", "1",
                                    "--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0"],
                                   **quiet) for _ in range(n)]
        yield address
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in reversed(procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def core_share(seconds: float = 0.5) -> float:
    """Fraction of a core a one-thread matmul loop gets right now (1.0 on an idle machine)."""
    import torch

    a = torch.randn(256, 256)
    wall, cpu = time.perf_counter(), time.thread_time()
    while time.perf_counter() - wall < seconds:
        a @ a
    return (time.thread_time() - cpu) / (time.perf_counter() - wall)


def busy_per_rank(timeline: Any, epochs: list[int]) -> list[float]:
    """Median over ``epochs`` of each rank's forward + backward seconds."""
    df = timeline.df
    df = df[df["kind"].isin(["forward", "backward"]) & df["epoch"].isin(epochs)]
    per = (df["end"] - df["start"]).groupby([df["rank"], df["epoch"]]).sum()
    return [float(per.loc[r].median()) for r in sorted(df["rank"].unique())]


def measure(args: argparse.Namespace, kind: str, log: Any) -> dict[str, Any]:
    import dataclasses

    import gnnpipe as gp
    from gnnpipe.engine.local import stage_ranges
    from gnnpipe.plan.profile import profile_on_workers

    features, head, layers, nodes = MODELS[kind]
    if args.quick:
        features, head, layers, nodes = min(features, 200), head // 8, 4, 1_500
    data = graph(nodes, features)
    model = build(features, head, layers)
    runs = []
    timed = list(range(WARMUP, WARMUP + args.epochs))
    sessions = session_workers(WORKERS) if args.sessions else contextlib.nullcontext(None)
    with sessions as address, gp.Cluster(n_workers=WORKERS, address=address) as cluster:
        cluster.client.wait_for_workers(WORKERS, timeout=120)
        began = time.perf_counter()
        plan = gp.plan(model, data, workers=WORKERS, cluster=cluster, modes=["pipeline"])
        plan_s = time.perf_counter() - began
        log(f"plan in {plan_s:.1f}s:\n{plan}")
        splits = {"uniform": [tuple(r) for r in stage_ranges(model, WORKERS)],
                  "planned": [tuple(r) for r in plan.ranges]}
        predicted = {}
        for name, ranges in splits.items():
            tl = plan.predict(ranges)
            busy = tl.df[tl.df["kind"].isin(["forward", "backward"])]
            predicted[name] = {"epoch_s": tl.makespan(),
                               "busy_s": (busy["end"] - busy["start"]).groupby(busy["rank"])
                               .sum().tolist()}
        for rnd in range(args.rounds):
            # The machine's speed drifts between minutes; a profile taken just before each
            # round separates the cost model's error from that drift.
            fresh = (plan.profile if rnd == 0
                     else profile_on_workers(cluster, WORKERS, model, data, 4 * WORKERS))
            now = {name: dataclasses.replace(plan, profile=fresh).predict(ranges).makespan()
                   for name, ranges in splits.items()}
            order = ("uniform", "planned") if rnd % 2 == 0 else ("planned", "uniform")
            for name in order:
                share = core_share()
                layout = ({"plan": plan} if name == "planned" else
                          {"mode": "pipeline", "stages": WORKERS, "chunks": plan.chunks,
                           "schedule": plan.layout.schedule.value})
                run = gp.train(build(features, head, layers), data,
                               epochs=WARMUP + args.epochs, cluster=cluster, progress=False,
                               timeout=600.0, **layout)
                assert [tuple(r) for r in run.config.ranges] == splits[name]
                times = run.history["epoch_time"].iloc[WARMUP:].tolist()
                runs.append({"split": name, "round": rnd, "epoch_times": times,
                             "median_epoch_s": statistics.median(times),
                             "busy_s": busy_per_rank(run.timeline, timed),
                             "predicted_now_s": now[name],
                             "loadavg": os.getloadavg()[0], "core_share": share})
                log(f"round {rnd} {name:8s} median epoch {runs[-1]['median_epoch_s']:.3f}s "
                    f"(predicted {predicted[name]['epoch_s']:.3f}s, re-profiled {now[name]:.3f}s), "
                    f"load {runs[-1]['loadavg']:.1f}, "
                    f"core share {share:.2f}")
    summary = {}
    for name, ranges in splits.items():
        mine = [r for r in runs if r["split"] == name]
        times = [t for r in mine for t in r["epoch_times"]]
        measured, fastest = statistics.median(times), min(times)
        pred = predicted[name]["epoch_s"]
        summary[name] = {"ranges": ranges, "measured_epoch_s": measured, "min_epoch_s": fastest,
                         "predicted_epoch_s": pred, "error": (pred - measured) / measured,
                         "error_vs_min": (pred - fastest) / fastest,
                         "error_reprofiled": statistics.median(
                             (r["predicted_now_s"] - r["median_epoch_s"]) / r["median_epoch_s"]
                             for r in mine),
                         "measured_busy_s": [statistics.median(r["busy_s"][k] for r in mine)
                                             for k in range(WORKERS)],
                         "predicted_busy_s": predicted[name]["busy_s"]}
    return {"model": kind, "features": features, "head": head, "blocks": len(model),
            "layers": layers, "nodes": nodes,
            "plan": {"ranges": splits["planned"], "chunks": plan.chunks,
                     "schedule": plan.layout.schedule.value,
                     "epoch_time": plan.epoch_time, "stage_times": list(plan.stage_times),
                     "memory": list(plan.memory), "profile_s": plan_s,
                     "chunk_overhead_s": plan.profile.chunk_overhead,
                     "candidates": plan.table()[["layout", "epoch_time"]].to_dict("records")},
            "runs": runs, "summary": summary}


def markdown(results: list[dict[str, Any]], env: dict[str, Any], args: argparse.Namespace) -> str:
    head = (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs, "
            f"shared; load {env['loadavg_start'][0]:.1f} at start, {env['loadavg_end'][0]:.1f} at "
            f"end) · 1 torch thread per process · {args.rounds} rounds × {args.epochs} timed "
            f"epochs after {WARMUP} warm-up · wall {env['wall_s'] / 60:.1f} min")
    title = "# Planned vs uniform split (2 stages, pipeline mode, the plan's chunks and schedule)"
    lines = [title, "", head, ""]
    for result in results:
        lines += section(result, args)
    lines += ["", ("Error is (predicted − measured) / measured. Busy = forward + backward op "
                   "seconds per epoch (median). The fastest epoch is the least-contended one; the "
                   "median is the headline. Profile and epochs are both wall-clock seconds. With the kernel's autogroup scheduling "
                   f"on (`sched_autogroup_enabled` = {env.get('autogroup', 'n/a')}), CPU is "
                   "shared per session, so the run's 2 worker processes split one session's "
                   "share.")]
    return "\n".join(lines) + "\n"


def section(result: dict[str, Any], args: argparse.Namespace) -> list[str]:
    s, plan = result["summary"], result["plan"]
    what = (f"{result['features']:,}-wide input" if not result["head"]
            else f"MLP head {HIDDEN} → {result['head']} → {result['head']} → {CLASSES}")
    lines = [(f"## {result['model']}: GCNII-{result.get('layers', 32)}, "
              f"{result.get('nodes', 15_000):,} nodes, {what}, {result['blocks']} blocks, "
              f"{plan['chunks']} chunks, schedule {plan.get('schedule', 'gnnpipe')}"),
             "",
             ("| split | block ranges | predicted epoch s | measured epoch s (median) | error | "
              "fastest epoch s | error vs fastest | error, re-profiled each round | "
              "busy s/rank predicted | busy s/rank measured |"),
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for name, r in s.items():
        ranges = [tuple(x) for x in r["ranges"]]
        lines.append(f"| {name} | {ranges} | {r['predicted_epoch_s']:.3f} | "
                     f"{r['measured_epoch_s']:.3f} | {r['error']:+.1%} | {r['min_epoch_s']:.3f} | "
                     f"{r['error_vs_min']:+.1%} | {r['error_reprofiled']:+.1%} | "
                     f"{', '.join(f'{b:.3f}' for b in r['predicted_busy_s'])} | "
                     f"{', '.join(f'{b:.3f}' for b in r['measured_busy_s'])} |")
    speedup = s["uniform"]["measured_epoch_s"] / s["planned"]["measured_epoch_s"]
    worst = max(abs(r["error"]) for r in s.values())
    worst_now = max(abs(r["error_reprofiled"]) for r in s.values())
    per_run = "; ".join(f"{r['split']} r{r['round']} {r['median_epoch_s']:.3f} "
                        f"(load {r['loadavg']:.1f}, core share {r.get('core_share', math.nan):.2f})"
                        for r in result["runs"])
    ratio = 1 / speedup
    verdict_speed = ("target met" if ratio <= TARGET_RATIO else "**target missed**")
    verdict_error = "target met" if worst < TARGET_ERROR else "**target missed**"
    lines += ["", ("Median epoch of each run (s; load average and the share of a core a one-thread "
                   f"loop got just before the run): {per_run}"), "",
              (f"- Planned split measured {ratio:.2f}× the uniform split's epoch ({speedup:.2f}× "
               f"as fast; medians; {verdict_speed}: at most {TARGET_RATIO}×)."),
              (f"- Largest |predicted − measured median| / measured: {worst:.1%} "
               f"({verdict_error}: "
               f"under {TARGET_ERROR:.0%}); with a profile taken just before each round: "
               f"{worst_now:.1%}."),
              (f"- Predicted gain of the planned split: "
               f"{s['uniform']['predicted_epoch_s'] / s['planned']['predicted_epoch_s']:.2f}×. "
               f"Profiling and planning took {plan['profile_s']:.1f} s; per-chunk overhead "
               f"(whole model, forward + backward) "
               f"{plan['chunk_overhead_s'] * 1e3:.1f} ms."), ""]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["showcase", "wide-head"],
                    choices=list(MODELS))
    ap.add_argument("--epochs", type=int, default=4, help="timed epochs per run")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each split, alternating")
    ap.add_argument("--sessions", action="store_true",
                    help="workers in sessions of their own (dask scheduler + dask worker) instead "
                         "of a LocalCluster")
    add_output_args(ap)
    ap.add_argument("--render", type=Path, help="rewrite the markdown of a planner.json; no runs")
    args = ap.parse_args()
    if args.render:
        saved = json.loads(args.render.read_text())
        for key in ("epochs", "rounds"):
            setattr(args, key, int(saved["args"][key]))
        text = markdown(saved["results"], saved["env"], args)
        args.render.with_suffix(".md").write_text(text)
        print(text)
        return
    import torch

    torch.set_num_threads(1)
    if args.quick:
        args.epochs, args.rounds = 1, 1
    out = output_dir(args)
    autogroup = AUTOGROUP.read_text().strip() if AUTOGROUP.exists() else "n/a"
    env, start = environment(autogroup=autogroup), time.perf_counter()

    def log(text: str) -> None:
        print(f"[{time.perf_counter() - start:5.0f}s] {text}", flush=True)

    results = [measure(args, name, log) for name in args.models]
    finish(env, start)
    text = markdown(results, env, args)
    print(text)
    if out is not None:
        payload = {"env": env, "args": {k: str(v) for k, v in vars(args).items()},
                   "results": results}
        write_results(out, "planner", payload, text, indent=2, end="", default=str)


if __name__ == "__main__":
    main()
