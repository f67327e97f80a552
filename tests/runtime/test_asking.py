"""Calls on workers before a run's ranks exist give up on a stopped worker, naming it."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from gnnpipe.runtime.asking import (
    PING_S,
    WorkerLeft,
    WorkerSilent,
    ask,
    result_within,
    scatter_within,
)


def test_a_stopped_worker_is_named_by_a_bounded_call_and_answers_once_resumed(cluster):
    workers = cluster.workers()
    victim = workers[1]
    pid = cluster.client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(WorkerSilent, match=rf"worker {victim} did not answer within 2 s "
                                               r"when asked for its pid") as info:
            ask(cluster.client, os.getpid, workers, timeout=2, what="its pid")
        assert info.value.workers == [victim]  # the others answered the ping
        with pytest.raises(WorkerSilent, match=rf"worker {victim} did not answer within 2 s "
                                               r"when asked for a task's result"):
            result_within(cluster.client, cluster.client.submit(os.getpid, workers=[victim],
                                                                pure=False),
                          victim, 2, "a task's result")
        assert time.monotonic() - started < 2 * (2 + PING_S) + 20  # bounded, not forever
    finally:
        os.kill(pid, signal.SIGCONT)
    assert ask(cluster.client, os.getpid, workers, timeout=60, what="its pid")[victim] == pid


def test_a_worker_that_dies_fails_a_bounded_call_at_once_naming_it_and_why(cluster):
    """A worker killed (as the kernel's OOM killer or a crash ends one) before a call reaches
    it: the call fails within moments naming it and the scheduler's reason, not after its bound
    (Dask waits for a dead worker's address) nor with a bare CommClosedError or KeyError."""
    workers = cluster.workers()
    victim = workers[1]
    pid = cluster.client.run(os.getpid, workers=[victim])[victim]
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    died = rf"worker {victim} left the cluster when asked for {{}}: its worker process died"
    with pytest.raises(WorkerLeft, match=died.format("its pid")) as info:
        ask(cluster.client, os.getpid, workers, timeout=120, what="its pid")
    assert info.value.workers == [victim]
    with pytest.raises(WorkerLeft, match=died.format("a tensor")):
        scatter_within(cluster.client, torch.ones(1000), workers, 4000, 120, "a tensor")
    with pytest.raises(WorkerLeft, match=died.format("a task's result")):
        result_within(cluster.client, cluster.client.submit(os.getpid, workers=[victim],
                                                            pure=False),
                      victim, 120, "a task's result")
    assert time.monotonic() - started < 60  # the worker's absence, not the 120 s bounds
    assert len(cluster.ready(len(workers))) == len(workers)  # its nanny brought it back
