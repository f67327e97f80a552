"""Cost of GNNPipe's chunked epoch in one process (``mode="local"``) against exact ``"single"``.

Measures, for a 32-layer GCNII and a 32-layer GCN (hidden 64, dropout 0.5) on a synthetic
50K-node graph (avg degree 10, 8 classes, 64 features, homophily 0.8, seed 0):

* median training-epoch time: ``gp.train(..., epochs=N, progress=False)``, median of
  ``run.history["epoch_time"]`` (excludes the per-epoch evaluation) after dropping the first
  2 epochs; ratio local/single per model. Also the process CPU time of each epoch's forward
  and backward (wrapping the engines' ``run_chunks``), which at 1 thread ignores waiting for a
  core on a loaded machine;
* peak memory: each (model, configuration, round) runs in a fresh child process; it reports
  ``ru_maxrss`` (absolute peak) and the increment over the RSS right before ``gp.train`` (the
  increment includes chunking and the adjacency that ``train`` builds).

Configurations: ``single``; ``local`` with (2 stages, 8 chunks), (2 stages, 8 chunks,
``recompute=True``) and (4 stages, 16 chunks). ``local`` keeps two full-graph buffers per
aggregation layer (``Hbuf``, its snapshot; ``dZbuf`` lives in ``Hbuf`` with every technique on),
reported as ``buffers_mb``.
Configurations alternate in rounds (order reversed every other round) so machine noise hits all.

Run (from the repository root)::

    .venv/bin/python benchmarks/local_vs_single.py                # full size, writes results/
    .venv/bin/python benchmarks/local_vs_single.py --quick        # smoke test, writes nothing
    .venv/bin/python benchmarks/local_vs_single.py --nodes 20000 --epochs 5 --rounds 1

Writes ``benchmarks/results/local_vs_single.json`` (raw numbers, environment) and ``.md``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time
from typing import Any

from _common import (
    add_output_args,
    environment,
    finish,
    output_dir,
    payload,
    rss_mb,
    run_child,
    serve_child,
    write_results,
)

MODELS = ("gcnii", "gcn")
CONFIGS: dict[str, dict[str, Any]] = {
    "single": {"mode": "single"},
    "local S2 C8": {"mode": "local", "stages": 2, "chunks": 8},
    "local S2 C8 recompute": {"mode": "local", "stages": 2, "chunks": 8, "recompute": True},
    "local S4 C16": {"mode": "local", "stages": 4, "chunks": 16},
}
HIDDEN, DROPOUT, SKIP = 64, 0.5, 2


# --------------------------------------------------------------------------- child process
def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """Build graph and model, train ``epochs`` epochs with ``gp.train``; report times and memory."""
    import torch

    torch.set_num_threads(cfg["threads"])
    import gnnpipe as gp
    from gnnpipe.engine import local, single

    cpu_times: list[float] = []  # process CPU s of each training step (1 thread: robust to load)

    def timed(fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t0 = time.process_time()
            out = fn(*args, **kwargs)
            cpu_times.append(time.process_time() - t0)
            return out
        return wrapper

    # an epoch's forward and backward (the optimizer step is the same in both modes)
    single.SingleProgram.run_chunks = timed(single.SingleProgram.run_chunks)
    local.LocalEngine.run_chunks = timed(local.LocalEngine.run_chunks)
    data = gp.datasets.synthetic(num_nodes=cfg["nodes"], avg_degree=10, num_classes=8,
                                 num_features=64, homophily=0.8, seed=0)
    torch.manual_seed(0)
    model = getattr(gp.models, cfg["model"])(data.x.size(1), hidden=HIDDEN, out_dim=8,
                                             layers=cfg["layers"], dropout=DROPOUT)
    # local mode: Hbuf and its snapshot (dZbuf lives in Hbuf), n x width fp32, per aggregating block
    widths = [b.out_dim for b in model.blocks if getattr(b, "aggregates", False)]
    buffers_mb = 2 * sum(widths) * data.num_nodes * 4 / 2**20
    kw = {k: v for k, v in CONFIGS[cfg["config"]].items() if k != "mode"}
    rss_before = rss_mb()
    start = time.perf_counter()
    run = gp.train(model, data, CONFIGS[cfg["config"]]["mode"], epochs=cfg["epochs"],
                   progress=False, **kw)
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    times = run.history["epoch_time"].tolist()
    return {**cfg, "epoch_times": times, "median_epoch_s": statistics.median(times[SKIP:]),
            "cpu_epoch_times": cpu_times, "median_cpu_s": statistics.median(cpu_times[SKIP:]),
            "losses": run.history["loss"].tolist(), "train_wall_s": wall,
            "rss_before_mb": rss_before, "peak_rss_mb": peak, "increment_mb": peak - rss_before,
            "buffers_mb": buffers_mb if cfg["config"] != "single" else 0.0,
            "torch_threads": torch.get_num_threads()}


# --------------------------------------------------------------------------- parent
def summarize(results: list[dict[str, Any]]) -> Any:
    import pandas as pd

    rows = []
    for name in MODELS:
        for config in CONFIGS:
            rs = [r for r in results if (r["model"], r["config"]) == (name, config)]
            cpu = [t for r in rs for t in r["cpu_epoch_times"][SKIP:]]
            rows.append({"model": name, "config": config, "cpu_spread": max(cpu) / min(cpu),
                         "median_epoch_s": statistics.median(t for r in rs
                                                             for t in r["epoch_times"][SKIP:]),
                         "median_cpu_s": statistics.median(t for r in rs
                                                           for t in r["cpu_epoch_times"][SKIP:]),
                         "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rs),
                         "increment_mb": statistics.median(r["increment_mb"] for r in rs),
                         "buffers_mb": rs[0]["buffers_mb"]})
    df = pd.DataFrame(rows)
    single = df[df.config == "single"].set_index("model")
    df["ratio_time"] = df.median_epoch_s / df.model.map(single.median_epoch_s)
    df["ratio_cpu"] = df.median_cpu_s / df.model.map(single.median_cpu_s)
    df["ratio_increment"] = df.increment_mb / df.model.map(single.increment_mb)
    df["extra_mb"] = df.increment_mb - df.model.map(single.increment_mb)
    return df


def markdown(df: Any, env: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"# `local` vs `single` ({args.nodes:,} nodes, {args.layers} layers, hidden {HIDDEN})",
             "", (f"{env['date']} · torch {env['torch']} · {env['threads']} thread · {env['cpu']} "
                  f"({env['cpu_count']} CPUs, shared, load {env['loadavg_start'][0]:.1f} at start, "
                  f"{env['loadavg_end'][0]:.1f} at end) · {args.rounds} rounds × {args.epochs} "
                  f"epochs, first {SKIP} dropped, one fresh process each"), "",
             ("| model | config | median epoch s | ratio vs single | median CPU s | CPU ratio "
              "| peak RSS MB | increment MB | extra vs single MB | local buffers MB |"),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in df.itertuples():
        lines.append(f"| {r.model} | {r.config} | {r.median_epoch_s:.2f} | {r.ratio_time:.2f} | "
                     f"{r.median_cpu_s:.2f} | {r.ratio_cpu:.2f} | {r.peak_rss_mb:.0f} | {r.increment_mb:.0f} | {r.extra_mb:+.0f} | "
                     f"{r.buffers_mb:.0f} |")
    lines += ["", ("Epoch time (wall) excludes evaluation; CPU s is the process CPU time of the "
                   "same training step (1 thread, so it does not count time waiting for a core on "
                   "the shared machine). Increment = `ru_maxrss` minus RSS right "
                   "before `gp.train` (includes chunking/METIS and the adjacency). Local buffers = "
                   "2 × (sum of aggregation widths) × n × 4 bytes (`Hbuf` and its snapshot; "
                   "`dZbuf` lives in `Hbuf`)."),
              "", (f"Noise: the timed CPU times of one configuration differ by up to "
                   f"{df.cpu_spread.max():.1f}× between its samples (load {env['loadavg_start'][0]:.0f}"
                   " on 2 cores), so read the time ratios as rough (±50%); memory is the firm "
                   "result."), ""]
    for r in df[df.config != "single"].itertuples():
        slow = (f"{r.ratio_time:.2f}× single's epoch time (CPU {r.ratio_cpu:.2f}×)"
                if r.ratio_time >= 1 else
                f"{1 / r.ratio_time:.2f}× faster than single (CPU {r.ratio_cpu:.2f}×)")
        lines.append(f"- {r.model} {r.config}: {slow}; training memory {r.extra_mb:+.0f} MB vs "
                     f"single ({r.ratio_increment:.2f}× its increment; buffers alone "
                     f"{r.buffers_mb:.0f} MB).")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=50_000)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=3, help=f"epochs per child (first {SKIP} dropped)")
    ap.add_argument("--rounds", type=int, default=2, help="fresh children per configuration")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    add_output_args(ap, child=True)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    import torch

    torch.set_num_threads(args.threads)
    if args.quick:
        args.nodes, args.layers, args.epochs, args.rounds = 2_000, 4, 3, 1
    if args.epochs <= SKIP:
        ap.error(f"--epochs must exceed {SKIP} (the first {SKIP} are dropped)")
    out = output_dir(args)

    env, results, start = environment(threads=args.threads), [], time.perf_counter()
    for rnd in range(args.rounds):
        for name in MODELS:
            for config in CONFIGS if rnd % 2 == 0 else list(CONFIGS)[::-1]:
                cfg = {"model": name, "config": config, "round": rnd, "nodes": args.nodes,
                       "layers": args.layers, "epochs": args.epochs, "threads": args.threads}
                r = run_child(__file__, cfg)
                results.append(r)
                print(f"[{time.perf_counter() - start:5.0f}s] round {rnd} {name:5s} {config:22s} "
                      f"median {r['median_epoch_s']:.2f}s (CPU {r['median_cpu_s']:.2f}s)  peak {r['peak_rss_mb']:.0f} MB  "
                      f"increment {r['increment_mb']:.0f} MB", flush=True)
    finish(env, start)
    df = summarize(results)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if out is not None:
        write_results(out, "local_vs_single", payload(env, df, results, args),
                      markdown(df, env, args))


if __name__ == "__main__":
    main()
