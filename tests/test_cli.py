"""The gnnpipe command line: cheap help, one-line errors before any cluster, run folders that
lose nothing, and the planner loop (``plan --out`` then ``train --plan``, in the plan's mode)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import cloudpickle
import distributed
import pandas as pd
import pytest
from failing_blocks import fail_at

import gnnpipe as gp
from gnnpipe.cli import args as cli_args
from gnnpipe.cli import build_parser, main
from gnnpipe.cli import commands as cli_commands
from gnnpipe.cli import runs as cli_runs
from gnnpipe.plan import Plan
from gnnpipe.runtime.cluster import Cluster
from gnnpipe.runtime.launch import RankFailure

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
ROOT = Path(__file__).resolve().parents[1]
TINY = ["--dataset", "synthetic:600", "--model", "gcn", "--layers", "3", "--hidden", "8"]
#: What the planner tests plan: a graph large enough to chunk, a 6-block model, 2 workers.
PLANNED = ["--dataset", "synthetic:3000", "--model", "gcnii", "--layers", "4", "--hidden", "16"]


def test_simulate_prints_the_bubble_and_writes_a_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["simulate", "--stages", "4", "--chunks", "16", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "bubble fraction 0.1579" in out  # 3/19
    assert len([e for e in json.loads(trace.read_text())["traceEvents"] if e["ph"] == "X"]) == 128


def test_train_writes_a_run_folder(tmp_path, capsys):
    code = main(["train", "--dataset", "synthetic:500", "--model", "sage", "--layers", "3",
                 "--mode", "local", "--stages", "2", "--chunks", "4", "--epochs", "3",
                 "--threads", "1", "--out", str(tmp_path)])
    assert code == 0
    (folder,) = tmp_path.iterdir()
    assert len(pd.read_csv(folder / "history.csv")) == 3
    assert "test_acc" in capsys.readouterr().out


def test_train_checkpoints_and_resumes_like_an_uninterrupted_run(tmp_path, capsys):
    local = [*TINY, "--mode", "local", "--stages", "2", "--chunks", "4", "--threads", "1"]
    assert main(["train", *local, "--epochs", "6", "--out", str(tmp_path / "whole")]) == 0
    ckpt = tmp_path / "ckpt"
    assert main(["train", *local, "--epochs", "4", "--checkpoint", str(ckpt),
                 "--checkpoint-every", "2", "--out", str(tmp_path / "first")]) == 0
    assert main(["train", *local, "--epochs", "6", "--resume", str(ckpt),
                 "--out", str(tmp_path / "rest")]) == 0
    (whole,), (rest,) = (list((tmp_path / f).iterdir()) for f in ("whole", "rest"))
    a, b = (pd.read_csv(f / "history.csv") for f in (whole, rest))
    assert list(b["epoch"]) == list(a["epoch"])  # the history starts with the checkpoint's
    assert b["loss"].tolist() == pytest.approx(a["loss"].tolist(), rel=1e-5)
    assert main(["train", *local, "--resume", str(tmp_path / "none"), "--out",
                 str(tmp_path / "x")]) == 2
    assert "--resume: no checkpoint folder at" in capsys.readouterr().err
    assert main(["train", *TINY, "--mode", "pipeline", "--stages", "2", "--restarts", "1",
                 "--out", str(tmp_path / "y")]) == 2
    assert "restarts" in capsys.readouterr().err and not (tmp_path / "y").exists()


def test_demo_measures_both_graphs_and_explains_its_table(tmp_path, capsys):
    from gnnpipe.cli.demo import COLUMNS

    assert main(["demo", "--epochs", "2", "--layers", "2", "--nodes", "3000", "--large-epochs",
                 "2", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    cora, large = out.split("\nCora: ")[1].split("\nsynthetic 3,000: ")
    for row in ("single", "pipeline 2 x 8", "graph 2 parts"):
        assert f"\n{row} " in cora and f"\n{row} " in large
    assert "\nsingle, 2 threads " in large
    assert all(f"  {name} " in out for name in COLUMNS)  # every column explained
    assert "On Cora the pipeline took " in out and "On synthetic 3,000 nodes the pipeline" in out
    assert len(list(tmp_path.iterdir())) == 7  # a run folder per row


def test_bad_arguments_exit_2_without_writing(tmp_path, capsys):
    code = main(["train", "--dataset", "synthetic:500", "--model", "gcn", "--layers", "2",
                 "--mode", "local", "--stages", "5", "--out", str(tmp_path)])
    assert code == 2
    assert "stages: 5 stages need at least as many blocks" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=True)


def test_the_parser_and_help_import_no_torch():
    probe = _python("import sys, gnnpipe.cli as c; c.build_parser(); print('torch' in sys.modules)")
    assert probe.stdout.strip() == "False"
    helped = subprocess.run([sys.executable, "-m", "gnnpipe.cli", "--help"], capture_output=True,
                            text=True, cwd=ROOT, timeout=120, check=False)
    assert helped.returncode == 0
    assert all(c in helped.stdout for c in ("train", "simulate", "plan", "dashboard"))


def test_the_lazy_package_keeps_the_public_api():
    probe = _python("import sys, gnnpipe as gp, gnnpipe.api.train, gnnpipe.plan; "
                    "from gnnpipe import Cluster; "
                    "print(callable(gp.train), callable(gp.plan), gp.models.gcn.__name__, "
                    "Cluster.__name__, 'torch' in sys.modules)")
    assert probe.stdout.split() == ["True", "True", "gcn", "Cluster", "True"]


def test_the_lazy_package_pickles_by_name():
    """A script's functions that use ``gp`` travel to Dask workers by value (cloudpickle):
    the package inside them must pickle as a module does, by name."""
    import pickle

    import gnnpipe as gp

    assert pickle.loads(cloudpickle.dumps(gp)) is gp
    assert pickle.loads(pickle.dumps(gp)) is gp


def test_the_cli_names_are_the_librarys():
    from gnnpipe import datasets, models
    from gnnpipe.api.door import MODES
    from gnnpipe.core.kinds import Mode
    from gnnpipe.plan import DEFAULT_SCHEDULES, MAX_CHUNKS, PLANNED_MODES

    assert cli_args.MODES == MODES
    assert cli_args.PLANNED_MODES == tuple(m.value for m in PLANNED_MODES)
    assert set(cli_args.SCHEDULES) == {s.value for s in DEFAULT_SCHEDULES}  # --schedules: both
    (commands,) = [a for a in build_parser()._actions
                   if isinstance(a, argparse._SubParsersAction)]
    plan_help = commands.choices["plan"].format_help()
    assert f"at most {MAX_CHUNKS})" in " ".join(plan_help.split())
    assert cli_args.DISTRIBUTED == tuple(m for m in MODES if Mode(m).distributed)
    assert cli_args.MODELS == tuple(sorted(models.MODELS))
    assert cli_args.DATASETS == tuple(sorted(datasets.NAMES))


def test_the_plan_commands_headroom_is_the_planners():
    from gnnpipe.plan.planner import HEADROOM

    args = build_parser().parse_args(["plan", *TINY])
    assert args.headroom == HEADROOM


def test_every_option_states_its_default():
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"train", "demo", "simulate", "plan", "dashboard"} <= set(commands.choices)
    for name, sub in commands.choices.items():
        formatter = sub._get_formatter()
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.dest}: no help"
            assert "(default: " in formatter._expand_help(action), f"{name} {action.dest}"


class Made(NamedTuple):
    """A plan file ``gnnpipe plan --out`` wrote, and what it printed."""

    path: Path
    out: str


def _make_plan(folder: Path, mode: str) -> Made:
    """``gnnpipe plan`` of PLANNED in ``mode`` only (profiled on 2 local workers it starts)."""
    path = folder / f"{mode}.json"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["plan", *PLANNED, "--workers", "2", "--repeats", "1", "--modes", mode,
                     "--out", str(path)]) == 0
    return Made(path, printed.getvalue())


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory):
    """A pipeline plan for PLANNED (``gnnpipe plan --modes pipeline --out``)."""
    return _make_plan(tmp_path_factory.mktemp("plan"), "pipeline")


@pytest.fixture(scope="module")
def graph_plan_file(tmp_path_factory):
    """A graph plan for PLANNED (``gnnpipe plan --modes graph --out``): 2 parts."""
    return _make_plan(tmp_path_factory.mktemp("plan"), "graph")


BAD = [
    (["train", "--lr", "inf"], "--lr: expected a finite number > 0"),
    (["train", "--lr", "nan"], "--lr"),
    (["train", "--lr", "-1"], "--lr"),
    (["train", "--threads", "0"], "--threads: expected an integer >= 1"),
    (["train", "--epochs", "0"], "--epochs"),
    (["train", "--layers", "0"], "--layers"),
    (["train", "--hidden", "0"], "--hidden"),
    (["train", "--weight-decay", "-1"], "--weight-decay"),
    (["train", "--dropout", "1.5"], "--dropout"),
    (["train", "--dataset", "synthetic:abc"], "--dataset"),
    (["train", "--dataset", "synthetic:-5"], "--dataset"),
    (["train", "--dataset", "imagenet"], "--dataset"),
    (["train", "--out", "{file}"], "--out: "),
    (["train", "--out", "{file}/runs"], "--out: "),
    (["train", "--mode", "graph", "--chunks", "4"], "--chunks: does not apply to --mode graph"),
    (["train", "--mode", "graph", "--stages", "2"], "--stages"),
    (["train", "--mode", "graph", "--ways", "2"], "--ways"),
    (["train", "--mode", "single", "--stages", "2"], "--stages"),
    (["train", "--mode", "single", "--parts", "2"], "--parts"),
    (["train", "--mode", "single", "--chunks", "2"], "--chunks"),
    (["train", "--mode", "single", "--parts-per-chunk", "4"],
     "--parts-per-chunk: does not apply to --mode single"),
    (["train", "--mode", "local", "--parts-per-chunk", "0"], "--parts-per-chunk"),
    (["train", "--mode", "pipeline", "--parts", "2"], "--parts"),
    (["train", "--mode", "pipeline", "--ways", "2"], "--ways"),
    (["train", "--mode", "local", "--scheduler", "tcp://127.0.0.1:1"], "--scheduler"),
    (["train", "--dashboard"], "--dashboard"),
    (["train", *TINY, "--mode", "hybrid", "--stages", "2", "--ways", "2", "--chunks", "5"],
     "chunks: hybrid splits chunks evenly"),
    (["train", "--plan", "missing.json"], "--plan: no plan file"),
    (["train", "--plan", "{file}"], "--plan: "),
    (["train", "--mode", "graph", "--schedule", "1f1b"],
     "--schedule: does not apply to --mode graph"),
    (["train", "--mode", "hybrid", "--schedule", "gnnpipe"], "--schedule"),
    (["train", "--schedule", "2f2b"], "--schedule"),
    (["train", "--plan", "{plan}", "--model", "sage"], "--model: "),
    (["train", "--plan", "{plan}", "--layers", "5"], "--layers: "),
    (["train", "--plan", "{plan}", "--stages", "3"], "--stages: {plan} plans pipeline 2 x "),
    (["train", "--plan", "{plan}", "--chunks", "999"], "--chunks: {plan} plans pipeline 2 x "),
    (["train", "--plan", "{plan}", "--recompute"], "with --recompute off, not on"),
    (["train", "--plan", "{plan}", "--history-dtype", "float16"], "--history-dtype: "),
    (["train", "--plan", "{plan}", "--parts", "2"], "--parts: "),
    (["train", "--plan", "{plan}", "--ways", "2"], "--ways: "),
    (["train", "--plan", "{plan}", "--mode", "graph"],
     "--mode: {plan} is a plan for mode pipeline"),
    (["train", "--plan", "{plan}", "--mode", "hybrid"], "--mode: "),
    (["train", "--plan", "{plan}", "--mode", "local", "--scheduler", "tcp://127.0.0.1:1"],
     "--scheduler: does not apply to --mode local"),
    (["train", "--plan", "{graph_plan}", "--parts", "3"],
     "--parts: {graph_plan} plans graph 2 parts with --parts 2, not 3"),
    (["train", "--plan", "{graph_plan}", "--mode", "pipeline"],
     "--mode: {graph_plan} is a plan for mode graph (graph 2 parts), not pipeline"),
    (["train", "--plan", "{graph_plan}", "--mode", "local"], "--mode: "),
    (["train", "--plan", "{graph_plan}", "--stages", "2"], "--stages: "),
    (["train", "--plan", "{graph_plan}", "--chunks", "4"], "--chunks: "),
    (["train", "--plan", "{graph_plan}", "--schedule", "1f1b"], "--schedule: "),
    (["train", "--plan", "{graph_plan}", "--wire-dtype", "bfloat16"], "--wire-dtype: "),
    (["plan", "--workers", "0"], "--workers"),
    (["plan", "--memory-limit", "8XB"], "--memory-limit"),
    (["plan", "--bandwidth", "abc"], "--bandwidth"),
    (["plan", "--headroom", "1"], "--headroom: expected a finite number in [0, 1)"),
    (["plan", "--modes", "graph,gpu"], "--modes: expected a comma-separated list of single,"),
    (["plan", "--modes", ""], "--modes"),
    (["plan", "--modes", "local"], "--modes"),
    (["plan", "--schedules", "gpipe"], "--schedules"),
    (["plan", "--chunks", "0"], "--chunks"),
    (["plan", "--out", "{file}/plan.json"], "--out: "),
    (["plan", *TINY, "--workers", "1", "--modes", "pipeline,graph"],
     "--modes: pipeline,graph has no layout on 1 worker"),
    (["plan", *TINY, "--memory-limit", "1kB"], "memory_limit: 1 kB"),
    (["plan", *TINY, "--chunks", "601"], "chunks: expected at most 600"),
    (["simulate", "--stages", "0"], "--stages"),
    (["simulate", "--chunks", "-1"], "--chunks"),
    (["simulate", "--forward", "nan"], "--forward"),
    (["simulate", "--trace", "{file}/trace.json"], "--trace"),
    (["dashboard", "--port", "-1"], "--port"),
    (["dashboard", "--port", "99999"], "--port"),
    (["dashboard", "runs/missing/"], "run: no run folder"),
    (["dashboard"], "--explore"),
]


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_command_line_is_one_line_and_exit_2(argv, message, request, tmp_path, capsys,
                                                   monkeypatch):
    plans = {name: request.getfixturevalue(f"{name}_file").path  # profiles
             for name in ("plan", "graph_plan") if any(f"{{{name}}}" in a for a in argv)}
    started = []

    def tripwire(self, *args, **kwargs):
        started.append(type(self).__name__)
        raise RuntimeError("tripwire: a cluster was started")

    monkeypatch.setattr(Cluster, "__init__", tripwire)
    monkeypatch.setattr(distributed.LocalCluster, "__init__", tripwire)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "file").write_text("not a plan, not a folder")
    capsys.readouterr()  # what making the plan printed
    argv = [a.format(file=tmp_path / "file", **plans) for a in argv]
    assert main([*argv, "--out", str(tmp_path / "runs")] if argv[0] == "train" and
                "--out" not in argv else argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert message.format(**plans) in err and "Traceback" not in err
    assert not started
    assert not (tmp_path / "runs").exists()


def test_the_dashboard_on_a_busy_port_exits_2_at_once():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "gnnpipe.cli", "dashboard", "--explore",
                               "--port", str(port)], capture_output=True, text=True, cwd=ROOT,
                              timeout=60, check=False)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"--port: cannot listen on 127.0.0.1:{port}" in done.stderr


def test_run_folders_are_new_even_within_a_second(tmp_path, monkeypatch):
    first, second = (cli_runs.new_run_folder(tmp_path, "single") for _ in range(2))
    assert first != second and first.is_dir() and second.is_dir()
    monkeypatch.setattr(cli_runs, "_stamp", lambda: "20250101-000000")
    suffixes = iter(["aaaaaa", "aaaaaa", "bbbbbb"])
    monkeypatch.setattr(cli_runs, "_suffix", lambda: next(suffixes))
    taken = cli_runs.new_run_folder(tmp_path, "graph")
    again = cli_runs.new_run_folder(tmp_path, "graph")  # the name taken: retried
    assert (taken.name, again.name) == ("20250101-000000-graph-aaaaaa",
                                        "20250101-000000-graph-bbbbbb")


def _trained(argv: list[str], runs: Path) -> dict:
    """``gnnpipe train ARGV`` into ``runs``; its run folder's config.json."""
    assert main(["train", *argv, "--epochs", "2", "--threads", "1", "--out", str(runs)]) == 0
    (folder,) = runs.iterdir()
    assert len(pd.read_csv(folder / "history.csv")) == 2
    return json.loads((folder / "config.json").read_text())


def test_a_pipeline_plan_trains_exactly_its_layout(plan_file, tmp_path):
    plan = Plan.from_json(plan_file.path)
    layout = plan.layout
    assert plan.to_dict() == json.loads(plan_file.path.read_text())
    assert plan.made_for == {"dataset": "synthetic:3000", "model": "gcnii", "layers": 4,
                             "hidden": 16}
    assert layout.mode.value == "pipeline" and layout.stages == 2
    assert plan.timeline.makespan() == pytest.approx(plan.epoch_time)
    out = plan_file.out
    assert out.startswith(f"chosen layout: {layout.describe()}: --mode pipeline --stages 2 "
                          f"--chunks {layout.chunks}")
    assert f"\n{plan!r}\n" in out
    assert "candidates, best first (" in out and all(
        c in out for c in ("layout", "epoch_time", "peak_bytes", "comm_bytes", "fits", "reason"))
    assert "\neven split, same chunks: predicted epoch " in out
    assert f"train it ({layout.describe()}, on the dataset and model it was made for)" in out
    assert out.rstrip().endswith(f"gnnpipe train --plan {plan_file.path}\n(or in this one "
                                 f"process, the same math: gnnpipe train --plan {plan_file.path} "
                                 "--mode local)")
    config = _trained(["--plan", str(plan_file.path)], tmp_path / "pipeline")
    planned = (layout.stages, [list(r) for r in layout.ranges], layout.chunks,
               layout.schedule.value, layout.recompute, layout.history_dtype.value,
               layout.wire_dtype.value)
    assert config["mode"] == "pipeline" and config["dataset"] == "synthetic-3000"
    assert (config["stages"], config["ranges"], config["chunks"], config["schedule"],
            config["recompute"], config["history_dtype"], config["wire_dtype"]) == planned
    # the plan's values repeated are no conflict; local runs the same layout in this process
    config = _trained(["--plan", str(plan_file.path), "--mode", "local", "--stages", "2",
                       "--schedule", layout.schedule.value], tmp_path / "local")
    assert config["mode"] == "local"
    assert (config["stages"], config["ranges"], config["chunks"], config["schedule"],
            config["recompute"], config["history_dtype"], config["wire_dtype"]) == planned


def test_a_graph_plan_trains_exactly_its_layout(graph_plan_file, tmp_path):
    plan = Plan.from_json(graph_plan_file.path)
    assert plan.layout.mode.value == "graph" and plan.layout.parts == 2
    out = graph_plan_file.out
    assert out.startswith("chosen layout: graph 2 parts: --mode graph --parts 2")
    assert "uniform split" not in out and "--mode local" not in out  # no stages to compare
    assert out.rstrip().endswith(f"train it (graph 2 parts, on the dataset and "
                                 f"model it was made for) with:\n  gnnpipe train --plan "
                                 f"{graph_plan_file.path}")
    config = _trained(["--plan", str(graph_plan_file.path), "--parts", "2"], tmp_path / "runs")
    assert config["mode"] == "graph" and config["parts"] == plan.layout.parts
    assert config["wire_dtype"] == plan.layout.wire_dtype.value
    assert (config["model"], config["layers"]) == ("gcnii", 4)
    # without --out, the hint says to write the plan first
    assert cli_commands._how_to_train(plan, None).endswith(
        "write it with --out plan.json, then run:\n  gnnpipe train --plan plan.json")


def test_a_failed_run_still_saves_what_it_did(cluster, small_graph, tmp_path):
    model = gp.models.gcn(small_graph.num_features, hidden=8, out_dim=4, layers=4, dropout=0.0)
    fail_at(model, epoch=3)
    run = gp.train(model, small_graph, "pipeline", stages=2, chunks=4, epochs=50,
                   cluster=cluster, background=True, progress=False)
    with pytest.raises(cli_runs.RunFailed, match="rank 1 failed") as failed:
        cli_runs.finish(run, tmp_path, "pipeline", progress=False)
    assert isinstance(failed.value.cause, RankFailure)
    (folder,) = tmp_path.iterdir()
    assert failed.value.folder == folder
    config = json.loads((folder / "config.json").read_text())
    assert config["status"] == "failed" and "injected failure at epoch 3" in config["error"]
    history = pd.read_csv(folder / "history.csv")
    assert 1 <= len(history) <= 3 and history["epoch"].tolist() == list(range(len(history)))
    ops = [e for e in json.loads((folder / "trace.json").read_text())["traceEvents"]
           if e["ph"] == "X"]
    assert ops  # the trace of what ran before the failure
