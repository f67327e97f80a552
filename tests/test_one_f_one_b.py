"""``schedule="1f1b"``: each chunk's backward as soon as the last stage has its loss.

The training rule is every stage's op order (its Hbuf and dZbuf are its own), so ``pipeline``
must equal ``local``, whatever the stage count; it differs from fill-drain's (backwards run in
chunk order), keeps at most ``S - s`` chunks in flight on stage ``s`` and is refused where it
cannot run.
"""

from __future__ import annotations

import copy

import pytest
import torch

import gnnpipe as gp
from gnnpipe.analysis.memory import estimate
from gnnpipe.api import door
from gnnpipe.core.kinds import OpKind
from gnnpipe.runtime.pipeline import acknowledged
from gnnpipe.schedule import one_f_one_b


def _rel(a, b) -> float:
    a, b = torch.tensor(a.to_numpy()), torch.tensor(b.to_numpy())
    return float(((a - b).abs() / b.abs()).max())


@pytest.fixture(scope="module")
def gcnii(small_graph):
    torch.manual_seed(0)
    return gp.models.gcnii(small_graph.num_features, hidden=16, out_dim=4, layers=6, dropout=0.3)


def _local(model, data, **kwargs):
    return gp.train(copy.deepcopy(model), data, "local", epochs=6, progress=False, **kwargs)


def test_pipeline_equals_local_in_1f1b(cluster, small_graph, gcnii):
    kwargs = {"stages": 3, "chunks": 6, "schedule": "1f1b",
              "techniques": {"snapshot_period": 2}}
    local = _local(gcnii, small_graph, **kwargs)
    pipe = gp.train(copy.deepcopy(gcnii), small_graph, "pipeline", epochs=6, cluster=cluster,
                    progress=False, **kwargs)
    assert _rel(pipe.history["loss"], local.history["loss"]) < 1e-5
    assert pipe.history["val_acc"].tolist() == local.history["val_acc"].tolist()
    assert pipe.config.schedule.value == "1f1b"
    # every stage ran its ops in 1F1B's order: stage 1 of 3 warms up with two forwards
    tl = pipe.timeline.df
    ops = tl[(tl["rank"] == 1) & (tl["epoch"] == 1) & tl["kind"].isin(["forward", "backward"])]
    kinds = ops.sort_values("start")["kind"].tolist()
    assert kinds[:4] == ["forward", "forward", "backward", "forward"]
    assert kinds.count("forward") == kinds.count("backward") == 6
    predicted = gp.comm_volume(gcnii, small_graph, "pipeline", stages=3)
    assert (pipe.history["comm_bytes"] == predicted).all()
    # a stage lets go of what it sent once the peer has answered, not at the epoch's end: by
    # its last backward stage 1 has released every activation it sent on and the gradients of
    # the first three chunks (stage 0's forwards of chunks 3-5 answered them)
    last = ops[ops["kind"] == "backward"]["start"].max()
    sends = tl[(tl["rank"] == 1) & (tl["epoch"] == 1) & (tl["kind"] == "send") & (tl["chunk"] >= 0)]
    on, back = sends[sends["peer"] == 2], sends[sends["peer"] == 0]
    assert len(on) == len(back) == 6 * 2  # h and h0 each way, per chunk
    assert (on["end"] <= last).all()
    assert (back["end"] <= last).sum() == 3 * 2


def test_a_peer_answers_the_messages_it_has_read():
    schedule = one_f_one_b(3, 6)  # stage 0: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5
    forward, backward = OpKind.FORWARD, OpKind.BACKWARD
    assert acknowledged(schedule, 0, backward, forward) == {0: 0, 1: 0, 2: 0, 3: 1, 4: 2, 5: 3}
    # stage 2: F0 B0 F1 B1 ...: each gradient answers the activation of its own chunk
    assert acknowledged(schedule, 2, forward, backward) == {k: k + 1 for k in range(6)}
    # stage 1: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5
    assert acknowledged(schedule, 1, forward, backward) == {0: 2, 1: 3, 2: 4, 3: 5, 4: 6, 5: 6}


def test_1f1b_is_its_own_rule_and_the_same_at_any_stage_count(small_graph, gcnii):
    one = _local(gcnii, small_graph, stages=1, chunks=6, schedule="1f1b")
    three = _local(gcnii, small_graph, stages=3, chunks=6, schedule="1f1b")
    fill = _local(gcnii, small_graph, stages=3, chunks=6)
    assert one.history["loss"].tolist() == three.history["loss"].tolist()
    assert one.history["loss"].iloc[0] == fill.history["loss"].iloc[0]  # forwards alike
    assert one.history["loss"].iloc[-1] != fill.history["loss"].iloc[-1]  # backwards differ


def test_one_chunk_in_1f1b_is_exact(small_graph, gcnii):
    chunked = _local(gcnii, small_graph, chunks=1, schedule="1f1b")
    exact = gp.train(copy.deepcopy(gcnii), small_graph, "single", epochs=6, progress=False)
    assert _rel(chunked.history["loss"], exact.history["loss"]) < 1e-5


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "graph"}, "schedule: '1f1b' orders the chunked epoch of mode 'local' or 'pipeline'"),
    ({"mode": "hybrid", "ways": 2, "stages": 2}, "mode='hybrid' runs 'gnnpipe'"),
    ({"mode": "local", "techniques": True}, "dZbuf cannot live in Hbuf's memory"),
    ({"mode": "local", "schedule": "gpipe"}, "schedule: expected one of"),
])
def test_1f1b_is_refused_where_it_cannot_run(small_graph, gcnii, kwargs, match):
    kwargs = {"schedule": "1f1b", **kwargs}
    with pytest.raises(ValueError, match=match):
        gp.train(gcnii, small_graph, epochs=1, progress=False, **kwargs)


def _job(model, data, mode, **kwargs):
    return door.parse_train(model, data, mode, **{
        **{k: v for k, v in door.LAYOUT_DEFAULTS.items()}, "plan": None, "parts_per_chunk": 1,
        "workers": None, "cluster": None, "techniques": None, "split": None, "checkpoint": None,
        "checkpoint_every": 10, "resume": None, "restarts": 0, "background": False,
        "progress": False, "epochs": 1, "lr": 0.01, "weight_decay": 0.0,
        "gnn_weight_decay": None, "seed": 0, "timeout": 60.0, "eval_every": 1, "device": "cpu",
        **kwargs}).job


def test_1f1b_stashes_at_most_the_chunks_in_flight(small_graph, gcnii):
    """Stage ``s`` of ``S`` keeps ``S - s`` chunks, one process one chunk; fill-drain all."""
    def stash(mode, schedule, **kwargs):
        job = _job(gcnii, small_graph, mode, stages=3, chunks=12, schedule=schedule, **kwargs)
        return estimate(gcnii, small_graph, job)["stash"].tolist()

    fill, staged = stash("pipeline", "gnnpipe"), stash("pipeline", "1f1b")
    assert all(s < f for s, f in zip(staged, fill))
    assert staged[0] > staged[1] > staged[2]  # 3, 2 and 1 chunks in flight
    assert stash("local", "1f1b")[0] < stash("local", "gnnpipe")[0]


def test_1f1b_recompute_keeps_a_slot_per_chunk_in_flight(cluster, small_graph, gcnii):
    """Recomputation is exact in 1F1B too, and its cache holds the chunks in flight only: one
    slot per stage in one process, instead of a full-graph tensor."""
    from gnnpipe.core.kinds import TrainSchedule
    from gnnpipe.core.techniques import Techniques
    from gnnpipe.engine.graph import normalized_adjacency
    from gnnpipe.engine.local import LocalEngine, stage_ranges
    from gnnpipe.partition import chunk

    kwargs = {"stages": 2, "chunks": 6, "schedule": "1f1b"}
    plain = _local(gcnii, small_graph, **kwargs)
    lean = _local(gcnii, small_graph, recompute=True, **kwargs)
    assert _rel(lean.history["loss"], plain.history["loss"]) < 1e-6
    pipe = gp.train(copy.deepcopy(gcnii), small_graph, "pipeline", epochs=6, cluster=cluster,
                    progress=False, recompute=True, **kwargs)
    assert _rel(pipe.history["loss"], lean.history["loss"]) < 1e-5

    parts = chunk(small_graph, 6, seed=0)
    data = parts.apply(small_graph)
    model = copy.deepcopy(gcnii)
    engine = LocalEngine(model, data, normalized_adjacency(data.edge_index, data.num_nodes,
                                                           model.norm),
                         parts.bounds.tolist(), stage_ranges(len(model), 2), Techniques(), 0,
                         True, torch.optim.Adam(model.parameters()),
                         schedule=TrainSchedule.ONE_F_ONE_B)
    engine.begin_epoch(0)
    engine.run_chunks(0)
    buffers = [buf for ex in engine.stages for buf in ex.buffers.values()]
    tallest = max(b - a for a, b in zip(parts.bounds, parts.bounds[1:]))
    assert buffers and all(buf.kept_z is None and len(buf.z_slots) == 1
                           and buf.z_slots[0].size(0) == tallest and not buf.z_slot_of
                           for buf in buffers)


def test_an_outbox_lets_go_of_the_sends_an_answer_acknowledges():
    """A send's handle holds its tensor: the ones an answer acknowledges are settled and
    dropped (holding them to the epoch's end kept every chunk a middle stage sent)."""
    from gnnpipe.runtime.pipeline import _Outbox

    settled = []

    class Settles:
        def settle(self, works):
            settled.append(list(works))

    box = _Outbox({0: 0, 1: 2, 2: 3})
    box.sent = [["a0", "b0"], ["a1", "b1"], ["a2", "b2"]]
    box.answered(Settles(), 0)
    assert settled == [] and box.released == 0
    box.answered(Settles(), 1)
    assert settled == [["a0", "b0", "a1", "b1"]] and box.sent == [[], [], ["a2", "b2"]]
    box.answered(Settles(), 2)
    assert settled[-1] == ["a2", "b2"] and box.sent == [[], [], []] and box.released == 3
