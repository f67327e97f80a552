"""A block that raises at a chosen epoch, for tests of failing and recovering runs (imported by
test modules anywhere under tests/; pickled by value, since Dask workers cannot import it)."""

from __future__ import annotations

import sys

import cloudpickle

from gnnpipe.models import Block, LayerStack

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class FailingBlock(Block):
    """Passes ``h`` through, but raises in the training forward of epoch ``epoch``."""

    def __init__(self, width: int, epoch: int) -> None:
        super().__init__()
        self.in_dim = self.out_dim = width
        self.epoch = epoch

    def forward(self, h, h0, ctx):
        if ctx.training and getattr(ctx, "epoch", None) == self.epoch:
            raise FloatingPointError(f"injected failure at epoch {self.epoch}")
        return h, h0


def fail_at(model: LayerStack, epoch: int) -> LayerStack:
    """``model`` with a :class:`FailingBlock` appended (its output width), raising at ``epoch``."""
    return _append(model, FailingBlock(model.blocks[-1].out_dim, epoch))


def _append(model: LayerStack, block: Block) -> LayerStack:
    """``model`` with ``block`` as its last block (keyed by its place)."""
    model.blocks.append(block)
    block.key = len(model.blocks) - 1
    return model


class SubnormalCheck(Block):
    """Passes ``h`` through, but a training forward raises where this thread's arithmetic keeps
    subnormal floats (gnnpipe's epochs flush them: :func:`gnnpipe.engine.driver.flushed_denormals`;
    an eval-mode call, like the byte counters' probe outside any epoch, does not check)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.in_dim = self.out_dim = width

    def forward(self, h, h0, ctx):
        if self.training and (h.new_tensor(1e-39) * 1.0).item() != 0.0:
            raise FloatingPointError("subnormal floats are not flushed in this epoch")
        return h, h0


def check_subnormals(model: LayerStack) -> LayerStack:
    """``model`` with a :class:`SubnormalCheck` appended (its output width)."""
    return _append(model, SubnormalCheck(model.blocks[-1].out_dim))


class KillingBlock(Block):
    """Passes ``h`` through, but its first forward in a Dask worker kills that worker's process
    (as the kernel's OOM killer would); in any other process it only passes ``h`` through."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.in_dim = self.out_dim = width

    def forward(self, h, h0, ctx):
        import os
        import signal

        from distributed import get_worker

        try:
            get_worker()
        except ValueError:
            return h, h0
        os.kill(os.getpid(), signal.SIGKILL)


def kill_worker(model: LayerStack) -> LayerStack:
    """``model`` with a :class:`KillingBlock` appended (its output width)."""
    return _append(model, KillingBlock(model.blocks[-1].out_dim))
