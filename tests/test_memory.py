"""Measured memory: ``run.memory()`` in every mode, counted from the run's start, the same way in
the caller's process and in a rank (gnnpipe.engine.memory)."""

from __future__ import annotations

import copy
import dataclasses
import types

import pandas as pd
import pytest
import torch

import gnnpipe as gp
from dashboard.stream import ReplaySource
from dashboard.views.ranks import memory_table
from gnnpipe.engine.memory import HeapCeiling, MemoryMeter, resident_bytes
from gnnpipe.run import MEMORY_COLUMNS

MiB = 2**20


def test_the_meter_counts_what_is_allocated_after_it_begins():
    meter = MemoryMeter().begin()
    assert meter.baseline == pytest.approx(resident_bytes(), abs=8 * MiB)
    block = torch.ones(64 * MiB // 4)  # 64 MiB, touched
    assert meter.peak() >= 63 * MiB
    del block
    assert meter.peak() >= 63 * MiB  # a high-water mark: freeing does not lower it
    record: dict = {}
    assert meter(record) is False and record["peak_bytes"] >= 63 * MiB
    assert record["device_peak_bytes"] == 0 and record["baseline_bytes"] == meter.baseline
    assert meter.begin().peak() < 16 * MiB  # a new start forgets the earlier block


def test_a_heap_ceiling_trims_above_it_and_again_only_after_growth(monkeypatch):
    """Above the ceiling it hands freed heap back (``malloc_trim``: the holes chunk tensors
    leave, tests/runtime/test_worker_env.py); a process that really holds more than the
    ceiling is trimmed again only once it has grown by the slack."""
    from gnnpipe.engine import memory

    held = [900 * MiB]
    trims: list[int] = []

    def trim() -> bool:
        trims.append(held[0])
        held[0] -= 100 * MiB  # the holes handed back
        return True

    monkeypatch.setattr(memory, "resident_bytes", lambda: held[0])
    monkeypatch.setattr(memory, "release_freed_memory", trim)
    ceiling = HeapCeiling(500 * MiB, slack=8 * MiB)
    ceiling()
    assert trims == [900 * MiB] and held[0] == 800 * MiB
    held[0] += 4 * MiB
    ceiling()
    assert len(trims) == 1  # grew less than the slack since: no futile trim every op
    held[0] += 8 * MiB
    ceiling()
    assert trims == [900 * MiB, 812 * MiB] and ceiling.trims == 2
    held[0] = 400 * MiB
    ceiling()
    assert ceiling.trims == 2  # under the ceiling
    held[0] = 600 * MiB
    ceiling()  # back above it, though below what the last trim left: trims again
    assert trims[-1] == 600 * MiB and ceiling.trims == 3
    with pytest.raises(ValueError, match="ceiling: expected a positive number of bytes, got 0"):
        HeapCeiling(0)
    with pytest.raises(ValueError, match="slack: expected a non-negative number of bytes, got -1"):
        HeapCeiling(MiB, slack=-1)


def test_a_meter_records_its_ceilings_trims(monkeypatch):
    from gnnpipe.engine import memory

    ceiling = HeapCeiling(MiB)
    record: dict = {}
    MemoryMeter(ceiling=ceiling).begin()(record)
    assert record["heap_trims"] == 0
    ceiling.trims = 3
    MemoryMeter(ceiling=ceiling)(record)
    assert record["heap_trims"] == 3
    MemoryMeter()(record)
    assert record["heap_trims"] == 0  # no ceiling (one-process modes, no memory_limit)
    memory._malloc_trim.cache_clear()
    try:  # without glibc's malloc_trim (musl, macOS) nothing is trimmed, and it says so
        monkeypatch.setattr(memory.ctypes, "CDLL", lambda name: object())
        assert memory.release_freed_memory() is False
    finally:
        memory._malloc_trim.cache_clear()


def test_a_ranks_heap_ceiling_is_the_lower_of_its_plans_and_its_workers(monkeypatch):
    """80% of a plan's limit above the rank's baseline, 80% of its worker's Dask limit, the
    lower of the two; none with neither."""
    import distributed

    from gnnpipe.runtime.workerenv import heap_ceiling

    assert heap_ceiling() is None  # not in a Dask worker, no plan
    assert heap_ceiling(1000 * MiB, 500 * MiB).ceiling == 1300 * MiB
    assert heap_ceiling(1, 0).ceiling == 1  # a ceiling is never 0 bytes
    worker = types.SimpleNamespace(memory_manager=types.SimpleNamespace(memory_limit=1000 * MiB))
    monkeypatch.setattr(distributed, "get_worker", lambda: worker)
    assert heap_ceiling().ceiling == 800 * MiB
    assert heap_ceiling(100 * MiB, 500 * MiB).ceiling == 580 * MiB
    assert heap_ceiling(1000 * MiB, 500 * MiB).ceiling == 800 * MiB


def test_memory_advice_names_the_lean_allocator_only_where_ranks_lack_it(small_graph):
    from gnnpipe.runtime.advice import memory_advice
    from gnnpipe.runtime.workerenv import Allocator

    model = gp.models.gcn(small_graph.num_features, hidden=16, out_dim=4, layers=4)
    job = gp.train(model, small_graph, "local", stages=2, chunks=4, epochs=1,
                   progress=False).config
    job = dataclasses.replace(job, mode=gp.Mode.PIPELINE)
    huge = memory_advice(model, small_graph, job, 1, None, Allocator.HUGE)
    assert huge.startswith("gp.estimate_memory puts rank 1's need at ")
    assert huge.endswith("; gp.Cluster(allocator='lean') or GNNPIPE_ALLOCATOR=lean makes a rank "
                         "hold only what it uses")
    assert "allocator" not in memory_advice(model, small_graph, job, 1, None, Allocator.LEAN)


def test_one_process_runs_do_not_count_the_callers_memory(small_graph):
    model = gp.models.gcn(small_graph.num_features, hidden=16, out_dim=4, layers=2)
    gp.train(copy.deepcopy(model), small_graph, epochs=2, progress=False)  # one-time set-up
    plain = gp.train(copy.deepcopy(model), small_graph, epochs=2, progress=False).memory()
    ballast = torch.ones(256 * MiB // 4)  # the caller holds 256 MiB more
    held = gp.train(copy.deepcopy(model), small_graph, epochs=2, progress=False).memory()
    assert list(held.columns) == list(MEMORY_COLUMNS) and held["rank"].tolist() == [0]
    assert int(held["baseline_bytes"][0]) - int(plain["baseline_bytes"][0]) >= 250 * MiB
    assert int(held["peak_bytes"][0]) < 128 * MiB  # the ballast is not the run's
    assert float(ballast[0]) == 1.0


def test_peak_grows_with_the_graph_at_least_by_its_activations():
    """A GCN-4 of width 64 keeps at least one n x 64 float activation per layer for its
    backward: the peak of a 40,000-node run exceeds that bound (41 MB), a 4,000-node run's
    stays below it."""
    layers, hidden, peaks = 4, 64, {}
    for n in (4_000, 4_000, 40_000):  # the first run pays one-time set-up
        data = gp.datasets.synthetic(num_nodes=n, avg_degree=8, num_features=16, seed=0)
        model = gp.models.gcn(16, hidden=hidden, out_dim=8, layers=layers, dropout=0.0)
        run = gp.train(model, data, epochs=2, progress=False)
        peaks[n] = int(run.memory()["peak_bytes"][0])
        assert int(run.summary()["peak_bytes"][0]) == peaks[n]
    bound = 40_000 * hidden * 4 * layers
    assert peaks[40_000] > bound > peaks[4_000]


def test_local_reports_one_rank_and_a_saved_run_keeps_it(small_graph, tmp_path):
    model = gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=4)
    run = gp.train(model, small_graph, "local", stages=2, chunks=4, epochs=2, progress=False)
    memory = run.memory()
    assert memory["rank"].tolist() == [0] and int(memory["peak_bytes"][0]) > 0
    run.save(tmp_path)
    replay = ReplaySource(tmp_path).final()
    pd.testing.assert_frame_equal(replay.memory, memory)
    text = memory_table(memory)
    assert "| 0 |" in text and "MiB" in text
    assert int(memory["heap_trims"][0]) == 0 and "trimmed" not in text  # no memory limit
    trimmed = memory_table(memory.assign(heap_trims=[7]))
    assert "ranks trimmed their heaps (rank 0 7×)" in trimmed


def test_memory_table_without_reports_says_so():
    assert memory_table(pd.DataFrame(columns=list(MEMORY_COLUMNS))).startswith("Peak memory: none")


@pytest.mark.parametrize("mode, layout, ranks", [
    ("pipeline", {"stages": 2, "chunks": 4}, 2),
    ("graph", {"parts": 3}, 3),
    ("hybrid", {"stages": 2, "ways": 2, "chunks": 4}, 4),
])
def test_every_rank_reports_its_peak(cluster, small_graph, mode, layout, ranks):
    model = gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=4)
    run = gp.train(model, small_graph, mode, epochs=2, cluster=cluster, progress=False, **layout)
    memory = run.memory()
    assert memory["rank"].tolist() == list(range(ranks))
    assert (memory["peak_bytes"] > 0).all() and (memory["baseline_bytes"] > 0).all()
    assert int(run.summary()["peak_bytes"][0]) == int(memory["peak_bytes"].max())


def _saved_bytes(model, data, mode, **layout) -> int:
    """Bytes autograd keeps for the backward over one epoch (every saved tensor, once each)."""
    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        gp.train(model, data, mode, epochs=1, eval_every=5, progress=False, **layout)
    return total[0]


@pytest.mark.parametrize("mode, layout", [("single", {}), ("local", {"stages": 2, "chunks": 4})])
def test_dropout_keeps_no_mask_for_the_backward(small_graph, mode, layout):
    """The keyed dropout draws its mask again in the backward: a model with dropout keeps what
    the same model without it keeps."""
    saved = {}
    for p in (0.0, 0.5):
        model = gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=4,
                                dropout=p)
        saved[p] = _saved_bytes(model, small_graph, mode, **layout)
    assert saved[0.5] == saved[0.0] > 0
