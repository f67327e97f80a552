"""``gp.plan``'s per-rank memory predictions against ranks that run under a memory limit
(issues #24 and #25).

A plan's memory column is what a rank *needs*: what it must be allowed to hold for its layout
to run. ``benchmarks/plan_choice.py`` measures it with no limit (lean allocator), where chunk
tensors below glibc's mmap threshold (1 MiB under the lean allocator: 16 or more chunks of a
50,000-node graph, 8 of Facebook) leave the freed temporaries of every chunk op as holes in the
heap, and a rank's resident set grows 1.2-1.5× past what it uses (``heap_ceiling.py``). Under a
Dask ``memory_limit`` — the only place the number decides anything — a rank hands those holes
back past 80% of the limit (:class:`gnnpipe.engine.memory.HeapCeiling`), and its peak is what
it needs.

For each case of ``plan_choice.py``'s grid a fresh child process (lean allocator in it and its
workers, 1 torch thread) plans (its own profile; the case's cap as ``memory_limit``), then
trains every layout ``plan_choice`` would train (the best of every mode and the next three
overall) for 2 epochs on fresh workers twice: with no limit, then with a Dask ``memory_limit``
that the largest rank's start size (measured in the first run) plus its estimate fill to 90%
(the nanny acts at 95%). ``single`` trains once, in the child, with no limit. Recorded per
layout: the largest rank's predicted peak and its measured peaks with and without the limit,
the heap trims and the second epoch's seconds of each run.

Run (from the repository root)::

    .venv/bin/python benchmarks/plan_memory.py            # the grid (~30 min)
    .venv/bin/python benchmarks/plan_memory.py --case gat8-20k
    .venv/bin/python benchmarks/plan_memory.py --quick    # smoke test, writes nothing

Writes ``benchmarks/results/plan_memory.{json,md}``; a journal keeps finished cases.
"""

from __future__ import annotations

import argparse
import json
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
from plan_choice import CASES, QUICK, _case, _environ, _to_train

#: The share of the workers' memory_limit the largest rank's estimate and start size fill.
FILLED = 0.9


def _run(plan: Any, index: int, model: Any, data: Any, limit: int) -> dict[str, Any]:
    """Train row ``index`` of the plan's table for 2 epochs on fresh workers of Dask
    ``memory_limit`` ``limit`` (0: none): its largest peak and start size, trims and second
    epoch. The plan's own ``memory_limit`` is left out: its ranks would trim under it too."""
    import copy
    import dataclasses

    import gnnpipe as gp

    with gp.Cluster(n_workers=plan.workers, memory_limit=limit) as cluster:
        run = gp.train(
            copy.deepcopy(model),
            data,
            plan=dataclasses.replace(plan.candidate(index), memory_limit=None),
            epochs=2,
            eval_every=12,
            cluster=cluster,
            progress=False,
            timeout=600.0,
        )
    memory = run.memory()
    return {
        "peak": int(memory["peak_bytes"].max()),
        "start": int(memory["baseline_bytes"].max()),
        "trims": int(memory["heap_trims"].sum()),
        "epoch_s": float(run.history["epoch_time"].iloc[-1]),
    }


def child(cfg: dict[str, Any]) -> dict[str, Any]:
    """One case: plan, then every layout with no limit and under a limit its estimate fits."""
    import torch

    import gnnpipe as gp

    torch.set_num_threads(1)
    data, model, cap = _case(cfg)
    limit = {} if cap is None else {"memory_limit": cap}
    plan = gp.plan(model, data, workers=cfg["case"][4], **limit)
    runs = []
    for i in _to_train(plan.table()):
        candidate = plan.candidate(i)
        predicted = int(max(candidate.peak_bytes))
        row = {
            "layout": candidate.layout.describe(),
            "mode": candidate.mode.value,
            "predicted_peak": predicted,
            "unlimited": _run(plan, i, model, data, 0),
        }
        if candidate.mode.value != "single":  # single trains here, in no Dask worker
            row["worker_limit"] = int((row["unlimited"]["start"] + predicted) / FILLED)
            try:
                row["limited"] = _run(plan, i, model, data, row["worker_limit"])
            except Exception as exc:  # noqa: BLE001 - a rank killed under the limit: recorded
                row["limited"] = {"failed": f"{type(exc).__name__}: {exc}"[:600]}
        runs.append(row)
    return {"name": cfg["name"], "case": cfg["case"], "cap": cap, "runs": runs}


def frames(results: list[dict[str, Any]]) -> tuple[Any, Any]:
    """Every layout's row, and the errors by mode."""
    import pandas as pd

    rows = []
    for r in results:
        for x in r["runs"]:
            free, capped = x["unlimited"], x.get("limited", {})
            rows.append(
                {
                    "case": r["name"],
                    "layout": x["layout"],
                    "mode": x["mode"],
                    "predicted_peak": x["predicted_peak"],
                    "measured_peak": capped.get("peak", None if capped else free["peak"]),
                    "failed": capped.get("failed", ""),
                    "worker_limit": x.get("worker_limit"),
                    "trims": capped.get("trims"),
                    "epoch_s": capped.get("epoch_s"),
                    "unlimited_peak": free["peak"],
                    "unlimited_epoch_s": free["epoch_s"],
                }
            )
    runs = pd.DataFrame(rows)
    runs["measured_peak"] = pd.to_numeric(runs["measured_peak"])
    runs["memory_error"] = runs["predicted_peak"] / runs["measured_peak"] - 1
    runs["unlimited_error"] = runs["predicted_peak"] / runs["unlimited_peak"] - 1
    by_mode = runs.groupby("mode").agg(
        layouts=("layout", "size"),
        failed=("failed", lambda f: int((f != "").sum())),
        median_abs_memory_error=("memory_error", lambda e: e.abs().median()),
        max_abs_memory_error=("memory_error", lambda e: e.abs().max()),
        median_abs_unlimited_error=("unlimited_error", lambda e: e.abs().median()),
        max_abs_unlimited_error=("unlimited_error", lambda e: e.abs().max()),
    )
    return runs, by_mode


def markdown(results: list[dict[str, Any]], env: dict[str, Any]) -> str:
    runs, by_mode = frames(results)
    mb = {c: runs[c] / 1e6 for c in ("predicted_peak", "measured_peak", "unlimited_peak")}
    table = runs.assign(**mb, worker_limit=runs["worker_limit"] / 1e6)
    lines = [
        "# gp.plan's memory column against ranks under a memory limit",
        "",
        (
            f"{env['date']} · torch {env['torch']} · {env['cpu']} ({env['cpu_count']} CPUs, shared; "
            f"load {env['loadavg_start'][0]:.1f} at start, {env['loadavg_end'][0]:.1f} at end) · "
            f"lean allocator, 1 torch thread per process · 2 epochs per layout · "
            f"wall {env['wall_s'] / 60:.0f} min"
        ),
        "",
        "## Error by mode (predicted ÷ measured − 1; the largest rank of each layout)",
        "",
        by_mode.to_markdown(floatfmt=".3f"),
        "",
        "## Every layout (MB; the limited run, then the run with no limit)",
        "",
        table[
            [
                "case",
                "layout",
                "predicted_peak",
                "measured_peak",
                "memory_error",
                "worker_limit",
                "trims",
                "epoch_s",
                "unlimited_peak",
                "unlimited_error",
                "unlimited_epoch_s",
            ]
        ].to_markdown(index=False, floatfmt=".3g"),
        "",
        *[
            f"- **{r.case}, {r.layout}** under {r.worker_limit:.0f} MB: {r.failed}"
            for r in table.itertuples()
            if r.failed
        ],
        "",
        (
            "`worker_limit`: the workers' Dask memory_limit (the largest rank's estimate plus the "
            f"largest start size of the run with no limit, over {FILLED}); `trims`: how often "
            "the ranks handed their heap's holes back (past 80% of the limit); `epoch_s`: the "
            "second epoch; `single` runs in the benchmark's process, once, with no limit."
        ),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_output_args(ap, child=True)
    ap.add_argument("--case", action="append", help="run only these cases")
    args = ap.parse_args()
    if serve_child(args, child):
        return
    cases = (
        QUICK if args.quick else {k: v for k, v in CASES.items() if not args.case or k in args.case}
    )
    out = output_dir(args)
    journal, done, todo = resume_journal(out, "plan_memory", [(n,) for n in cases], ("name",))
    env, start = environment(), time.perf_counter()
    results = list(done)
    for (name,) in todo:
        result = run_child(__file__, {"name": name, "case": cases[name]}, env=_environ())
        results.append(result)
        worst = frames([result])[0]["memory_error"].abs().max()
        print(
            f"{name}: {len(result['runs'])} layouts, largest |memory error| {worst:.1%}", flush=True
        )
        if journal is not None:
            with journal.open("a") as f:
                f.write(json.dumps(result) + "\n")
    finish(env, start)
    text = markdown(results, env)
    print(text)
    if out is not None:
        order = list(cases)
        results.sort(key=lambda r: order.index(r["name"]))
        summary = frames(results)[1].reset_index()
        write_results(out, "plan_memory", payload(env, summary, results, args), text)


if __name__ == "__main__":
    main()
