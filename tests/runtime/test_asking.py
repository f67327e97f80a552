"""Calls on workers before a run's ranks exist give up on a stopped worker, naming it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from gnnpipe.runtime.asking import PING_S, WorkerSilent, ask, result_within


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
