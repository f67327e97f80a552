"""An engine's state as checkpoint shards hold it, and back: model slices and Adam state by
parameter name, the historical buffers are the stage executor's own
(:meth:`~gnnpipe.engine.chunked.StageExecutor.buffer_state`); :mod:`gnnpipe.checkpoint` writes
and reads the files."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Protocol

import torch
from torch import Tensor

from gnnpipe.nn import LayerStack

__all__ = ["model_shard", "optimizer_shard", "param_shapes", "restore_model", "restore_optimizer"]

def param_shapes(model: LayerStack) -> dict[str, list[int]]:
    return {k: list(v.shape) for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------- shard contents
def model_shard(model: LayerStack, start: int, stop: int) -> dict[str, Tensor]:
    """The state of blocks ``start:stop`` (parameter names as in the whole stack)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()
            if start <= int(k.split(".")[1]) < stop}


class OptimizerState(Protocol):
    """What these functions read and write of an optimizer: a ``torch.optim.Optimizer``, or a
    stand-in for a stage without parameters (the runtime's)."""

    @property
    def state(self) -> MutableMapping[Tensor, Any]: ...

    @property
    def param_groups(self) -> list[dict[str, Any]]: ...


def optimizer_shard(optimizer: OptimizerState, model: LayerStack) -> dict[str, Any]:
    """Adam's state of each parameter ``optimizer`` updates, by parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    return {names[id(p)]: {k: v.detach().cpu().clone() if isinstance(v, Tensor) else v
                           for k, v in state.items()}
            for p, state in optimizer.state.items()}


def restore_model(model: LayerStack, shards: list[dict[str, Any]], start: int = 0,
                  stop: int | None = None) -> None:
    """Load blocks ``start:stop`` of ``model`` from whichever shards hold them."""
    stop = len(model) if stop is None else stop
    merged = {k: v for s in shards for k, v in s["model"].items()
              if start <= int(k.split(".")[1]) < stop}
    wanted = set(model_shard(model, start, stop))
    if set(merged) != wanted:
        raise ValueError(f"resume: the checkpoint lacks parameters {sorted(wanted - set(merged))}")
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if name in merged:
                value.copy_(merged[name])


def restore_optimizer(optimizer: OptimizerState, model: LayerStack,
                      shards: list[dict[str, Any]]) -> None:
    """Give each parameter ``optimizer`` updates its Adam state from the checkpoint (by name)."""
    merged = {k: v for s in shards for k, v in s["optimizer"].items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = merged.get(names[id(p)])
            if state is not None:  # a parameter never stepped has no state yet
                optimizer.state[p] = {k: v.clone() if k == "step" else v.to(p.device).clone()
                                      for k, v in state.items()}
