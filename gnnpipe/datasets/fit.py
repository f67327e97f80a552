"""A graph made ready for a model: where every graph enters ``gp.train`` and ``gp.plan``."""

from __future__ import annotations

import copy
import logging
from typing import Any, Protocol

import torch

from gnnpipe.datasets import prepare_data, validate

__all__ = ["ModelShape", "check_fits", "float32_features", "model_graph"]

logger = logging.getLogger(__name__)


class ModelShape(Protocol):
    """What a graph must fit: the model's input width and its last block's output width."""

    @property
    def in_dim(self) -> int: ...

    @property
    def out_dim(self) -> int: ...


def float32_features(data: Any) -> Any:
    """``data`` itself when ``data.x`` is float32, else a shallow copy with float32 features (a
    logged warning): the models compute in float32, so float64 or float16 features are converted,
    never refused; the caller's ``data`` stays as it was."""
    if data.x.dtype == torch.float32:
        return data
    logger.warning("data.x: converting %s features to torch.float32", data.x.dtype)
    converted = copy.copy(data)
    converted.x = data.x.to(torch.float32)
    return converted


def check_fits(model: ModelShape, data: Any) -> None:
    """The graph is well formed (:func:`gnnpipe.datasets.validate`) and fits the model: feature
    width and every label below the model's output width."""
    validate(data)
    if data.x.size(1) != model.in_dim:
        raise ValueError(f"model: its input width {model.in_dim} does not match "
                         f"data.x's {data.x.size(1)} features")
    out_dim, top = model.out_dim, int(data.y.max())
    if top >= out_dim:
        raise ValueError(f"data.y: labels go up to {top}, but the model's output width (out_dim) "
                         f"is {out_dim}; build the model with out_dim >= {top + 1}")


def model_graph(model: ModelShape, data: Any, split: Any = None, seed: Any = 0) -> Any:
    """``data`` made ready (:func:`gnnpipe.datasets.prepare_data`: a Dataset's graph, flat
    labels, masks from ``split``), checked against the model (:func:`check_fits`), with float32
    features (:func:`float32_features`). The caller's ``data`` is never modified."""
    data = prepare_data(data, split, seed)
    check_fits(model, data)
    return float32_features(data)
