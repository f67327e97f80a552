"""Exact full-graph training and evaluation: the reference every other mode is checked against."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data

from gnnpipe import checkpoint as ckpt
from gnnpipe.engine import state as engine_state
from gnnpipe.engine.graph import Adjacency, SpMM
from gnnpipe.engine.message_passing import full_message_passing
from gnnpipe.nn import LayerStack

__all__ = [
    "LAYER_RNG_KEY",
    "FullGraphContext",
    "SingleProgram",
    "chunk_loss",
    "evaluate",
    "evaluates",
    "keyed_dropout",
    "mask_seed",
    "metrics",
    "train_epoch",
]


def mask_seed(seed: int, epoch: int, chunk: int, key: int) -> int:
    """A 63-bit generator seed for the dropout mask keyed by (seed, epoch, chunk, layer key)."""
    state = np.random.SeedSequence([seed, epoch, chunk, key]).generate_state(2, np.uint32)
    return int(state[0]) << 31 ^ int(state[1])


#: Added to a layer's key for the seed of the layer's own randomness (``message_passing``), so it
#: differs from the seed of the dropout masks the same key draws between layers.
LAYER_RNG_KEY = 1 << 29


def _dropout_scale(like: Tensor, p: float, seed: int) -> Tensor:
    """0 or ``1/(1-p)`` per entry of ``like``'s shape, drawn from ``seed`` alone."""
    gen = torch.Generator(device=like.device).manual_seed(seed)
    scale = torch.rand(like.shape, generator=gen, device=like.device, dtype=like.dtype)
    return scale.ge_(p).div_(1.0 - p)


class _KeyedDropout(torch.autograd.Function):
    """``h * scale(seed)`` that keeps only the seed for its backward, which draws the same
    scale again: a stashed chunk holds no mask (one ``rows × width`` float tensor per dropout
    otherwise, a third of what a GCNII layer keeps for its backward)."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, p: float, seed: int) -> Tensor:
        ctx.p, ctx.seed = p, seed
        return h * _dropout_scale(h, p, seed)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return grad * _dropout_scale(grad, ctx.p, ctx.seed), None, None


def keyed_dropout(h: Tensor, p: float, seed: int) -> Tensor:
    """Inverted dropout whose mask depends only on ``seed`` (and ``h``'s shape); the mask is
    drawn again in the backward rather than kept."""
    out = _KeyedDropout.apply(h, p, seed)
    assert isinstance(out, Tensor)
    return out


class FullGraphContext:
    """Block context that aggregates over the whole graph with ``Â @ h``."""

    def __init__(self, adj: Adjacency, seed: int = 0, epoch: int = 0, training: bool = False,
                 chunk: int = 0) -> None:
        self.adj, self.seed, self.epoch, self.training, self.chunk = adj, seed, epoch, training, chunk

    def aggregate(self, h: Tensor, key: int) -> Tensor:
        return SpMM.apply(h, self.adj)

    def message_passing(self, module: torch.nn.Module, h: Tensor, key: int) -> Tensor:
        """PyG ``module(h, edge_index)`` on the whole graph."""
        return full_message_passing(module, h, self.adj.edge_index, lambda: mask_seed(
            self.seed, self.epoch, self.chunk, key + LAYER_RNG_KEY))

    def dropout(self, h: Tensor, p: float, key: int) -> Tensor:
        if not self.training or p == 0.0:
            return h
        return keyed_dropout(h, p, mask_seed(self.seed, self.epoch, self.chunk, key))


def chunk_loss(logits: Tensor, y: Tensor, train_mask: Tensor, num_train: int) -> Tensor:
    """Cross-entropy summed over the training rows given, divided by *all* training nodes,
    so chunk losses add up to the full-graph loss."""
    return F.cross_entropy(logits[train_mask], y[train_mask], reduction="sum") / num_train


class SingleProgram:
    """Exact full-graph training as an :class:`~gnnpipe.engine.driver.EpochProgram`.

    Args:
        model, data, adj: the stack (trained in place), the graph and its normalised adjacency.
        optimizer: Adam over all of ``model``.
        seed: keys dropout masks.
        layout: where its checkpoint shard comes from (:func:`gnnpipe.checkpoint.layout`).
    """

    def __init__(self, model: LayerStack, data: Data, adj: Adjacency,
                 optimizer: torch.optim.Optimizer, seed: int,
                 layout: dict[str, Any] | None = None) -> None:
        self.model, self.data, self.adj, self.optimizer, self.seed = model, data, adj, optimizer, seed
        self.layout = layout or {}
        self.num_train = int(data.train_mask.sum())

    def begin_epoch(self, epoch: int) -> None:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)

    def run_chunks(self, epoch: int) -> float:
        logits = self.model(self.data.x, FullGraphContext(self.adj, self.seed, epoch, training=True))
        loss = chunk_loss(logits, self.data.y, self.data.train_mask, self.num_train)
        loss.backward()
        return float(loss.detach())

    def step(self, epoch: int) -> None:
        self.optimizer.step()

    def evaluate(self) -> dict[str, float]:
        return evaluate(self.model, self.data, self.adj)

    def checkpoint_state(self) -> dict[str, Any]:
        return ckpt.shard(self.layout, engine_state.model_shard(self.model, 0, len(self.model)),
                          engine_state.optimizer_shard(self.optimizer, self.model))

    def restore(self, shards: list[dict[str, Any]]) -> None:
        """Continue from a checkpoint's model and Adam state (of any mode's layout)."""
        engine_state.restore_model(self.model, shards)
        engine_state.restore_optimizer(self.optimizer, self.model, shards)


def train_epoch(model: LayerStack, data: Data, adj: Adjacency, optimizer: torch.optim.Optimizer,
                seed: int, epoch: int) -> float:
    """One exact full-graph epoch; returns the training loss."""
    program = SingleProgram(model, data, adj, optimizer, seed)
    program.begin_epoch(epoch)
    loss = program.run_chunks(epoch)
    program.step(epoch)
    return loss


def evaluates(epoch: int, epochs: int, every: int) -> bool:
    """Whether epoch ``epoch`` (of ``epochs``) ends with an evaluation: every ``every``-th epoch
    (counting from 1) and the last one."""
    return (epoch + 1) % every == 0 or epoch == epochs - 1


@torch.no_grad()
def evaluate(model: LayerStack, data: Data, adj: Adjacency) -> dict[str, float]:
    """Exact full-graph inference with the current weights: accuracies and losses per split."""
    model.eval()
    return metrics(model(data.x, FullGraphContext(adj, training=False)), data)


def metrics(logits: Tensor, data: Data) -> dict[str, float]:
    """Accuracy per split and validation loss of full-graph ``logits``."""
    pred = logits.argmax(dim=1)
    out: dict[str, float] = {}
    for split in ("train", "val", "test"):
        mask = getattr(data, f"{split}_mask")
        out[f"{split}_acc"] = float((pred[mask] == data.y[mask]).float().mean()) if mask.any() else 0.0
    out["val_loss"] = float(F.cross_entropy(logits[data.val_mask], data.y[data.val_mask]))
    return out
