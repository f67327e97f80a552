"""The gnnpipe command line."""

from __future__ import annotations

import json

import pandas as pd

from gnnpipe.cli import main


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


def test_bad_arguments_exit_2_without_writing(tmp_path, capsys):
    code = main(["train", "--dataset", "synthetic:500", "--model", "gcn", "--layers", "2",
                 "--mode", "local", "--stages", "5", "--out", str(tmp_path)])
    assert code == 2
    assert "stages: 5 stages need at least as many blocks" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
