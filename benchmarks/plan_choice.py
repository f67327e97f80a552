"""Does ``gp.plan`` pick the layout that measures fastest, and do its predictions hold?
(issue #25)

For each case of the grid — a model, a graph, ``N`` workers and optionally a memory cap — a
fresh child process plans (timed, profile included: on a running ``N``-worker cluster passed as
``cluster=`` for even cases, without one for odd ones, so the profile starts its own workers),
then trains the best candidate of every mode and the next three overall (those that fit), each
for ``--epochs`` epochs on a fresh cluster of ``N`` workers, ``--rounds`` times in alternating
orders (a layout's measured epoch is its least-contended round's median; the first two epochs
untimed), in gnnpipe's default worker environment (capped ones under the lean allocator, what a
memory-tight run uses). A cap is what a rank may hold above its process's baseline: the plan's
``memory_limit``; the workers' Dask ``memory_limit`` is the cap plus a loaded worker's baseline
(the graph arrived on it, as when a run starts), over 95% (the nanny acts there), measured once
per case;
``single`` trains in the child with one torch thread, like a worker. A second child trains the
same layouts for 2 epochs under the lean allocator (``GNNPIPE_ALLOCATOR=lean``, in it and its
workers: freed tensors go back to the OS), whose resident peak is what a run needs — what the
memory model predicts. Recorded per layout: predicted and measured epoch (median), peak memory
per rank (the largest; also under the default allocator) and bytes per epoch.

Per case: the planner's pick, the measured best, the regret (measured epoch of the pick ÷ the
measured best's; ``regret_float32`` against the fastest float32 layout, which is all a plan
picks by default while one fits), and the error of every trained layout's prediction
(predicted ÷ measured − 1) by mode; planning time against ten epochs of the pick.

Run (from the repository root)::

    .venv/bin/python benchmarks/plan_choice.py            # the grid (~40 min)
    .venv/bin/python benchmarks/plan_choice.py --case gcnii16-wide  # one case
    .venv/bin/python benchmarks/plan_choice.py --quick    # smoke test, writes nothing

Writes ``benchmarks/results/plan_choice.{json,md}``; a journal keeps finished cases, so a
stopped run resumes where it stopped.
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from typing import Any

from _common import (
    add_output_args,
    environment,
    finish,
    output_dir,
    payload,
    resume_journal,
    run_child,
    serve_child,
    write_results,
)

#: name -> (model family, layers, hidden, graph, workers, cap as a share of single's estimate)
CASES: dict[str, tuple[str, int, int, str, int, float | None]] = {
    "gcnii16-wide": ("gcnii", 16, 64, "syn20k-f2000", 2, None),
    "gcnii32-50k-w2": ("gcnii", 32, 64, "syn50k", 2, None),
    "gcnii32-50k-w4": ("gcnii", 32, 64, "syn50k", 4, None),
    "gcn4-h256": ("gcn", 4, 256, "syn50k", 2, None),
    "gcn64-h16-sparse": ("gcn", 64, 16, "syn30k-d4", 4, None),
    "sage8-h128-dense": ("sage", 8, 128, "syn20k-d40", 2, None),
    "gcnii32-facebook": ("gcnii", 32, 64, "facebook", 2, None),
    "gcnii16-h128-facebook-w4": ("gcnii", 16, 128, "facebook", 4, None),
    "gcnii32-100k-capped": ("gcnii", 32, 64, "syn100k", 2, 0.75),
    "gcn16-50k-dense-capped": ("gcn", 16, 64, "syn50k-d20", 4, 0.65),
    "gat8-20k": ("gat", 8, 64, "syn20k", 2, None),
    "gcnii64-h32-w4": ("gcnii", 64, 32, "syn50k", 4, None),
}
QUICK = {"quick": ("gcnii", 4, 16, "syn3k", 2, None)}
#: Epochs not timed at the start of every run (a fresh worker's first epochs run slower).
SKIPPED = 2


def _graph(spec: str) -> Any:
    """``facebook`` or ``synNk[-fF][-dD]``: a planted-partition graph of N thousand nodes, F
    features (64) and average degree D (10)."""
    import gnnpipe as gp

    if spec == "facebook":
        return gp.datasets.load("facebook")
    parts = spec.split("-")
    options = {p[0]: int(p[1:]) for p in parts[1:]}
    return gp.datasets.synthetic(num_nodes=int(parts[0][3:-1]) * 1000,
                                 avg_degree=options.get("d", 10), num_classes=8,
                                 num_features=options.get("f", 64), seed=0)


def _model(family: str, layers: int, hidden: int, data: Any) -> Any:
    import torch
    from torch_geometric.nn.models import GAT

    import gnnpipe as gp

    torch.manual_seed(0)
    classes = int(data.y.max()) + 1
    if family == "gat":  # no dropout inside the layers: graph parallelism refuses it
        return GAT(data.num_features, hidden, num_layers=layers, out_channels=classes, heads=2,
                   dropout=0.0)
    extra = {"alpha": 0.1, "theta": 0.5} if family == "gcnii" else {}
    return gp.models.build(family, data.num_features, classes, layers, hidden, **extra)


def _to_train(table: Any) -> list[int]:
    """Rows of the plan's table to train: the best fitting one of every mode and the next three
    fitting ones overall, in the table's order (the pick first)."""
    fitting = table[table["fits"]]
    chosen = list(fitting.index[:4])
    for _, group in fitting.groupby("mode", sort=False):
        chosen.append(group.index[0])
    return sorted(set(chosen))


def _train(plan: Any, index: int, model: Any, data: Any, limit: dict[str, Any],
           epochs: int) -> Any:
    """Train row ``index`` of the plan's table on a fresh cluster of the plan's workers (each
    run from the same start); the run."""
    import copy

    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    with gp.Cluster(n_workers=plan.workers, **limit) as cluster:
        return gp.train(copy.deepcopy(model), data, plan=plan.candidate(index), epochs=epochs,
                        eval_every=epochs + 10, cluster=cluster, progress=False, timeout=600.0)


def _case(cfg: dict[str, Any]) -> tuple[Any, Any, int | None]:
    """The case's graph, model and memory cap (a share of single's estimated peak)."""
    import gnnpipe as gp

    family, layers, hidden, graph, _, cap_share = cfg["case"]
    data = _graph(graph)
    model = _model(family, layers, hidden, data)
    if cap_share is None:
        return data, model, None
    return data, model, int(cap_share * gp.estimate_memory(model, data, "single")[
        "peak_bytes"].max())


def _loaded_resident_bytes(data: Any) -> int:
    """This process's resident bytes once gnnpipe's training and profiling code is loaded and
    ``data`` (the graph) has arrived."""
    import gnnpipe.plan.bench
    import gnnpipe.runtime.rank  # noqa: F401
    from gnnpipe.engine.memory import release_freed_memory, resident_bytes

    assert data is not None  # held here while the worker's size is read
    release_freed_memory()
    return resident_bytes()


def _worker_baseline(data: Any) -> int:
    """Resident bytes of a gnnpipe worker as a run starts on it (torch, Dask, PyG and gnnpipe
    loaded, the graph arrived: where a run's ``peak_bytes`` and the plan's estimates count
    from), measured on one."""
    import gnnpipe as gp

    with gp.Cluster(n_workers=1) as cluster:
        return max(cluster.client.run(_loaded_resident_bytes, data).values())


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg["part"]``: ``"time"``: plan (timed) and train the layouts for their epoch times,
    in the workers' default environment; ``"memory"``: train them again for 2 epochs under the
    lean allocator (this process's too) for their peaks."""
    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    data, model, cap = _case(cfg)
    workers = cfg["case"][4]
    # the plan's limit is what a rank may hold above its process's baseline; the workers'
    # Dask memory_limit counts the whole process, and the nanny acts at 95% of it (the time
    # child measures it, the memory child reuses it: both train under the same limit)
    worker_limit = (None if cap is None else cfg.get("worker_limit")
                    or int((cap + _worker_baseline(data)) / 0.95))
    limit = {} if worker_limit is None else {"memory_limit": worker_limit}
    plan_limit = {} if cap is None else {"memory_limit": cap}
    if cfg["part"] == "memory":
        plan = gp.Plan.from_json(cfg["plan_file"])
        peaks = []
        for i in cfg["rows"]:
            run = _train(plan, i, model, data, limit, 2)
            peaks.append(int(run.memory()["peak_bytes"].max()))
        return {"peaks": peaks}
    began = time.perf_counter()
    if cfg["with_cluster"]:  # planned on a cluster already running, as a training one would be
        with gp.Cluster(n_workers=workers, **limit) as cluster:
            began = time.perf_counter()
            plan = gp.plan(model, data, workers=workers, cluster=cluster, **plan_limit)
    else:
        plan = gp.plan(model, data, workers=workers, **plan_limit)
    planning_s = time.perf_counter() - began
    plan.to_json(cfg["plan_file"])
    table, rows, timed = plan.table(), _to_train(plan.table()), {}
    for r in range(cfg["rounds"]):  # alternating orders: the machine's speed drifts
        for i in rows if r % 2 == 0 else rows[::-1]:
            run = _train(plan, i, model, data, limit, cfg["epochs"])
            timed.setdefault(i, []).append((
                statistics.median(run.history["epoch_time"].iloc[SKIPPED:]),
                int(run.memory()["peak_bytes"].max()), int(run.history["comm_bytes"].iloc[-1])))
    runs = []
    for i in rows:
        candidate = plan.candidate(i)
        runs.append({"row": int(i), "layout": candidate.layout.describe(),
                     "mode": candidate.mode.value, "predicted_s": candidate.epoch_time,
                     "measured_s": min(t[0] for t in timed[i]),
                     "rounds_s": [t[0] for t in timed[i]],
                     "predicted_peak": int(max(candidate.peak_bytes)),
                     "default_peak": max(t[1] for t in timed[i]),
                     "predicted_bytes": int(candidate.comm_bytes),
                     "measured_bytes": timed[i][0][2]})
    return {**cfg, "nodes": data.num_nodes, "cap": cap, "worker_limit": worker_limit,
            "planning_s": planning_s,
            "profile_s": plan.profile.seconds, "phases": plan.seconds,
            "pick": plan.layout.describe(),
            "link": [plan.latency, plan.bandwidth],
            "table": table.drop(columns=["ranges", "rank_peak_bytes"]).to_dict("records"),
            "runs": runs}


def run_case(name: str, case: tuple, with_cluster: bool, epochs: int,
             rounds: int) -> dict[str, Any]:
    """One case: its timing child, then its memory child (the runs' peaks under lean). A case
    whose planning or training fails is kept with its error (``failed``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cfg = {"name": name, "case": case, "with_cluster": with_cluster, "epochs": epochs,
               "rounds": rounds, "part": "time", "plan_file": f"{tmp}/plan.json"}
        # capped workers run lean (what a memory-tight run uses): their resident size is then
        # what they need, which the cap is a share of
        try:
            result = run_child(__file__, cfg, env=_environ() if case[5] is not None else None)
        except RuntimeError as exc:
            return {"name": name, "case": case, "with_cluster": with_cluster,
                    "failed": _raised(str(exc)), "error": str(exc)[-3000:]}
        rows = [r["row"] for r in result["runs"]]
        peaks = run_child(__file__, {**cfg, "part": "memory", "rows": rows,
                                     "worker_limit": result["worker_limit"]},
                          env=_environ())["peaks"]
    for run, peak in zip(result["runs"], peaks):
        run["measured_peak"] = peak
    return result


def _raised(text: str) -> str:
    """The last line of a child's traceback that names an exception (its last line if none)."""
    lines = [line for line in text.splitlines() if line.strip()]
    named = [line for line in lines if re.match(r"[\w.]+(Error|Failure|Exception): ", line)]
    return (named or lines)[-1]


def _environ() -> dict[str, str]:
    from gnnpipe.runtime.workerenv import Allocator

    return {**Allocator("lean").environ(), "GNNPIPE_ALLOCATOR": "lean"}


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """One case's pick, measured best, regret and planning cost."""
    runs = result["runs"]
    best = min(runs, key=lambda r: r["measured_s"])
    pick = next(r for r in runs if r["layout"] == result["pick"])
    float32 = [r["measured_s"] for r in runs if "float16" not in r["layout"]]  # not bfloat16 either
    return {"case": result["name"], "workers": result["case"][4],
            "cap": result["cap"], "profile": "cluster=" if result["with_cluster"] else "own",
            "pick": pick["layout"], "pick_s": pick["measured_s"],
            "best": best["layout"], "best_s": best["measured_s"],
            "regret": pick["measured_s"] / best["measured_s"],
            "regret_float32": pick["measured_s"] / min(float32 or [best["measured_s"]]),
            "planning_s": result["planning_s"],
            "planning_epochs": result["planning_s"] / pick["measured_s"],
            "pick_fits_cap": result["cap"] is None or pick["measured_peak"] <= result["cap"]}


def markdown(everything: list[dict[str, Any]], env: dict[str, Any]) -> str:
    import pandas as pd

    results = [r for r in everything if "failed" not in r]
    failed = [f"- **{r['name']}** {tuple(r['case'])}: {r['failed']}"
              for r in everything if "failed" in r]
    summary = pd.DataFrame([_summary(r) for r in results])
    runs = pd.DataFrame([{"case": r["name"], "profile": "cluster=" if r["with_cluster"] else "own",
                          **x} for r in results for x in r["runs"]])
    runs["epoch_error"] = runs["predicted_s"] / runs["measured_s"] - 1
    runs["memory_error"] = runs["predicted_peak"] / runs["measured_peak"] - 1
    by_mode = runs.groupby("mode").agg(
        layouts=("layout", "size"), median_epoch_error=("epoch_error", "median"),
        median_abs_epoch_error=("epoch_error", lambda e: e.abs().median()),
        median_abs_memory_error=("memory_error", lambda e: e.abs().median()))
    by_profile = runs.groupby(["profile", "mode"]).agg(
        median_abs_epoch_error=("epoch_error", lambda e: e.abs().median()))
    within = (summary["regret"] <= 1.10).sum() / len(everything)
    within32 = (summary["regret_float32"] <= 1.10).sum() / len(everything)
    lines = [
        "# gp.plan's pick against the measured fastest layout", "",
        (f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs, shared; "
         f"load {env['loadavg_start'][0]:.1f} at start, {env['loadavg_end'][0]:.1f} at end) · "
         f"1 torch thread per process · {results[0]['epochs']} epochs per layout on a fresh "
         f"cluster, the first {SKIPPED} untimed (peaks: 2 epochs under the lean allocator) · "
         f"wall {env['wall_s'] / 60:.0f} min"), "",
        (f"Pick within 10% of the measured best in **{within:.0%}** of {len(everything)} "
         f"cases, of the best float32 layout in {within32:.0%} (`regret_float32`: by default a "
         f"plan picks a 16-bit history or wire only where no float32 layout fits); "
         f"picks over a memory cap: {int((~summary['pick_fits_cap']).sum())}."), "",
        summary.to_markdown(index=False, floatfmt=".3g"), "",
        *(["Cases that failed (counted as misses):", "", *failed, ""] if failed else []),
        "## Prediction error by mode (predicted ÷ measured − 1, over the layouts trained)", "",
        by_mode.to_markdown(floatfmt=".3f"), "",
        by_profile.to_markdown(floatfmt=".3f"), "",
        "## Every layout trained", "",
        runs[["case", "layout", "predicted_s", "measured_s", "epoch_error", "predicted_peak",
              "measured_peak", "memory_error", "predicted_bytes", "measured_bytes"]]
        .to_markdown(index=False, floatfmt=".3g"), "",
        ("Regret: measured epoch of the pick ÷ the fastest measured among the layouts trained "
         "(the best of every mode and the next three overall). planning_epochs: planning "
         "seconds (profile included) ÷ the pick's measured epoch. Peaks are the largest rank's."),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_args(ap, child=True)
    ap.add_argument("--case", action="append", help="run only these cases")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2,
                    help="runs of every layout, in alternating orders (the fastest counts)")
    args = ap.parse_args()
    if serve_child(args, child):
        return
    cases = QUICK if args.quick else {k: v for k, v in CASES.items()
                                      if not args.case or k in args.case}
    out = output_dir(args)
    jobs = [(name, i) for i, name in enumerate(cases)]
    journal, done, todo = resume_journal(out, "plan_choice", jobs, ("name",))
    env, start = environment(), time.perf_counter()
    results = list(done)
    for name, i in todo:
        result = run_case(name, cases[name], i % 2 == 0, 4 if args.quick else args.epochs,
                          1 if args.quick else args.rounds)
        results.append(result)
        if "failed" in result:
            print(f"{name}: failed: {result['failed']}", flush=True)
        else:
            row = _summary(result)
            print(f"{name}: pick {row['pick']} ({row['pick_s']:.3f} s), best {row['best']} "
                  f"({row['best_s']:.3f} s), regret {row['regret']:.2f}, planning "
                  f"{row['planning_s']:.0f} s = {row['planning_epochs']:.1f} epochs", flush=True)
        if journal is not None:
            import json

            with journal.open("a") as f:
                f.write(json.dumps(result, default=str) + "\n")
    finish(env, start)
    text = markdown(results, env)
    print(text)
    if out is not None:
        order = list(cases)
        results.sort(key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
        import pandas as pd

        summary = pd.DataFrame([_summary(r) for r in results if "failed" not in r])
        write_results(out, "plan_choice", payload(env, summary, results, args), text,
                      default=str)


if __name__ == "__main__":
    main()
