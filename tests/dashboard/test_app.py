"""Dashboard plumbing without a browser: the bounded live feed, replay equals live, snapshots."""

from __future__ import annotations

import json
import threading

import pandas as pd

import gnnpipe as gp
from dashboard.app import Dashboard
from dashboard.session import Session
from dashboard.stream import Feed, ReplaySource, RunSource, as_source
from gnnpipe.run import memory_from


def test_feed_is_bounded_and_drops_the_oldest():
    feed = Feed(max_records=10, max_ops=25)
    for epoch in range(30):
        feed.push({"epoch": epoch}, [{"i": epoch * 3 + k} for k in range(3)])
    records, ops, record_cursor, op_cursor = feed.since(0, 0)
    assert [r["epoch"] for r in records] == list(range(20, 30))
    assert len(ops) == 25 and ops[-1] == {"i": 89}
    assert (record_cursor, op_cursor, feed.dropped) == (30, 90, 20)
    assert feed.since(record_cursor, op_cursor)[:2] == ([], [])


def test_a_reader_that_never_drains_does_not_hold_up_the_writer():
    feed = Feed(max_records=1000, max_ops=1000)
    done = threading.Event()

    def writer() -> None:
        for epoch in range(20_000):
            feed.push({"epoch": epoch}, [{"op": 1}])
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    assert done.wait(timeout=30), "pushing into an undrained feed blocked"
    thread.join()
    assert len(feed.records) == 1000 and len(feed.ops) == 1000


def test_replayed_run_folder_shows_what_the_live_run_showed(cluster, small_graph, tmp_path):
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=4)
    run = gp.train(model, small_graph, "pipeline", stages=2, chunks=4, epochs=6, cluster=cluster,
                   background=True, progress=False)
    live = RunSource(run)
    run.wait(timeout=120)
    session = Session(live)
    assert session.final is not None
    run.save(tmp_path / "run")
    replay = ReplaySource(tmp_path / "run").final()
    columns = ["rank", "chunk", "epoch", "kind", "bytes", "peer"]

    def ops(tl):
        return tl.df[columns].sort_values(columns).reset_index(drop=True)

    pd.testing.assert_frame_equal(ops(replay.timeline), ops(session.timeline()))
    assert (replay.timeline.df["end"] - session.timeline().df["end"]).abs().max() < 1e-6
    pd.testing.assert_frame_equal(replay.history.reset_index(drop=True),
                                  session.history().reset_index(drop=True), check_dtype=False)
    # every epoch the ranks reported live carried the same timeline rows as the final one
    _, streamed_ops, _, _ = live.feed.since(0, 0)
    if streamed_ops:
        live_tl = gp.Timeline.from_events(streamed_ops)
        epochs = sorted(set(live_tl.df["epoch"]))
        final = session.timeline().df
        pd.testing.assert_frame_equal(
            ops(live_tl), ops(gp.Timeline(final[final["epoch"].isin(epochs)])))
    # a Chrome trace file replays too
    trace = ReplaySource(tmp_path / "run" / "trace.json").final().timeline
    assert len(trace) == len(replay.timeline)
    # live records carry each rank's byte counters, split by kind as run.comm is
    records = live.feed.since(0, 0)[0]
    assert all("comm" in r for r in records if "rank" in r)
    session._take(records, [])
    live_memory = memory_from([r for r in records if "rank" in r])  # what the ranks card shows
    assert live_memory["rank"].tolist() == [0, 1] and (live_memory["peak_bytes"] > 0).all()
    counted = pd.DataFrame([row for rows in session.counters.values() for row in rows])
    assert set(session.counters) == {0, 1}
    for kind in ("activation", "gradient"):
        assert (counted.query("kind == @kind")["bytes"].sum()
                == run.comm.query("kind == @kind")["bytes"].sum() > 0)


def test_dashboard_renders_live_replay_and_explorer(small_graph, tmp_path):
    model = gp.models.sage(small_graph.num_features, hidden=8, out_dim=4, layers=3)
    run = gp.train(model, small_graph, "local", stages=2, chunks=4, epochs=3, progress=False)
    for source in (run, run.save(tmp_path / "r"), None):
        root = Dashboard(source).panel().get_root()
        assert len(list(root.references())) > 50
    page = Dashboard(run).save(tmp_path / "dashboard.html")
    text = page.read_text()
    assert "Bokeh" in text and "Stage timeline" in text and "Ranks" in text
    assert "peak memory" in text  # the ranks card's memory table, rank 0 in one process
    data, _ = Dashboard(run)._repr_mimebundle_()  # Jupyter shows the layout, not the repr
    assert "application/vnd.holoviews_exec.v0+json" in data and "Partitions" in data["text/html"]


def test_live_session_keeps_a_window_of_epochs():
    from dashboard.session import WINDOW_EPOCHS
    from dashboard.stream import Source

    class Live(Source):
        done = False  # a run still training

    source = Live({"mode": "pipeline"})
    session = Session(source)
    op = {"rank": 0, "stage": 0, "way": 0, "chunk": 0, "kind": "forward", "start": 0.0,
          "end": 1.0, "bytes": 0, "peer": -1}
    for epoch in range(WINDOW_EPOCHS + 5):
        source.feed.push({"epoch": epoch}, [{**op, "epoch": epoch}])
    session.poll()
    assert sorted(session.ops) == list(range(5, WINDOW_EPOCHS + 5))
    assert len(session.timeline()) == WINDOW_EPOCHS


def test_replayed_folder_rebuilds_its_chunking(cora, tmp_path):
    model = gp.models.gcn(cora.num_features, hidden=8, out_dim=7, layers=2)
    run = gp.train(model, cora, "local", stages=2, chunks=4, epochs=2, progress=False)
    replay = ReplaySource(run.save(tmp_path / "r"))
    assert replay.partitioning is not None and replay.data.num_nodes == cora.num_nodes
    assert replay.partitioning.assignment.tolist() == run.partitioning.assignment.tolist()
    root = Dashboard(tmp_path / "r").panel().get_root()
    assert len(list(root.references())) > 50


def test_a_folder_saved_before_parts_per_chunk_rebuilds_the_merge_it_trained_with(cora, tmp_path):
    """Runs saved before ``parts_per_chunk`` existed were chunked with 4 METIS parts merged
    per chunk; their config lacks the key, and the replay rebuilds that chunking, not today's."""
    model = gp.models.gcn(cora.num_features, hidden=8, out_dim=7, layers=2)
    run = gp.train(model, cora, "local", stages=2, chunks=4, epochs=1, parts_per_chunk=4,
                   progress=False)
    assert run.config.parts_per_chunk == 4
    folder = run.save(tmp_path / "old")
    config = json.loads((folder / "config.json").read_text())
    del config["parts_per_chunk"]
    (folder / "config.json").write_text(json.dumps(config))
    replay = ReplaySource(folder)
    assert replay.partitioning.assignment.tolist() == run.partitioning.assignment.tolist()
    today = gp.chunk(cora, 4, seed=0)
    assert today.assignment.tolist() != run.partitioning.assignment.tolist()


def test_source_argument_is_checked():
    import pytest

    with pytest.raises(TypeError, match="source: expected a Run"):
        as_source(42)
    with pytest.raises(FileNotFoundError, match="source: no run folder"):
        as_source("/nonexistent/run")


def test_closed_tab_filter_drops_only_a_closed_tabs_records() -> None:
    import asyncio
    import logging
    import sys

    from dashboard.app import _ClosedTabFilter

    def record(exc: BaseException | None = None, msg: str = "Uncaught exception GET /ws"):
        info = (type(exc), exc, exc.__traceback__) if exc is not None else None
        return logging.LogRecord("tornado.application", logging.ERROR, __file__, 1, msg, (),
                                 info)

    def raised(fn) -> BaseException:
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - the record carries it
            return err
        raise AssertionError("did not raise")

    namespace: dict = {}
    source = "def lost():\n    assert None is not None\n"  # bokeh's on_close assertion
    code = compile(source, "/venv/site-packages/bokeh/server/connection.py", "exec")
    exec(code, namespace)  # noqa: S102 - defines lost() as if in bokeh's file

    def during_cancel():
        try:
            raise asyncio.CancelledError
        except asyncio.CancelledError:
            raise KeyError("session")  # chained implicitly, as in tornado

    keep = _ClosedTabFilter().filter
    assert not keep(record(raised(namespace["lost"])))
    assert not keep(record(raised(during_cancel)))  # arose while handling a cancelled socket
    assert not keep(record(msg="Error thrown from periodic callback:"))
    assert not keep(record(msg="Traceback ...\ntornado.websocket.WebSocketClosedError\n"))
    assert keep(record(raised(lambda: {}["missing"])))  # a real error stays
    assert keep(record(msg="Traceback ...\nKeyError: 'x'\n"))
    assert sys.modules["dashboard.app"]  # the filter lives in the served app


def test_a_predicted_timeline_is_drawn_below_the_measured_one(small_graph):
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=2)
    run = gp.train(model, small_graph, "local", stages=2, chunks=4, epochs=2, progress=False)
    predicted = gp.simulate(gp.schedule.gnnpipe(2, 4), {"forward": 1.0, "backward": 2.0})
    root = Dashboard(run, predicted=predicted).panel().get_root()
    titles = [m.text for m in root.references() if type(m).__name__ == "Title"]
    assert any(t.startswith("predicted: makespan") for t in titles), titles
    assert any(t.startswith("measured, epoch 1") for t in titles), titles
