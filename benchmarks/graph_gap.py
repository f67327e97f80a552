"""Where a ``graph`` epoch's time goes that the planner does not predict (issue #25): its
ranks' compute, or their halo exchanges.

``gp.plan`` predicts a graph rank's compute from the profile's per-row block costs (its rows,
every block, one op each way) and its halo exchanges from the bytes at the link's measured swap
bandwidth. Both are checked here on one case:

1. **Compute alone**: each part of the METIS split runs a graph rank's forward, backward and
   Adam step in this process with a loopback communicator (every receive a zero tensor of its
   shape, every send packed and dropped): its halo rows are concatenated, multiplied and given
   gradients as in a run, but nothing waits on a peer. Compared with the profile's prediction
   for its rows.
2. **A run**: ``gp.train(mode="graph")`` on a 2-worker cluster; per rank and epoch, the
   timeline's forward + backward (which contain the exchanges) and the time spent waiting in
   the halo receives, against the swaps' predicted time (bytes at the measured bandwidth plus
   the measured latency per message).

Case: GCNII-32 (hidden 64) on a 50,000-node synthetic graph (degree 10), 2 parts, 1 thread.

Run (from the repository root)::

    .venv/bin/python benchmarks/graph_gap.py           # ~3 min
    .venv/bin/python benchmarks/graph_gap.py --quick   # smoke test, writes nothing

Writes ``benchmarks/results/graph_gap.{json,md}``.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

from _common import add_output_args, environment, finish, output_dir, payload, write_results

CASE = {"nodes": 50_000, "layers": 32, "hidden": 64, "parts": 2, "epochs": 6}
QUICK = {"nodes": 3_000, "layers": 4, "hidden": 16, "parts": 2, "epochs": 4}
SKIPPED = 2  # untimed epochs of the run (a fresh worker's first epochs run slower)


class LoopbackComm:
    """What a graph rank's aggregation asks of its communicator, with no peer: sends are
    dropped (the caller already packed them), receives are zeros of their shape."""

    def __init__(self, rank: int) -> None:
        self.rank, self.epoch = rank, 0

    def isend(self, tensor: Any, dst: int, kind: str, chunk: int = -1) -> None:
        pass

    def irecv(self, shape: tuple[int, ...], src: int, chunk: int = -1, dtype: Any = None) -> Any:
        import torch

        return torch.zeros(shape, dtype=dtype or torch.float32)

    def wait_all(self) -> None:
        pass


def compute_alone(model: Any, data: Any, parts: int, rank: int, epochs: int) -> dict[str, Any]:
    """Median seconds of part ``rank``'s graph-rank epoch with a loopback communicator."""
    import torch

    from gnnpipe.engine.graph import normalized_adjacency
    from gnnpipe.engine.single import chunk_loss
    from gnnpipe.partition import partition
    from gnnpipe.runtime.graph import GraphContext, halo_plan

    split = partition(data, parts, method="metis", seed=0)
    ordered = split.apply(data)
    work = copy.deepcopy(model).train()
    full = normalized_adjacency(ordered.edge_index, ordered.num_nodes, work.norm)
    plan = halo_plan(full, split.bounds.tolist(), rank)
    x, y, mask = (t[plan.lo:plan.hi] for t in (ordered.x, ordered.y, ordered.train_mask))
    labelled = max(int(ordered.train_mask.sum()), 1)
    optimizer = torch.optim.Adam(work.parameters(), lr=1e-3)
    took = []
    for epoch in range(epochs):
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)
        ctx = GraphContext(plan, LoopbackComm(rank), 0, epoch, training=True)  # type: ignore[arg-type]
        chunk_loss(work(x, ctx), y, mask, labelled).backward()
        optimizer.step()
        took.append(time.perf_counter() - start)
    return {"rank": rank, "rows": plan.hi - plan.lo, "halo": int(plan.halo.numel()),
            "seconds": statistics.median(took[1:])}


def a_run(model: Any, data: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """A graph run on 2 workers: per rank, seconds per epoch of its forward + backward and of
    its halo receives; the link as the planner measures it."""
    import gnnpipe as gp
    from gnnpipe.runtime.link import measure_link

    with gp.Cluster(n_workers=cfg["parts"]) as cluster:
        latency, bandwidth = measure_link(cluster) or (0.0, 0.0)
        run = gp.train(copy.deepcopy(model), data, "graph", parts=cfg["parts"],
                       epochs=cfg["epochs"], eval_every=cfg["epochs"] + 1, cluster=cluster,
                       progress=False)
    tl = run.timeline.df  # the last epoch also holds the final evaluation's swaps: left out
    tl = tl[(tl["epoch"] >= SKIPPED) & (tl["epoch"] < cfg["epochs"] - 1)].assign(
        dur=lambda f: f["end"] - f["start"])
    epochs = tl["epoch"].nunique()
    per = (tl.groupby(["rank", "kind"])["dur"].sum() / epochs).unstack(fill_value=0.0)
    recvs = tl[tl["kind"] == "recv"].groupby("rank")["bytes"].agg(["sum", "count"]) / epochs
    ranks = [{"rank": int(r), "compute_and_exchange_s": float(per.loc[r, "forward"]
                                                             + per.loc[r, "backward"]),
              "recv_wait_s": float(per.loc[r, "recv"]),
              "swaps": int(recvs.loc[r, "count"]),
              "swap_predicted_s": float(recvs.loc[r, "sum"] / bandwidth
                                        + recvs.loc[r, "count"] * latency)}
             for r in per.index]
    return {"epoch_s": statistics.median(run.history["epoch_time"].iloc[SKIPPED:]),
            "swaps_expected": 2 * sum(b.aggregates for b in model.blocks),
            "latency": latency, "bandwidth": bandwidth, "ranks": ranks}


def measure(cfg: dict[str, Any]) -> dict[str, Any]:
    import torch

    import gnnpipe as gp
    from gnnpipe.plan.profile import profile_model
    from gnnpipe.pyg import as_stack

    torch.set_num_threads(1)
    data = gp.datasets.synthetic(num_nodes=cfg["nodes"], avg_degree=10, num_classes=8,
                                 num_features=64, seed=0)
    torch.manual_seed(0)
    model = as_stack(gp.models.build("gcnii", 64, 8, cfg["layers"], cfg["hidden"], alpha=0.1,
                                     theta=0.5), data)
    profile = profile_model(model, data, 8)
    alone = [compute_alone(model, data, cfg["parts"], r, 3) for r in range(cfg["parts"])]
    for part in alone:
        part["predicted_s"] = sum(c.exact_seconds(part["rows"]) + c.step_s
                                  for c in profile.blocks)
    return {**cfg, "alone": alone, "run": a_run(model, data, cfg)}


def markdown(result: dict[str, Any], env: dict[str, Any]) -> str:
    import pandas as pd

    alone = pd.DataFrame(result["alone"]).assign(
        ratio=lambda f: f["seconds"] / f["predicted_s"])
    ranks = pd.DataFrame(result["run"]["ranks"]).assign(
        wait_per_swap_ms=lambda f: 1e3 * f["recv_wait_s"] / f["swaps"],
        predicted_per_swap_ms=lambda f: 1e3 * f["swap_predicted_s"] / f["swaps"])
    run = result["run"]
    head = (f"{env['date']} · {env['cpu']} ({env['cpu_count']} CPUs, shared) · GCNII-"
            f"{result['layers']} hidden {result['hidden']}, {result['nodes']:,} nodes, "
            f"{result['parts']} parts, 1 thread per process")
    link = (f"## A run on {result['parts']} workers: epoch {run['epoch_s']:.3f} s; link "
            f"{run['bandwidth'] / 1e9:.2f} GB/s, {1e3 * run['latency']:.2f} ms a swap")
    legend = ("Seconds per epoch. recv_wait_s: time blocked in the halo receives (the sends "
              "overlap them); swap_predicted_s: what the bytes received take at the link's "
              "bandwidth plus its latency per message.")
    return "\n".join([
        "# Where a graph epoch's time goes", "", head, "",
        "## Compute alone (loopback communicator, one process) against the prediction", "", alone.to_markdown(index=False, floatfmt=[".0f", ",.0f", ",.0f", ".3f", ".3f", ".3f"]), "",
        link, "", ranks.to_markdown(index=False, floatfmt=[".0f", ".3f", ".3f", ".0f", ".3f", ".3f", ".3f"]), "", legend, ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_output_args(ap)
    args = ap.parse_args()
    env, start = environment(), time.perf_counter()
    result = measure(QUICK if args.quick else CASE)
    finish(env, start)
    text = markdown(result, env)
    print(text)
    out = output_dir(args)
    if out is not None:
        import pandas as pd

        summary = pd.DataFrame(result["run"]["ranks"])
        write_results(out, "graph_gap", payload(env, summary, [result], args), text)


if __name__ == "__main__":
    main()
