"""Profiling workers keep the host busy until every one has timed its epochs."""

from __future__ import annotations

from distributed import Event

from gnnpipe.plan.bench import MAX_WARMUP, medians
from gnnpipe.runtime.together import Together, together


def _piece(mate: Together) -> int:
    """Epochs a piece runs after its timed ones (the calls until it may stop)."""
    calls = 1
    while not mate():
        calls += 1
    return calls


def test_a_worker_done_first_keeps_busy_until_the_other_is_done(cluster):
    client = cluster.client
    first, second = together(["w0", "w1"])
    lingering = client.submit(_piece, first, pure=False)
    assert Event(first.names[0], client=client).wait(timeout=120)  # the first is done timing
    assert not lingering.done()  # and cannot return before the second is
    assert client.submit(_piece, second, pure=False).result() == 1  # the first is already done
    assert lingering.result() >= 1  # returns now (its first call may have seen it)
    first.forget(client)
    assert not Event(first.names[0], client=client).is_set()


def test_only_a_workers_last_piece_to_finish_lingers_whatever_the_order(cluster):
    """Dask may run a worker's pieces in any order: the one it runs first must not wait for
    the others (they would wait behind it), the last one keeps the worker busy."""
    client = cluster.client
    mates = together(["w0", "w0", "w1", "w1"])
    assert [m.mates for m in mates] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert len(set(mates[0].names)) == 4 and mates[0].names == mates[3].names
    assert client.submit(_piece, mates[1], pure=False).result() == 1  # piece 0 still to run
    lingering = client.submit(_piece, mates[0], pure=False)
    assert Event(mates[0].names[0], client=client).wait(timeout=120)
    assert not lingering.done()  # pieces 2 and 3 have not run
    mates[0].release(client)  # what the client does when profiling fails
    assert lingering.result() >= 1  # returns now (its first call may have seen it)


class _Counting:
    """An epoch program whose one block "took" its epoch's index in seconds."""

    def __init__(self) -> None:
        self.executors = [None]
        self.epoch = -1
        self.took: dict[str, list[float]] = {}

    def begin_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.took = {"forward": [float(epoch)]}

    def run_chunks(self, epoch: int) -> None:
        return None

    def step(self, epoch: int) -> None:
        pass

    def evaluate(self) -> dict[str, float]:
        return {}


def test_medians_are_of_the_timed_epochs_however_long_the_bench_lingers():
    bench = _Counting()
    calls: list[int] = []

    def until() -> bool:
        calls.append(bench.epoch)
        return len(calls) == 3

    took = medians(bench, warmup=MAX_WARMUP, repeats=2, until=until)  # type: ignore[arg-type]
    timed = [MAX_WARMUP, MAX_WARMUP + 1]
    assert took == {"forward": [sum(timed) / 2]}  # not the lingering epochs'
    assert calls == [timed[-1], timed[-1] + 1, timed[-1] + 2]  # two more epochs, untimed
    assert medians(_Counting(), MAX_WARMUP, 2) == took  # and without lingering, stops at once  # type: ignore[arg-type]
