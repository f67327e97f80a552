"""One-process modes on a GPU against the CPU, same machine (run where a GPU is lent).

Trains a 32-layer GCNII (hidden 64) on a synthetic 100K-node graph (avg degree 10, 8 classes,
64 features, homophily 0.8) for 6 epochs in ``single`` and in ``local`` (2 stages, 8 chunks),
each with ``device="cuda"`` and ``device="cpu"``, and prints the median training epoch (epochs
2-5). The GPU tests themselves are ``make test-gpu`` (``tests/gpu``).

Run (from the repository root, on a machine with a GPU)::

    python benchmarks/gpu.py
"""

from __future__ import annotations

import torch

import gnnpipe as gp

MODES = (("single", {}), ("local", {"stages": 2, "chunks": 8}))


def main() -> None:
    data = gp.datasets.synthetic(num_nodes=100_000, avg_degree=10, num_classes=8,
                                 num_features=64, homophily=0.8, seed=0)
    for mode, kwargs in MODES:
        for device in ("cuda", "cpu"):
            torch.manual_seed(0)
            model = gp.models.gcnii(64, hidden=64, out_dim=8, layers=32)
            run = gp.train(model, data, mode, epochs=6, device=device, progress=False, **kwargs)
            epoch = run.history["epoch_time"].iloc[2:].median()
            print(f"{mode:6s} {device:4s} median train epoch {epoch:.4f} s  best {run.best}",
                  flush=True)


if __name__ == "__main__":
    main()
