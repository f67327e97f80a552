"""Exact full-graph ``single`` mode vs plain PyTorch Geometric, same model, side by side.

Measures, for a 32-layer GCNII and a 32-layer GCN (hidden 64) on a synthetic 100K-node graph:

* median training-epoch time (forward + backward + Adam step, no evaluation), after warm-up;
  ours runs the public step ``gnnpipe.engine.single.train_epoch`` on ``normalized_adjacency``
  (CSR sparse-dense matmul), PyG runs ``GCN2Conv`` / ``GCNConv`` edge-index message passing;
* peak memory: every (model, implementation, round) runs in a fresh child process with
  ``torch.set_num_threads(2)``; it reports ``ru_maxrss`` (absolute peak) and ``ru_maxrss``
  minus the RSS right before training (the training increment).

Children alternate ours/PyG (order flipped every round) so machine noise hits both sides;
compare the ratios, not the absolute seconds.

Run (from the repository root)::

    .venv/bin/python benchmarks/single_vs_pyg.py                 # full size, writes results/
    .venv/bin/python benchmarks/single_vs_pyg.py --quick          # smoke test, writes nothing
    .venv/bin/python benchmarks/single_vs_pyg.py --nodes 20000 --layers 8 --epochs 5

Writes ``benchmarks/results/single_vs_pyg.json`` (raw numbers, environment) and ``.md``.
"""

from __future__ import annotations

import argparse
import itertools
import resource
import statistics
import subprocess
import sys
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
IMPLS = ("ours", "pyg")
HIDDEN, LR, ALPHA, THETA = 64, 0.01, 0.1, 0.5
DROPOUT = {"gcnii": 0.6, "gcn": 0.5}  # gnnpipe's defaults for each family, used by both sides


# --------------------------------------------------------------------------- child process
def _pyg_model(name: str, in_dim: int, out_dim: int, layers: int) -> Any:
    import torch.nn.functional as F
    from torch import nn
    from torch_geometric.nn import GCN2Conv, GCNConv

    p = DROPOUT[name]

    class PygGCNII(nn.Module):  # PyG's examples/gcn2_cora.py, edge_index + edge_weight
        def __init__(self) -> None:
            super().__init__()
            self.lins = nn.ModuleList([nn.Linear(in_dim, HIDDEN), nn.Linear(HIDDEN, out_dim)])
            self.convs = nn.ModuleList(
                GCN2Conv(HIDDEN, ALPHA, THETA, layer=i + 1, shared_weights=True, normalize=False,
                         cached=True) for i in range(layers))

        def forward(self, x, edge_index, edge_weight):  # type: ignore[no-untyped-def]
            x = x_0 = self.lins[0](F.dropout(x, p, self.training)).relu()
            for conv in self.convs:
                x = conv(F.dropout(x, p, self.training), x_0, edge_index, edge_weight).relu()
            return self.lins[1](F.dropout(x, p, self.training))

    class PygGCN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            dims = [in_dim] + [HIDDEN] * (layers - 1) + [out_dim]
            self.convs = nn.ModuleList(GCNConv(a, b, cached=True)
                                       for a, b in itertools.pairwise(dims))

        def forward(self, x, edge_index, edge_weight):  # type: ignore[no-untyped-def]
            for i, conv in enumerate(self.convs):
                x = conv(F.dropout(x, p, self.training), edge_index)
                if i < len(self.convs) - 1:
                    x = x.relu()
            return x

    return PygGCNII() if name == "gcnii" else PygGCN()


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """Build graph and model, warm up, time ``epochs`` epochs; report times and memory."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    import gnnpipe as gp
    from gnnpipe.engine import single
    from gnnpipe.engine.graph import normalized_adjacency

    torch.set_num_threads(2)
    data = gp.datasets.synthetic(num_nodes=cfg["nodes"], avg_degree=10, num_classes=8,
                                 num_features=64, homophily=0.8, seed=0)
    name, layers, in_dim = cfg["model"], cfg["layers"], data.x.size(1)
    out_dim = gp.datasets.num_classes(data)
    ours_kw = {"alpha": ALPHA, "theta": THETA} if name == "gcnii" else {}
    torch.manual_seed(0)
    build = getattr(gp.models, name)
    ours = build(in_dim, HIDDEN, out_dim, layers, dropout=DROPOUT[name], **ours_kw)
    torch.manual_seed(0)
    pyg = _pyg_model(name, in_dim, out_dim, layers)
    counts = {k: sum(p.numel() for p in m.parameters()) for k, m in (("ours", ours), ("pyg", pyg))}
    assert counts["ours"] == counts["pyg"], f"parameter counts differ: {counts}"
    model = ours if cfg["impl"] == "ours" else pyg
    del ours, pyg
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)

    if cfg["impl"] == "ours":
        adj = normalized_adjacency(data.edge_index, data.num_nodes, model.norm)

        def step(epoch: int) -> float:
            return single.train_epoch(model, data, adj, optimizer, seed=0, epoch=epoch)
    else:
        ei, ew = data.edge_index, None
        if name == "gcnii":  # GCN2Conv(normalize=False) takes pre-normalised weights
            ei, ew = gcn_norm(data.edge_index, None, data.num_nodes, add_self_loops=True)
        mask, y = data.train_mask, data.y

        def step(epoch: int) -> float:
            model.train()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(data.x, ei, ew)[mask], y[mask])
            loss.backward()
            optimizer.step()
            return float(loss.detach())

    rss_before = rss_mb()
    for epoch in range(cfg["warmup"]):
        step(epoch)
    times, losses, r0 = [], [], resource.getrusage(resource.RUSAGE_SELF)
    for epoch in range(cfg["warmup"], cfg["warmup"] + cfg["epochs"]):
        start = time.perf_counter()
        losses.append(step(epoch))
        times.append(time.perf_counter() - start)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    peak = r1.ru_maxrss / 1024  # KiB on Linux
    cpu = {"user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
           "minor_faults": r1.ru_minflt - r0.ru_minflt}  # over the timed epochs
    return {**cfg, "params": counts, "epoch_times": times, "losses": losses,
            "timed_cpu": cpu, "rss_before_mb": rss_before, "peak_rss_mb": peak,
            "increment_mb": peak - rss_before, "threads": torch.get_num_threads(),
            "nnz_with_self_loops": int(data.edge_index.size(1)) + data.num_nodes}


# --------------------------------------------------------------------------- parent
def versions() -> dict[str, str]:
    """torch and PyG versions, read in a separate interpreter (the parent imports neither)."""
    code = "import torch, torch_geometric as g; print(torch.__version__, g.__version__)"
    torch, pyg = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout.split()
    return {"torch": torch, "torch_geometric": pyg}


def summarize(results: list[dict[str, Any]]) -> Any:
    import pandas as pd

    rows = []
    for name, impl in itertools.product(MODELS, IMPLS):
        rs = [r for r in results if (r["model"], r["impl"]) == (name, impl)]
        user, system = (sum(r["timed_cpu"][k] for r in rs) for k in ("user_s", "sys_s"))
        rows.append({"model": name, "impl": impl, "params": rs[0]["params"][impl],
                     "median_epoch_s": statistics.median(t for r in rs for t in r["epoch_times"]),
                     "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in rs),
                     "increment_mb": statistics.median(r["increment_mb"] for r in rs),
                     "cpu_s_per_epoch": (user + system) / sum(r["epochs"] for r in rs),
                     "sys_share": system / (user + system)})
    df = pd.DataFrame(rows)
    med = {impl: df[df.impl == impl].set_index("model").median_epoch_s for impl in IMPLS}
    df["ratio_ours_pyg"] = df.model.map(med["ours"]) / df.model.map(med["pyg"])
    return df


def markdown(df: Any, env: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"# `single` vs PyG ({args.nodes:,} nodes, {args.layers} layers, hidden {HIDDEN})",
             "", (f"{env['date']} · torch {env['torch']} · PyG {env['torch_geometric']} · "
             f"{env['threads']} threads · {env['cpu']} ({env['cpu_count']} CPUs, shared, "
             f"load {env['loadavg_start'][0]:.1f} at start) · {args.rounds} rounds × {args.epochs} "
             f"timed epochs after {args.warmup} warm-up, one fresh process each"), "",
             ("| model | impl | median epoch s | ratio ours/PyG | peak RSS MB "
              "| training increment MB | CPU s/epoch (sys %) |"), "|---|---|---:|---:|---:|---:|---:|"]
    for r in df.itertuples():
        lines.append(f"| {r.model} | {r.impl} | {r.median_epoch_s:.3f} | {r.ratio_ours_pyg:.2f} | "
                     f"{r.peak_rss_mb:.0f} | {r.increment_mb:.0f} | "
                     f"{r.cpu_s_per_epoch:.1f} ({r.sys_share:.0%}) |")
    lines += ["", ("Ratio > 1 means ours is slower. Memory: `ru_maxrss` of the child; increment = "
              "peak minus RSS right before the first warm-up epoch. CPU s/epoch = user + sys "
              "time of the child over its timed epochs (2 threads; below 2× wall time means the "
              "shared machine was contended); sys is mostly page faults from fresh large "
              "allocations."), ""]
    for name, g in df.groupby("model", sort=False):
        o, p = g.set_index("impl").loc["ours"], g.set_index("impl").loc["pyg"]
        speed = (f"**ours is slower than PyG** ({o.ratio_ours_pyg:.2f}× PyG's epoch time)"
                 if o.ratio_ours_pyg > 1
                 else f"ours is faster ({1 / o.ratio_ours_pyg:.2f}× speed-up)")
        mem = o.increment_mb / p.increment_mb
        lines.append(f"- {name}: {speed}; training memory increment {mem:.2f}× PyG's"
                     f"{' (**ours uses more**)' if mem > 1 else ''}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=1, help="timed epochs per child (process)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="fresh children per configuration")
    add_output_args(ap, child=True)
    args = ap.parse_args()
    if serve_child(args, child):
        return
    if args.quick:
        args.nodes, args.layers, args.epochs, args.warmup, args.rounds = 2_000, 4, 2, 1, 1
    out = output_dir(args)

    env, results, start = environment(versions(), threads=2), [], time.perf_counter()
    for rnd in range(args.rounds):
        for name in MODELS:
            for impl in IMPLS if rnd % 2 == 0 else IMPLS[::-1]:  # flip the order every round
                cfg = {"model": name, "impl": impl, "round": rnd, "nodes": args.nodes,
                       "layers": args.layers, "epochs": args.epochs, "warmup": args.warmup}
                r = run_child(__file__, cfg)
                results.append(r)
                print(f"[{time.perf_counter() - start:5.0f}s] round {rnd} {name:5s} {impl:4s} "
                      f"median {statistics.median(r['epoch_times']):.3f}s  "
                      f"peak {r['peak_rss_mb']:.0f} MB  params {r['params']}", flush=True)
    finish(env, start)
    df = summarize(results)
    print(df.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    if out is not None:
        write_results(out, "single_vs_pyg", payload(env, df, results, args),
                      markdown(df, env, args))


if __name__ == "__main__":
    main()
