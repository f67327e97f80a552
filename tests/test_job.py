"""The job record: gp.train's arguments parsed once into a TrainConfig that every layer reads,
saved with its version, and the package's public surface."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

import pytest

import dashboard
import gnnpipe as gp
from gnnpipe import checkpoint as ckpt
from gnnpipe.core.job import CONFIG_VERSION, LEGACY_PARTS_PER_CHUNK, Launch, TrainConfig
from gnnpipe.core.kinds import Mode, OpKind

ROOT = Path(__file__).resolve().parents[1]


def _model(graph):
    return gp.models.gcn(graph.num_features, hidden=8, out_dim=4, layers=3)


def test_train_parses_its_arguments_into_one_frozen_record(small_graph):
    model = _model(small_graph)
    run = gp.train(model, small_graph, "local", stages=2, epochs=2, lr=1,
                   techniques={"snapshot": False}, progress=False)
    job = run.config
    assert isinstance(job, TrainConfig) and job.mode is Mode.LOCAL
    # 3 GNN layers on 2 stages: the layer left over goes to the later stage
    assert job.chunks == 8 and job.stages == 2 and job.ranges == ((0, 1), (1, len(model)))
    assert job.lr == 1.0 and isinstance(job.lr, float)
    assert job.techniques == gp.Techniques(snapshot=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.chunks = 4  # type: ignore[misc]


def test_a_mode_member_and_its_string_train_alike(small_graph):
    by_name = gp.train(_model(small_graph), small_graph, "single", epochs=2, progress=False)
    by_member = gp.train(_model(small_graph), small_graph, gp.Mode.SINGLE, epochs=2,
                         progress=False)
    assert by_name.config == by_member.config
    assert by_name.config.chunks == 1 and by_name.config.world == 1
    with pytest.raises(ValueError, match=r"mode: unknown mode 'pipe'; expected one of "
                                         r"\('single', 'local', 'pipeline', 'graph', 'hybrid'\)"):
        gp.train(_model(small_graph), small_graph, "pipe", epochs=2, progress=False)


def test_the_record_round_trips_through_its_dict_and_a_saved_run(small_graph, tmp_path):
    run = gp.train(_model(small_graph), small_graph, "local", chunks=4, epochs=2,
                   progress=False)
    raw = run.config.to_dict()
    assert raw["version"] == CONFIG_VERSION and raw["mode"] == "local"
    assert TrainConfig.from_dict(json.loads(json.dumps(raw))) == run.config
    saved = json.loads((run.save(tmp_path / "run") / "config.json").read_text())
    assert TrainConfig.from_dict(saved) == run.config and Launch.from_dict(saved) is None


def test_a_config_saved_before_the_version_reads_with_the_legacy_chunking():
    old = {"mode": "pipeline", "model": "gcn", "layers": 3, "epochs": 5, "lr": 0.01,
           "weight_decay": 5e-4, "seed": 0, "stages": 2, "chunks": 8, "dataset": "cora",
           "techniques": {"snapshot": False}, "ranges": [[0, 2], [2, 5]],
           "run_id": "gnnpipe-1", "predicted_comm_bytes": 99}
    job = TrainConfig.from_dict(old)
    assert job.mode is Mode.PIPELINE and job.parts_per_chunk == LEGACY_PARTS_PER_CHUNK
    assert job.ranges == ((0, 2), (2, 5)) and not job.techniques.snapshot and job.world == 2
    assert Launch.from_dict(old) == Launch("gnnpipe-1", 99)
    launch = Launch("gnnpipe-2", 7, plan_memory_limit=80_000_000)
    assert Launch.from_dict({**old, **json.loads(json.dumps(launch.to_dict()))}) == launch


def test_a_checkpoint_manifest_holds_the_same_record(small_graph, tmp_path):
    run = gp.train(_model(small_graph), small_graph, "local", chunks=4, epochs=3,
                   checkpoint=tmp_path / "ck", checkpoint_every=2, progress=False)
    manifest = ckpt.latest(tmp_path / "ck")
    assert manifest is not None and manifest.config == run.config
    assert run.config.checkpoint == str(tmp_path / "ck") and run.config.checkpoint_every == 2


def test_str_enums_read_as_their_strings():
    assert Mode.HYBRID == "hybrid" and f"{Mode.HYBRID}" == "hybrid" and str(OpKind.SEND) == "send"
    assert repr(("backward", 1)) == repr((OpKind.BACKWARD, 1))
    assert json.dumps({"m": Mode.GRAPH}) == '{"m": "graph"}'
    assert [m.value for m in Mode if m.distributed] == ["pipeline", "graph", "hybrid"]


def test_dir_lists_the_public_api_only():
    names = dir(gp)
    assert names == sorted(gp.__all__)
    assert {"train", "plan", "Run", "RunHandle", "TrainConfig", "Mode"} <= set(names)
    assert not {"Any", "importlib", "sys", "types"} & set(names)
    assert dir(dashboard) == ["Compare", "Dashboard"]
    assert dashboard.Compare.__name__ == "Compare"


def test_every_module_declares_all():
    missing = []
    for path in sorted([*(ROOT / "gnnpipe").rglob("*.py"), *(ROOT / "dashboard").rglob("*.py")]):
        tree = ast.parse(path.read_text())
        declared = any(isinstance(node, (ast.Assign, ast.AnnAssign)) and "__all__" in
                       [getattr(t, "id", None) for t in
                        (node.targets if isinstance(node, ast.Assign) else [node.target])]
                       for node in tree.body)
        if not declared:
            missing.append(str(path.relative_to(ROOT)))
    assert missing == []


def test_every_mode_returns_a_run_handle(small_graph, cluster):
    here = gp.train(_model(small_graph), small_graph, "local", chunks=4, epochs=2, progress=False)
    there = gp.train(_model(small_graph), small_graph, "pipeline", stages=2, chunks=4, epochs=2,
                     cluster=cluster, progress=False)
    for run in (here, there):
        assert isinstance(run, gp.RunHandle) and run.done and run.wait() is run
        assert list(run.summary()["mode"]) == [run.config.mode.value]
    assert here.launch is None and there.launch is not None
    assert there.launch.run_id and there.launch.predicted_comm_bytes == there.history[
        "comm_bytes"].iloc[0]
    assert there.config.world == 2 and there.spec.job is there.config
