"""Benchmarks keep running as the engines change: their ``--quick`` smoke runs, end to end."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_local_vs_single_quick_run_measures_every_configuration():
    """It wraps the engines' epoch methods to time CPU; a renamed method broke it silently once."""
    done = subprocess.run([sys.executable, "benchmarks/local_vs_single.py", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    for model in ("gcn", "gcnii"):
        for config in ("single", "local S2 C8", "local S2 C8 recompute", "local S4 C16"):
            row = rf"^\s*{model}\s+{config}\s+\d+\.\d+"
            assert re.search(row, done.stdout, re.MULTILINE), \
                f"no {model} {config} row in:\n{done.stdout[-2000:]}"
    assert "wrote" not in done.stdout  # --quick writes no results


def test_dashboard_latency_quick_run_reports_no_replaced_plot():
    """A live page in Chromium: its row has every figure, and no plot was swapped whole."""
    done = subprocess.run([sys.executable, "benchmarks/dashboard_latency.py", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    row = re.search(r"'graph': 'synthetic', 'nodes': 2000, 'cards_s': [\d.]+.*"
                    r"'points_gained': (\d+).*'plots_replaced': (\d+)\}", done.stdout)
    assert row, f"no synthetic row in:\n{done.stdout[-2000:]}"
    assert int(row.group(2)) == 0
    assert "wrote" not in done.stdout


def test_denormals_quick_run_measures_both_settings_in_both_modes():
    """Each setting trains in its own child process (the setting travels by environment)."""
    done = subprocess.run([sys.executable, "benchmarks/denormals.py", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    for mode in ("single", "pipeline"):
        for setting in ("flushed", "kept"):
            row = rf"^\d+\s+{mode}\s+{setting}\s+\d+\.\d+\s+\d+\.\d+"
            assert re.search(row, done.stdout, re.MULTILINE), \
                f"no {mode} {setting} row in:\n{done.stdout[-2000:]}"
    assert "wrote" not in done.stdout


def test_efficiency_quick_run_measures_copies_side_by_side_and_every_mode():
    """Two copies of ``local`` run at once give the side-by-side reference; every distributed
    row has its three efficiencies and its bytes equal ``gp.comm_volume``."""
    done = subprocess.run([sys.executable, "benchmarks/efficiency.py", "--quick", "--ranks", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    for model in ("gcn", "gcnii"):
        for config in ("single R=1 threads=1 copies=2", "local R=2 threads=1 copies=2",
                       "pipeline R=2 threads=1 copies=1", "graph R=2 threads=1 copies=1"):
            assert re.search(rf"^{model} {config}: \d+\.\d+ s/epoch", done.stdout, re.MULTILINE), \
                f"no {model} {config} line in:\n{done.stdout[-2000:]}"
    header = next(line for line in done.stdout.splitlines() if "side_by_side_efficiency" in line)
    rows = [line.split() for line in done.stdout.splitlines()
            if re.match(r"^\d+\s+gcn", line)]
    assert len(rows) == 4, done.stdout[-2000:]
    names = header.split()
    for row in rows:
        values = dict(zip(names, row[1:]))
        assert float(values["side_by_side_efficiency"]) > 0, row
        assert values["bytes"] == values["predicted_bytes"], row
    assert "wrote" not in done.stdout


def test_squirrel_quick_run_trains_exact_and_chunked():
    """Issue #28's ablation script: exact and the paper's chunked set on Squirrel, end to end."""
    done = subprocess.run([sys.executable, "benchmarks/squirrel.py", "--quick"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.split()[:3] == ["gcnii16", "3", "single"] for line in lines)
    assert any(line.split()[:3] == ["gcnii16", "3", "all_on"] for line in lines)
    assert "wrote" not in done.stdout  # --quick writes no results


def test_history_dtype_quick_run_trains_both_storages():
    """Issue #24's compact-history accuracy script, end to end: float32 and bfloat16 rows."""
    done = subprocess.run([sys.executable, "benchmarks/history_dtype.py", "--quick"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split()[:3] for line in done.stdout.splitlines()]
    assert ["cora/gcnii32", "3", "float32"] in rows and ["cora/gcnii32", "3", "bfloat16"] in rows
    assert "wrote" not in done.stdout


def test_heap_ceiling_quick_run_trains_with_and_without_a_limit():
    """A pipeline with no memory limit, then under a limit its estimate just fits: both train,
    and the capped ranks trim their heaps (a 3,000-node run's estimate is small beside the
    worker's start size: the ceiling is below what a rank holds, so each rank trims)."""
    done = subprocess.run([sys.executable, "benchmarks/heap_ceiling.py", "--quick"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(line for line in done.stdout.splitlines() if line.startswith("| quick |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert len(cells) == 10 and not cells[6].startswith("failed"), row
    assert float(cells[5]) > 0 and "wrote" not in done.stdout
    assert all(int(t) > 0 for t in cells[9].split(" / ")), row


def test_graph_gap_quick_run_times_both_parts_alone_and_every_swap_of_a_run():
    """Each part's compute with a loopback communicator, and in a real run one halo swap per
    aggregation each way (the final evaluation's swaps left out)."""
    done = subprocess.run([sys.executable, "benchmarks/graph_gap.py", "--quick"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    alone = re.findall(r"^\|\s+([01])\s+\|\s+1,[45]\d\d\s+\|\s+[\d,]+\s+\|\s+(\d+\.\d+)",
                       done.stdout, re.MULTILINE)
    assert [rank for rank, _ in alone] == ["0", "1"] and all(float(s) > 0 for _, s in alone)
    # GCNII-4: four aggregations, forward and backward
    swaps = re.findall(r"^\|\s+([01])\s+\|\s+\d+\.\d+\s+\|\s+\d+\.\d+\s+\|\s+(\d+)\s+\|",
                       done.stdout, re.MULTILINE)
    assert swaps == [("0", "8"), ("1", "8")], done.stdout[-2000:]
    assert "wrote" not in done.stdout


def test_plan_memory_quick_run_measures_every_mode_under_its_limit():
    """The plan's layouts train 2 epochs each, the distributed ones also on workers whose
    memory_limit their estimate fits: every layout has a measured peak, and the pipeline and
    graph ranks trim (a 3,000-node run's ceiling is below a worker's start size)."""
    done = subprocess.run([sys.executable, "benchmarks/plan_memory.py", "--quick"],
                          capture_output=True, text=True, cwd=ROOT, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in done.stdout.splitlines() if line.startswith("| quick ")]
    modes = {row[1].split()[0] for row in rows}
    assert {"single", "pipeline", "graph"} <= modes, done.stdout
    assert all(float(row[3]) > 0 for row in rows), done.stdout  # measured_peak
    assert all(int(row[6]) > 0 for row in rows  # graph ranks trim at their halo swaps
               if row[1].startswith(("pipeline", "graph"))), done.stdout
    assert "wrote" not in done.stdout
