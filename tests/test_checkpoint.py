"""Checkpoints: a run that fails after epoch 15 of 30, resumed from its epoch-10 checkpoint, ends
exactly like the run never interrupted, in every mode; other layouts reshard; bad arguments and
incomplete checkpoints are refused before anything runs."""

from __future__ import annotations

import copy
import logging
import sys

import cloudpickle
import pandas as pd
import pytest
import torch

import gnnpipe as gp
from gnnpipe import checkpoint as ckpt
from gnnpipe.core.kinds import Mode
from gnnpipe.models import Block
from gnnpipe.runtime.launch import RankFailure

DISTRIBUTED = tuple(m.value for m in Mode if m.distributed)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/

EPOCHS, EVERY, FAIL_AT = 30, 10, 15
METRICS = ["epoch", "loss", "train_acc", "val_acc", "test_acc", "val_loss"]
LAYOUTS = {"single": {}, "local": {"stages": 2, "chunks": 4},
           "pipeline": {"stages": 2, "chunks": 4}, "graph": {"parts": 2},
           "hybrid": {"stages": 2, "ways": 2, "chunks": 4}}


class FailingBlock(Block):
    """Passes ``h`` through; raises in the training forward of epoch ``epoch`` (None: never)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.in_dim = self.out_dim = width
        self.epoch: int | None = None

    def forward(self, h, h0, ctx):
        if ctx.training and getattr(ctx, "epoch", None) == self.epoch:
            raise FloatingPointError(f"injected failure at epoch {self.epoch}")
        return h, h0


def _model(graph):
    model = gp.models.gcn(graph.num_features, hidden=8, out_dim=4, layers=3, dropout=0.3)
    model.blocks.append(FailingBlock(4))
    model.blocks[-1].key = len(model.blocks) - 1
    return model


def _train(model, graph, mode, request, **kwargs):
    if mode in DISTRIBUTED:
        kwargs.setdefault("cluster", request.getfixturevalue("cluster"))
    return gp.train(model, graph, mode, epochs=EPOCHS, progress=False, **LAYOUTS[mode], **kwargs)


def _interrupted(initial, graph, mode, request, folder) -> None:
    """A run from ``initial``'s weights, checkpointing every 10 epochs, that fails in epoch 15."""
    failing = copy.deepcopy(initial)
    failing.blocks[-1].epoch = FAIL_AT
    with pytest.raises((RankFailure, FloatingPointError), match="injected failure at epoch 15"):
        _train(failing, graph, mode, request, checkpoint=folder, checkpoint_every=EVERY)
    assert ckpt.latest(folder).epoch == EVERY


@pytest.mark.parametrize("mode", list(LAYOUTS))
def test_resumed_run_equals_the_uninterrupted_one(small_graph, mode, request, tmp_path):
    torch.manual_seed(1)
    initial = _model(small_graph)
    full_model, resumed_model = copy.deepcopy(initial), copy.deepcopy(initial)
    full = _train(full_model, small_graph, mode, request)
    _interrupted(initial, small_graph, mode, request, tmp_path)
    resumed = _train(resumed_model, small_graph, mode, request, resume=tmp_path,
                     checkpoint=tmp_path)
    pd.testing.assert_frame_equal(resumed.history[METRICS], full.history[METRICS])
    for (name, a), b in zip(resumed_model.state_dict().items(), full_model.state_dict().values()):
        assert torch.equal(a, b), name
    assert resumed.events[["epoch", "event"]].values.tolist() == [[EVERY, "resume"]]
    assert ckpt.latest(tmp_path).epoch == EPOCHS  # the last epoch is checkpointed too


def test_a_checkpoint_holds_plain_data_and_lists_its_shards(small_graph, cluster, tmp_path):
    gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4, epochs=4,
             checkpoint=tmp_path, checkpoint_every=2, cluster=cluster, progress=False,
             techniques=True)
    manifest = ckpt.latest(tmp_path)
    assert manifest.epoch == 4 and manifest.world == 2
    assert [p.name for p in sorted(ckpt.epoch_dir(tmp_path, 2).iterdir())] == [
        "manifest.json", "rank-0000.pt", "rank-0001.pt"]
    first, second = manifest.shards()  # torch.load(weights_only=True)
    assert all(k.startswith(("blocks.0.", "blocks.1.", "blocks.2.")) for k in first["model"])
    assert set(first["optimizer"]) == set(first["model"])  # Adam state by parameter name
    assert set(first["buffers"]) | set(second["buffers"]) == {"0", "1", "2"}  # the GCN layers
    assert set(first["buffers"]["0"]) == {"H", "snap"}  # dZbuf lives in Hbuf (all techniques on)
    assert sorted({r["epoch"] for r in manifest.records}) == [0, 1, 2, 3]


def test_local_resumes_a_pipeline_checkpoint_with_its_buffers(small_graph, request, tmp_path,
                                                              caplog):
    initial = _model(small_graph)
    full = gp.train(copy.deepcopy(initial), small_graph, "local", stages=2, chunks=4,
                    epochs=EPOCHS, progress=False)
    _interrupted(initial, small_graph, "pipeline", request, tmp_path)
    with caplog.at_level(logging.WARNING, logger="gnnpipe.checkpoint"):
        resumed = gp.train(copy.deepcopy(initial), small_graph, "local", stages=3, chunks=4,
                           epochs=EPOCHS, resume=tmp_path, progress=False)
    assert "start from zeros" not in caplog.text  # same chunking: every buffer carries over
    a, b = resumed.history["loss"].to_numpy(), full.history["loss"].to_numpy()
    assert abs(a - b).max() / abs(b).max() < 1e-5


def test_buffers_that_do_not_carry_over_start_from_zeros_with_a_warning(small_graph, tmp_path,
                                                                        caplog):
    model = _model(small_graph)
    gp.train(model, small_graph, "single", epochs=4, checkpoint=tmp_path, progress=False)
    with caplog.at_level(logging.WARNING, logger="gnnpipe.checkpoint"):
        run = gp.train(copy.deepcopy(model), small_graph, "local", chunks=4, epochs=6,
                       resume=tmp_path, progress=False)
    assert "historical buffers of blocks [0, 1, 2] start from zeros like epoch 0" in caplog.text
    assert run.history["epoch"].tolist() == list(range(6))


def test_a_checkpoint_without_its_manifest_does_not_load(small_graph, tmp_path):
    gp.train(_model(small_graph), small_graph, "local", chunks=4, epochs=4, checkpoint=tmp_path,
             checkpoint_every=2, progress=False)
    (ckpt.epoch_dir(tmp_path, 4) / "manifest.json").unlink()  # a crash before the manifest
    assert ckpt.latest(tmp_path).epoch == 2
    with open(ckpt.epoch_dir(tmp_path, 2) / "rank-0000.pt", "ab") as f:
        f.write(b"torn")  # a shard changed after its manifest: not the checkpoint it lists
    assert ckpt.latest(tmp_path) is None


@pytest.mark.parametrize("kwargs, error, match", [
    ({"checkpoint": 42}, TypeError, "checkpoint: expected a folder path"),
    ({"checkpoint": ""}, ValueError, "checkpoint: expected a folder path"),
    ({"checkpoint": "ck", "checkpoint_every": 0}, ValueError, "checkpoint_every: expected a pos"),
    ({"restarts": -1}, ValueError, "restarts: expected an integer >= 0"),
    ({"restarts": 1.5}, ValueError, "restarts: expected an integer >= 0"),
    ({"restarts": 1}, ValueError, "restarts: only distributed modes restart ranks"),
    ({"mode": "pipeline", "stages": 2, "restarts": 1}, ValueError, "give checkpoint=FOLDER"),
    ({"resume": "empty"}, ValueError, "resume: no complete checkpoint in"),
    ({"resume": 3.0}, TypeError, "resume: expected a folder path"),
])
def test_bad_checkpoint_arguments_are_refused(small_graph, tmp_path, monkeypatch, kwargs, error,
                                              match):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    kwargs = {"mode": "local", **kwargs}
    with pytest.raises(error, match=match):
        gp.train(_model(small_graph), small_graph, epochs=2, progress=False, **kwargs)
    assert not (tmp_path / "ck").exists()


def test_resume_checks_the_model_the_epochs_and_the_folder(small_graph, tmp_path):
    model = _model(small_graph)
    gp.train(model, small_graph, "local", chunks=4, epochs=4, checkpoint=tmp_path, progress=False)
    other = gp.models.gcn(small_graph.num_features, hidden=16, out_dim=4, layers=3)
    with pytest.raises(ValueError, match="resume: the checkpoint in .* is of another model"):
        gp.train(other, small_graph, "local", epochs=8, resume=tmp_path, progress=False)
    with pytest.raises(ValueError, match="epochs: the checkpoint in .* has 4 epochs done"):
        gp.train(model, small_graph, "local", epochs=4, resume=tmp_path, progress=False)
    with pytest.raises(ValueError, match="checkpoint: .* already holds checkpoints of another"):
        gp.train(model, small_graph, "local", epochs=4, checkpoint=tmp_path, progress=False)
