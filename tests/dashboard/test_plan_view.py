"""The Plan card: every candidate a plan weighed, the chosen one, the hollow ones that do not fit
and the running layout's measured point beside its prediction; on a hand-made Prediction and on
a real run trained from ``gp.plan``, replayed from its folder too."""

from __future__ import annotations

import holoviews as hv
import pandas as pd
import panel as pn
import pytest

import gnnpipe as gp
from dashboard.app import Dashboard
from dashboard.stream import ReplaySource
from dashboard.style import MODE_COLORS
from dashboard.views.plan import (
    PLAN_TITLE,
    PLAN_WIDTH,
    measured_figures,
    plan_panel,
    plan_plot,
    plan_text,
)
from gnnpipe.core.prediction import CANDIDATE_COLUMNS, Prediction

MIB = 2**20


def _row(layout: str, mode: str, epoch: float, peak_mib: float, fits: bool = True,
         chosen: bool = False, reason: str = "slower") -> dict:
    return {"layout": layout, "mode": mode, "stages": 2, "ways": 1, "parts": 1, "chunks": 8,
            "schedule": "gnnpipe", "recompute": False, "history_dtype": "float32",
            "wire_dtype": "float32", "workers": 2, "epoch_time": epoch,
            "peak_bytes": int(peak_mib * MIB), "comm_bytes": 1_000_000, "fits": fits,
            "chosen": chosen, "reason": reason}


@pytest.fixture
def prediction() -> Prediction:
    rows = [_row("pipeline 2 x 8", "pipeline", 1.0, 300, chosen=True, reason="chosen: fastest"),
            _row("pipeline 2 x 4", "pipeline", 1.2, 350),
            _row("graph 2 parts", "graph", 1.5, 400),
            _row("single", "single", 0.8, 900, fits=False, reason="does not fit: 900 MiB"),
            _row("graph 2 parts (bfloat16 wire)", "graph", 1.1, 700, fits=False,
                 reason="does not fit: 700 MiB")]
    return Prediction("pipeline 2 x 8", 1.0, (300 * MIB, 280 * MIB), 1_000_000,
                      pd.DataFrame(rows, columns=list(CANDIDATE_COLUMNS)))


def _layers(overlay: hv.Overlay, group: str) -> list:
    return [el for el in overlay if el.group == group]


def test_every_candidate_is_a_point_the_chosen_one_marked(prediction):
    overlay = plan_plot(prediction)
    fits = {el.label: el for el in _layers(overlay, "Candidates")}
    assert sorted(fits) == ["graph", "pipeline"]  # one layer per mode among those that fit
    assert sorted(fits["pipeline"].dimension_values("layout")) == ["pipeline 2 x 4",
                                                                   "pipeline 2 x 8"]
    assert fits["graph"].dimension_values("peak_mib").tolist() == [400.0]  # x: MiB per rank
    assert fits["graph"].dimension_values("epoch_time").tolist() == [1.5]  # y: seconds
    [unfit] = _layers(overlay, "Unfit")
    assert sorted(unfit.dimension_values("layout")) == ["graph 2 parts (bfloat16 wire)",
                                                        "single"]
    style = hv.Store.lookup_options("bokeh", unfit, "style").kwargs
    assert style["fill_alpha"] == 0.0  # hollow, outlined in the mode's colour
    assert list(unfit.dimension_values("color")) == [MODE_COLORS["single"], MODE_COLORS["graph"]]
    [chosen] = _layers(overlay, "Chosen")
    assert chosen.dimension_values("layout").tolist() == ["pipeline 2 x 8"]
    assert chosen.dimension_values("peak_mib").tolist() == [300.0]  # the largest rank's
    assert chosen.dimension_values("epoch_time").tolist() == [1.0]
    assert hv.Store.lookup_options("bokeh", chosen, "style").kwargs["size"] > \
        hv.Store.lookup_options("bokeh", fits["graph"], "style").kwargs["size"]
    labels = [el.dimension_values("text")[0].strip() for el in _layers(overlay, "Labels")
              if len(el)]
    assert labels == ["pipeline 2 x 8"]
    # nothing measured yet: the measured layers are there, empty (a live plot keeps its layers)
    assert [len(el) for el in _layers(overlay, "Measured") + _layers(overlay, "Gap")] == [0, 0]
    fig = hv.render(overlay)
    assert fig.title.text == PLAN_TITLE and fig.width == PLAN_WIDTH
    assert fig.xaxis[0].axis_label == "peak memory per rank (MiB)"
    hovers = [t for t in fig.tools if type(t).__name__ == "HoverTool"]
    names = {name for tool in hovers for name, _ in tool.tooltips}
    assert {"layout", "epoch (s)", "peak per rank", "bytes per epoch"} <= names


def test_the_measured_point_sits_beside_its_prediction(prediction):
    overlay = plan_plot(prediction, measured_epoch=1.3, measured_peak=250 * MIB,
                        measured_comm=2e6)
    [measured] = _layers(overlay, "Measured")
    assert measured.dimension_values("peak_mib").tolist() == [250.0]
    assert measured.dimension_values("epoch_time").tolist() == [1.3]
    assert measured.dimension_values("comm").tolist() == ["1.9 MiB"]
    [gap] = _layers(overlay, "Gap")
    assert gap.array().tolist() == [[300.0, 1.0, 250.0, 1.3]]  # from prediction to measured
    labels = [el.dimension_values("text")[0].strip() for el in _layers(overlay, "Labels")]
    assert labels == ["pipeline 2 x 8", "measured"]
    hv.render(overlay)  # draws
    text = plan_text(prediction, 1.3, 250 * MIB)
    assert "**pipeline 2 x 8** of 5 candidates (3 fit the memory limit)" in text
    assert "**1.30×** predicted" in text and "**0.83×** predicted" in text
    assert "not measured yet" in plan_text(prediction)
    assert len(list(plan_panel(prediction, 1.3, 250 * MIB).get_root().references())) > 20


def test_measured_figures_skip_the_first_epoch_and_take_the_largest_rank():
    history = pd.DataFrame({"epoch": [0, 1, 2, 3], "epoch_time": [9.0, 1.0, 3.0, 2.0],
                            "comm_bytes": [10, 20, 20, 20]})
    memory = pd.DataFrame({"rank": [0, 1], "peak_bytes": [5, 7]})
    assert measured_figures(history, memory) == (2.0, 7, 20.0)
    assert measured_figures(history.iloc[:1], memory.iloc[:0]) == (9.0, None, 10.0)
    assert measured_figures(history.iloc[:0], memory.iloc[:0]) == (None, None, None)


def test_a_planned_run_shows_its_plan_card_live_and_replayed(tmp_path):
    from gnnpipe.plan import profile_model

    data = gp.datasets.synthetic(num_nodes=2000, avg_degree=8, num_classes=4, num_features=16,
                                 seed=0)
    model = gp.models.gcnii(16, hidden=16, out_dim=4, layers=4)
    profile = profile_model(model, data, chunks=4, repeats=1)
    plan = gp.plan(model, data, workers=2, modes=["pipeline"], profile=profile)
    run = gp.train(model, data, "local", plan=plan, epochs=3, progress=False)
    assert run.prediction is not None
    epoch, peak, _ = measured_figures(run.history, run.memory())
    assert epoch == pytest.approx(run.history["epoch_time"].iloc[1:].median())
    assert peak == int(run.memory()["peak_bytes"].max()) > 0
    folder = run.save(tmp_path / "planned")
    assert ReplaySource(folder).prediction.layout == run.prediction.layout
    for source in (run, folder):
        layout = Dashboard(source).panel()
        cards = [card.title for card in layout.objects if isinstance(card, pn.Card)]
        assert cards.index("Plan") == cards.index("Ranks") + 1, cards
        models = list(layout.get_root().references())
        assert PLAN_TITLE in [m.text for m in models if type(m).__name__ == "Title"]
        sources = [m.data for m in models if type(m).__name__ == "ColumnDataSource"]
        measured = [d for d in sources if any(str(v).endswith("(measured)")
                                              for v in d.get("layout", []))]
        assert len(measured) == 1
        assert measured[0]["epoch_time"][0] == pytest.approx(epoch)
        assert measured[0]["peak_mib"][0] == pytest.approx(peak / MIB)
        chosen = [d for d in sources if list(d.get("layout", [])) == [run.prediction.layout]]
        assert chosen and chosen[0]["epoch_time"][0] == pytest.approx(run.prediction.epoch_time)


def test_a_run_without_a_plan_has_no_plan_card(small_graph):
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=2)
    run = gp.train(model, small_graph, "local", stages=2, chunks=4, epochs=1, progress=False)
    assert run.prediction is None
    layout = Dashboard(run).panel()
    cards = [card.title for card in layout.objects if isinstance(card, pn.Card)]
    assert "Ranks" in cards and "Plan" not in cards
    titles = [m.text for m in layout.get_root().references() if type(m).__name__ == "Title"]
    assert PLAN_TITLE not in titles


def test_the_plan_card_moves_its_measured_point_as_epochs_arrive(prediction):
    from dashboard.app import _PlanCard

    history = pd.DataFrame({"epoch": [0, 1], "epoch_time": [3.0, 1.3], "comm_bytes": [0, 0]})
    memory = pd.DataFrame({"rank": [0, 1], "peak_bytes": [100 * MIB, 250 * MIB]})
    card = _PlanCard(prediction, history.iloc[:0], memory.iloc[:0])
    assert "not measured yet" in card.text.object
    assert [len(el) for el in _layers(card.plot.pane.object[()], "Measured")] == [0]

    def unasked() -> pd.DataFrame:
        raise AssertionError("memory asked for without a new epoch")

    card.update(history.iloc[:0], unasked)  # no new epoch: nothing redrawn
    card.update(history, lambda: memory)
    [measured] = _layers(card.plot.pane.object[()], "Measured")  # the streamed frame
    assert measured.dimension_values("epoch_time").tolist() == [1.3]
    assert measured.dimension_values("peak_mib").tolist() == [250.0]
    assert "**1.30×** predicted" in card.text.object


def test_the_memory_limit_is_a_dotted_line_where_the_plan_had_one(prediction):
    import dataclasses

    limited = dataclasses.replace(prediction, memory_limit=500 * MIB)
    lines = _layers(plan_plot(limited), "Limit")
    assert len(lines) == 1 and lines[0].data == 500.0  # MiB, where the axis reaches
    assert not _layers(plan_plot(prediction), "Limit")
    assert Prediction.from_dict(limited.to_dict()).memory_limit == 500 * MIB
