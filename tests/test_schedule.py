"""Tests for gnnpipe.schedule: op order, dependencies, validation and the step grid."""

from __future__ import annotations

import textwrap

import pytest

from gnnpipe import schedule
from gnnpipe.schedule import Op, Schedule


def grid(text: str) -> str:
    return textwrap.dedent(text).strip("\n")


def test_gnnpipe_grid_2x3() -> None:
    assert str(schedule.gnnpipe(2, 3)) == grid("""
        gnnpipe: 2 stages, 3 chunks, 2 ranks
        step  r0  r1
        0     F0  .
        1     F1  F0
        2     F2  F1
        3     .   F2
        4     .   B2
        5     B2  B1
        6     B1  B0
        7     B0  .
    """)


def test_gpipe_grid_2x2_backward_in_reverse() -> None:
    assert str(schedule.gpipe(2, 2)) == grid("""
        gpipe: 2 stages, 2 chunks, 2 ranks
        step  r0  r1
        0     F0  .
        1     F1  F0
        2     .   F1
        3     .   B1
        4     B1  B0
        5     B0  .
    """)


def test_one_f_one_b_grid_2x4() -> None:
    assert str(schedule.one_f_one_b(2, 4)) == grid("""
        1f1b: 2 stages, 4 chunks, 2 ranks
        step  r0  r1
        0     F0  .
        1     F1  F0
        2     .   B0
        3     B0  F1
        4     F2  B1
        5     B1  F2
        6     F3  B2
        7     B2  F3
        8     .   B3
        9     B3  .
    """)


def test_single_stage_with_step_grid() -> None:
    assert str(schedule.gnnpipe(1, 3, step=True)) == grid("""
        gnnpipe: 1 stages, 3 chunks, 1 ranks
        step  r0
        0     F0
        1     F1
        2     F2
        3     B2
        4     B1
        5     B0
        6     S
    """)


def test_grid_wide_labels_align() -> None:
    rows = str(schedule.gnnpipe(2, 11)).splitlines()
    assert rows[1] == "step  r0   r1"
    assert rows[2] == "0     F0   ."
    assert rows[12] == "10    F10  F9"
    assert len(rows) == 2 + 2 * (11 + 2 - 1)


def test_gnnpipe_order_and_deps() -> None:
    s = schedule.gnnpipe(3, 4)
    assert (s.num_ranks, s.num_stages, s.num_chunks, len(s)) == (3, 3, 4, 24)
    r1 = s.ranks[1]
    assert [(op.kind, op.chunk) for op in r1] == (
        [("forward", c) for c in range(4)] + [("backward", c) for c in (3, 2, 1, 0)])
    assert all(op.stage == 1 for op in r1)
    assert r1[0].deps == (("forward", 0, 0, 0),)
    assert r1[4].deps == (("backward", 2, 3, 0),)
    last = s.ranks[2]
    assert last[4].deps == (("forward", 2, 3, 0),)
    assert s.ranks[0][0].deps == ()


def test_one_f_one_b_warmup_counts() -> None:
    s = schedule.one_f_one_b(4, 8)
    for rank, ops in enumerate(s.ranks):
        kinds = [op.kind for op in ops]
        assert kinds.index("backward") == min(4 - rank, 8)
        assert [op.chunk for op in ops if op.kind == "backward"] == list(range(8))
        assert [op.chunk for op in ops if op.kind == "forward"] == list(range(8))
    # Fewer micro-batches than stages: warm-up is capped at M.
    assert [op.kind for op in schedule.one_f_one_b(4, 2).ranks[0]] == [
        "forward", "forward", "backward", "backward"]


def test_step_appended_per_rank() -> None:
    s = schedule.one_f_one_b(3, 2, step=True)
    assert all(ops[-1].kind == "step" and ops[-1].chunk == -1 for ops in s.ranks)
    assert s.ranks[2][-1].key == ("step", 2, -1, 0)


def test_to_frame() -> None:
    df = schedule.gnnpipe(2, 3).to_frame()
    assert list(df.columns) == ["rank", "order", "kind", "stage", "way", "chunk", "deps"]
    assert len(df) == 12
    assert df.groupby("rank")["order"].max().tolist() == [5, 5]
    assert df.loc[df["kind"] == "forward", "chunk"].tolist() == [0, 1, 2, 0, 1, 2]
    assert df.loc[3, "deps"] == (("backward", 1, 2, 0),)


def test_op_label_and_key() -> None:
    op = Op("backward", 2, 7)
    assert op.key == ("backward", 2, 7, 0)
    assert op.label == "B7"
    assert Op("step", 0, -1).label == "S"
    with pytest.raises(AttributeError):
        op.chunk = 3  # type: ignore[misc]


@pytest.mark.parametrize("ctor, arg", [
    (schedule.gnnpipe, "stages"), (schedule.gnnpipe, "chunks"),
    (schedule.gpipe, "stages"), (schedule.gpipe, "chunks"),
    (schedule.one_f_one_b, "stages"), (schedule.one_f_one_b, "chunks"),
])
@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "4", None])
def test_bad_arguments_name_the_argument(ctor, arg, bad) -> None:
    names = list(ctor.__code__.co_varnames[:2])
    kwargs = {names[0]: 2, names[1]: 2, arg: bad}
    with pytest.raises(ValueError, match=rf"^{arg} must be a positive int"):
        ctor(**kwargs)


def test_numpy_ints_accepted() -> None:
    np = pytest.importorskip("numpy")
    assert len(schedule.gnnpipe(np.int64(2), np.int32(3))) == 12


def test_schedule_rejects_unknown_dep() -> None:
    with pytest.raises(ValueError, match="unknown ops"):
        Schedule("x", 1, 1, ((Op("forward", 0, 0, deps=(("forward", 0, 5, 0),)),),))


def test_schedule_rejects_duplicate_and_out_of_range_ops() -> None:
    with pytest.raises(ValueError, match="more than once"):
        Schedule("x", 1, 1, ((Op("forward", 0, 0), Op("forward", 0, 0)),))
    with pytest.raises(ValueError, match="stage outside"):
        Schedule("x", 1, 1, ((Op("forward", 1, 0),),))
    with pytest.raises(ValueError, match="chunk outside"):
        Schedule("x", 1, 2, ((Op("forward", 0, 2),),))
    with pytest.raises(ValueError, match="kind 'idle'"):
        Schedule("x", 1, 1, ((Op("idle", 0, 0),),))
    with pytest.raises(ValueError, match="num_chunks must be a positive int"):
        Schedule("x", 1, 0, ())


def test_repr() -> None:
    assert repr(schedule.one_f_one_b(3, 5)) == (
        "Schedule('1f1b', ranks=3, stages=3, chunks=5, ops=30)")


def test_interleaved_grid_2_ranks_4_chunks_2_virtual() -> None:
    # Megatron-LM's order: rank 0 warms up with 2(S-1-r) + (v-1)S = 4 forwards, rank 1 with 2;
    # micro-batches go in groups of S = 2, stage r + S·j of rank r is letter j (a, b).
    assert str(schedule.interleaved_1f1b(2, 4, 2)) == grid("""
        interleaved: 4 stages, 4 chunks, 2 ranks
        step  r0   r1
        0     F0a  .
        1     F1a  F0a
        2     F0b  F1a
        3     F1b  F0b
        4     F2a  B0b
        5     B0b  F1b
        6     F3a  B1b
        7     B1b  F2a
        8     F2b  B0a
        9     B0a  F3a
        10    F3b  B1a
        11    B1a  F2b
        12    .    B2b
        13    B2b  F3b
        14    .    B3b
        15    B3b  B2a
        16    B2a  B3a
        17    B3a  .
    """)


def test_interleaved_all_warmup_when_chunks_equal_stages() -> None:
    assert str(schedule.interleaved_1f1b(3, 3, 2)) == grid("""
        interleaved: 6 stages, 3 chunks, 3 ranks
        step  r0   r1   r2
        0     F0a  .    .
        1     F1a  F0a  .
        2     F2a  F1a  F0a
        3     F0b  F2a  F1a
        4     F1b  F0b  F2a
        5     F2b  F1b  F0b
        6     .    F2b  F1b
        7     .    .    F2b
        8     .    .    B0b
        9     .    B0b  B1b
        10    B0b  B1b  B2b
        11    B1b  B2b  B0a
        12    B2b  B0a  B1a
        13    B0a  B1a  B2a
        14    B1a  B2a  .
        15    B2a  .    .
    """)


def test_interleaved_structure_and_validation() -> None:
    s = schedule.interleaved_1f1b(4, 8, 3, step=True)
    assert (s.name, s.num_ranks, s.num_stages, s.num_chunks) == ("interleaved", 4, 12, 8)
    for r, ops in enumerate(s.ranks):
        assert {op.stage % 4 for op in ops if op.kind != "step"} == {r}
        for kind in ("forward", "backward"):
            assert sorted((op.stage, op.chunk) for op in ops if op.kind == kind) == sorted(
                (j * 4 + r, c) for j in range(3) for c in range(8))
        assert ops[-1].key == ("step", r, -1, 0)
    # v = 1 warms up with 2(S-1-r) forwards (Megatron's count, not 1F1B's S-r), then runs
    # forward before backward in the steady state.
    plain = schedule.interleaved_1f1b(3, 6, 1)
    assert [[op.kind for op in ops].index("backward") for ops in plain.ranks] == [5, 3, 1]
    with pytest.raises(ValueError, match=r"^chunks must be a multiple of stages \(4\), got 6"):
        schedule.interleaved_1f1b(4, 6)
    with pytest.raises(ValueError, match="^virtual must be a positive int"):
        schedule.interleaved_1f1b(2, 2, 0)


def test_zb_h1_grid_4x4() -> None:
    # Rank s runs W of chunk c right after B of chunk c + s; the s + 1 W's left fill the drain.
    assert str(schedule.zb_h1(4, 4)) == grid("""
        zb-h1: 4 stages, 4 chunks, 4 ranks
        step  r0  r1  r2  r3
        0     F0  .   .   .
        1     F1  F0  .   .
        2     F2  F1  F0  .
        3     F3  F2  F1  F0
        4     .   .   .   B0
        5     .   .   B0  F1
        6     .   B0  F2  B1
        7     B0  F3  B1  F2
        8     W0  B1  F3  B2
        9     B1  W0  B2  F3
        10    W1  B2  W0  B3
        11    B2  W1  B3  W0
        12    W2  B3  W1  W1
        13    B3  W2  W2  W2
        14    W3  W3  W3  W3
    """)


def test_zb_h1_ops_and_deps() -> None:
    s = schedule.zb_h1(3, 5, step=True)
    for r, ops in enumerate(s.ranks):
        kinds = [op.kind for op in ops]
        assert kinds.count("weight") == kinds.count("backward") == kinds.count("forward") == 5
        assert kinds.index("backward") == 3 - r  # 1F1B's warm-up
        assert [op.chunk for op in ops if op.kind == "weight"] == list(range(5))
        weights = [op for op in ops if op.kind == "weight"]
        assert all(op.deps == (("backward", r, op.chunk, 0),) for op in weights)
        assert kinds[-1] == "step" and kinds[-2 - r:-1] == ["weight"] * (r + 1)
    assert Op("weight", 0, 4).label == "W4"


@pytest.mark.parametrize("ctor, arg", [
    (schedule.interleaved_1f1b, "stages"), (schedule.interleaved_1f1b, "chunks"),
    (schedule.zb_h1, "stages"), (schedule.zb_h1, "chunks"),
])
@pytest.mark.parametrize("bad", [0, -2, 1.5, True, None])
def test_new_schedules_name_bad_arguments(ctor, arg, bad) -> None:
    kwargs = {"stages": 2, "chunks": 2, arg: bad}
    with pytest.raises(ValueError, match=rf"^{arg} must be a positive int"):
        ctor(**kwargs)
