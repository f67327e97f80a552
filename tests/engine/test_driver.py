"""The epoch driver: subnormal floats flushed while it runs, the thread's setting kept after."""

from __future__ import annotations

import pytest
import torch

from gnnpipe.engine.driver import DENORMALS_VAR, denormals_flushed, drive


class _Probe:
    """An epoch program that records, per epoch, whether a subnormal survives arithmetic."""

    def __init__(self) -> None:
        self.kept: list[bool] = []

    def begin_epoch(self, epoch: int) -> None:
        pass

    def run_chunks(self, epoch: int) -> float:
        self.kept.append(bool((torch.tensor(1e-39) * 1.0).item() != 0.0))
        return 0.0

    def step(self, epoch: int) -> None:
        pass

    def evaluate(self) -> dict[str, float]:
        return {}


def test_epochs_flush_subnormals_and_the_setting_is_restored_after():
    assert not denormals_flushed()  # torch's default: IEEE subnormals
    probe = _Probe()
    records = drive(probe, 3)
    assert [r["epoch"] for r in records] == [0, 1, 2]
    assert probe.kept == [False, False, False]
    assert not denormals_flushed()
    torch.set_flush_denormal(True)
    try:
        drive(_Probe(), 1)
        assert denormals_flushed()  # a caller's own flushing stays
    finally:
        torch.set_flush_denormal(False)


def test_keep_leaves_subnormals_to_ieee_arithmetic(monkeypatch):
    monkeypatch.setenv(DENORMALS_VAR, "keep")
    probe = _Probe()
    drive(probe, 2)
    assert probe.kept == [True, True]


def test_a_failing_epoch_still_restores_the_setting():
    class Failing(_Probe):
        def step(self, epoch: int) -> None:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        drive(Failing(), 2)
    assert not denormals_flushed()


def test_the_probe_holds_under_a_float64_default():
    """1e-39 is a normal float64: the probe multiplies it as float32 whatever the default."""
    torch.set_default_dtype(torch.float64)
    try:
        torch.set_flush_denormal(True)
        assert denormals_flushed()
    finally:
        torch.set_flush_denormal(False)
        torch.set_default_dtype(torch.float32)
    assert not denormals_flushed()
