"""How soon a live dashboard shows a training run, and what keeping it live costs.

A 2-stage pipeline (GCN-3, hidden 16, 4 chunks) trains on Dask workers in the background, with
both of this machine's cores busy, while `Dashboard(run).serve()` is open in headless Chromium
(Debian's ``chromium``). For each graph (synthetic 50,000 nodes, avg degree 8; Facebook
Page-Page, 22,470 nodes):

* ``cards_s``: seconds from the page's load to every card's title shown;
* ``first_point_s``: from the load to the training curve's first point;
* ``chromium_cpu_s`` / ``server_cpu_s``: CPU seconds Chromium's processes and this process
  (the Panel server, the run's event thread) spent up to then;
* over a ``--watch`` window after that: epochs trained, curve points gained, the browser's and the
  server's CPU seconds, and how many plots were replaced whole (a new bokeh figure id; 0 when
  every update is streamed into the plots drawn first).

Run (from the repository root)::

    .venv/bin/python benchmarks/dashboard_latency.py          # ~2 min, writes results/dashboard_latency.*
    .venv/bin/python benchmarks/dashboard_latency.py --quick  # smoke test, writes nothing
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pandas as pd
from _common import add_output_args, environment, finish, output_dir, write_results

import gnnpipe as gp

CARDS = ["Training", "Stage timeline", "Ranks", "Communication", "Partitions",
         "Schedule explorer"]


def chromium_cpu() -> float:
    """CPU seconds of every running Chromium process."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            text = Path(stat).read_text()
        except OSError:  # the process ended
            continue
        name, rest = text.split("(", 1)[1].rsplit(")", 1)
        if "chrom" in name:
            fields = rest.split()  # from the state on: utime and stime are the 12th and 13th
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def server_cpu() -> float:
    return sum(os.times()[:2])


def graph(name: str, quick: bool) -> Any:
    if name == "facebook":
        return gp.datasets.load("facebook")
    return gp.datasets.synthetic(2_000 if quick else 50_000, avg_degree=8, num_features=16, seed=0)


def measure(name: str, browser: Any, cluster: Any, watch: float, quick: bool) -> dict[str, Any]:
    from dashboard.app import Dashboard
    from dashboard.page import CURVE_POINTS, FIGURE_IDS

    data = graph(name, quick)
    model = gp.models.gcn(data.num_features, hidden=16, out_dim=gp.datasets.num_classes(data),
                          layers=3)
    run = gp.train(model, data, "pipeline", stages=2, chunks=4, epochs=100_000, cluster=cluster,
                   background=True, progress=False)
    server, url = Dashboard(run, refresh_ms=250).serve()
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url, wait_until="networkidle", timeout=300_000)
        loaded, cpu0, srv0 = time.monotonic(), chromium_cpu(), server_cpu()
        for card in CARDS:
            page.get_by_text(card, exact=True).first.wait_for(timeout=300_000)
        cards = time.monotonic() - loaded
        while page.evaluate(CURVE_POINTS) < 1:
            time.sleep(0.1)
        row = {"graph": name, "nodes": data.num_nodes, "cards_s": cards,
               "first_point_s": time.monotonic() - loaded,
               "chromium_cpu_s": chromium_cpu() - cpu0, "server_cpu_s": server_cpu() - srv0}
        figures, epochs = set(page.evaluate(FIGURE_IDS)), len(run.history)
        points = page.evaluate(CURVE_POINTS)
        cpu0, srv0 = chromium_cpu(), server_cpu()
        time.sleep(watch)
        row.update({"watch_s": watch, "epochs_trained": len(run.history) - epochs,
                    "points_gained": page.evaluate(CURVE_POINTS) - points,
                    "watch_chromium_cpu_s": chromium_cpu() - cpu0,
                    "watch_server_cpu_s": server_cpu() - srv0,
                    "plots_replaced": len(figures - set(page.evaluate(FIGURE_IDS)))})
        page.close()
    finally:
        server.stop()
        run.stop()
        run.wait(timeout=120)
    print(row, flush=True)
    return row


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", nargs="+", default=["synthetic", "facebook"],
                    choices=["synthetic", "facebook"])
    ap.add_argument("--watch", type=float, default=20.0, help="seconds watched after the load")
    add_output_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.graphs, args.watch = ["synthetic"], 3.0
    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    start, env = time.perf_counter(), environment()
    with gp.Cluster(n_workers=2) as cluster, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    args=["--no-sandbox", "--disable-gpu"])
        rows = [measure(name, browser, cluster, args.watch, args.quick) for name in args.graphs]
        browser.close()
    finish(env, start)
    frame = pd.DataFrame(rows)
    print(frame.to_string())
    out = output_dir(args)
    if out is None:
        return
    text = "\n".join([
        "# Live dashboard: time to show a run, and the cost of keeping it live", "",
        (f"{env['date']} · {env['cpu']} ({env['cpu_count']} CPUs, both training the run; load "
         f"{env['loadavg_start'][0]:.1f} at start) · pipeline 2 × 4, GCN-3 · refresh 250 ms · "
         f"wall {env['wall_s'] / 60:.1f} min"), "",
        frame.to_markdown(index=False, floatfmt=".2f"), "",
        ("`cards_s`/`first_point_s`: from the page's load. CPU columns: seconds over the same "
         "span (Chromium's processes; this process, which serves the page). `plots_replaced`: "
         "figures whose bokeh id changed during the watch (0: every update streamed)."), ""])
    write_results(out, "dashboard_latency", {"environment": env, "rows": rows}, text)


if __name__ == "__main__":
    main()
