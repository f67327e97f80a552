"""Scripts work as written: real ``python script.py`` runs of a distributed ``gp.train``.

Dask spawns its workers, which re-import the script; an unguarded top-level call must fail at
once with one line saying what to change, a guarded one (or one inside a function called
under the guard) must train."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

GUARD_HINT = 'put the script\'s code under `if __name__ == "__main__":`'
TRAIN = """\
data = gp.datasets.synthetic(num_nodes=200, avg_degree=4, num_classes=3, num_features=8, seed=0)
model = gp.models.gcn(data.num_features, hidden=8, out_dim=3, layers=2)
run = gp.train(model, data, "pipeline", stages={stages}, chunks=2, epochs=1, progress=False)
print("epochs trained:", len(run.history))
"""


def _indent(code: str) -> str:
    return textwrap.indent(code, "    ")


def _run(tmp_path: Path, name: str, code: str,
         timeout: float = 240) -> tuple[subprocess.CompletedProcess, str]:
    """Run ``code`` as ``tmp_path/name`` in a fresh interpreter; also returns a marker every
    process it starts inherits (to find leftovers)."""
    script = tmp_path / name
    script.write_text(code)
    token = uuid.uuid4().hex
    env = {**os.environ, "GNNPIPE_SCRIPT_TEST": token}
    done = subprocess.run([sys.executable, str(script)], check=False, cwd=tmp_path, env=env,
                          timeout=timeout, capture_output=True, text=True)
    return done, f"GNNPIPE_SCRIPT_TEST={token}"


def _processes_with(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker`` (children of a finished script)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:  # gone, or not ours
                continue
    return found


def test_unguarded_script_fails_at_once_naming_the_line(tmp_path):
    code = "import gnnpipe as gp\n\n" + TRAIN.format(stages=2)
    done, marker = _run(tmp_path, "train.py", code, timeout=120)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("RuntimeError: train.py line 5: gp.train starts Dask worker processes, which "
                    "re-import this script; " + GUARD_HINT)
    assert "Nanny" not in done.stderr  # refused before any worker process was spawned
    assert "epochs trained" not in done.stdout
    assert _processes_with(marker) == []


def test_guarded_script_trains(tmp_path):
    code = "import gnnpipe as gp\n\nif __name__ == \"__main__\":\n" + _indent(TRAIN.format(stages=2))
    done, marker = _run(tmp_path, "train.py", code)
    assert done.returncode == 0, done.stderr
    assert "epochs trained: 1" in done.stdout
    assert _processes_with(marker) == []


def test_call_from_a_function_run_under_the_guard_trains(tmp_path):
    code = ("import gnnpipe as gp\n\n\ndef main() -> None:\n" + _indent(TRAIN.format(stages=1))
            + "\n\nif __name__ == \"__main__\":\n    main()\n")
    done, _ = _run(tmp_path, "train.py", code)
    assert done.returncode == 0, done.stderr
    assert "epochs trained: 1" in done.stdout


def test_function_called_from_unguarded_top_level_is_refused(tmp_path):
    code = ("import gnnpipe as gp\n\n\ndef main() -> None:\n" + _indent(TRAIN.format(stages=2))
            + "\n\nmain()\n")
    done, marker = _run(tmp_path, "train.py", code, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith("RuntimeError: train.py line 11: main ")
    assert _processes_with(marker) == []


def test_call_in_a_worker_reimporting_the_script_is_refused(tmp_path):
    """The re-import side: a call that only runs in the spawned worker's bootstrap (the parent
    never makes it, so the parent's check cannot see it) is refused there, with the same line."""
    code = textwrap.dedent("""\
        import os

        import gnnpipe as gp

        if os.environ.get("GNNPIPE_TEST_REIMPORT") == "1":
            gp.Cluster(n_workers=1)  # runs only in a worker re-importing this script

        if __name__ == "__main__":
            os.environ["GNNPIPE_TEST_REIMPORT"] = "1"
            gp.Cluster(n_workers=1)
        """)
    done, marker = _run(tmp_path, "start.py", code, timeout=120)
    assert done.returncode != 0
    assert ("RuntimeError: start.py line 6: gp.Cluster starts Dask worker processes, which "
            "re-import this script; " + GUARD_HINT) in done.stderr.splitlines()
    assert _processes_with(marker) == []


def test_script_edited_while_it_runs_is_not_refused_for_its_new_lines(tmp_path):
    """The check reads the script from its file: where the file has changed since the script
    started (an editor saved it), its line numbers are not the running code's, and a guarded
    call must not be refused because an unguarded line now stands where it stood."""
    code = textwrap.dedent("""\
        import pathlib

        from gnnpipe.runtime.scripts import check_main_guard

        if __name__ == "__main__":
            path = pathlib.Path(__file__)
            path.write_text("x = 1\\n" * 20 + path.read_text())
            check_main_guard()
            print("not refused")
        """)
    done, _ = _run(tmp_path, "edited.py", code, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "not refused" in done.stdout


def test_unedited_script_is_still_refused_from_its_file(tmp_path):
    """The comparison with the running code keeps the check itself: an unguarded call in an
    unchanged file is refused, naming its line."""
    code = "from gnnpipe.runtime.scripts import check_main_guard\n\ncheck_main_guard()\n"
    done, _ = _run(tmp_path, "plain.py", code, timeout=120)
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1].startswith(
        "RuntimeError: plain.py line 3: check_main_guard starts Dask worker processes")


def test_a_script_plans_a_message_passing_layer_of_its_own(tmp_path):
    """A ``MessagePassing`` class defined in the script travels to the workers by value; PyG
    generated its ``propagate`` into a module the workers cannot import, which gp.plan's
    profile (like gp.train) must ship along."""
    code = textwrap.dedent("""\
        from torch import nn
        from torch_geometric.nn import MessagePassing, Sequential

        import gnnpipe as gp


        class MeanConv(MessagePassing):
            def __init__(self, dim_in, dim_out):
                super().__init__(aggr="mean")
                self.lin = nn.Linear(dim_in, dim_out)

            def forward(self, x, edge_index):
                return self.propagate(edge_index, x=x)

            def message(self, x_j):
                return self.lin(x_j)


        if __name__ == "__main__":
            data = gp.datasets.synthetic(num_nodes=200, avg_degree=4, num_classes=3,
                                         num_features=8, seed=0)
            model = Sequential("x, edge_index", [
                (MeanConv(8, 8), "x, edge_index -> x"), nn.ReLU(),
                (MeanConv(8, 3), "x, edge_index -> x")])
            plan = gp.plan(model, data, workers=2, modes=["pipeline"])
            print("planned:", plan.mode, plan.layout.stages)
        """)
    done, marker = _run(tmp_path, "plan.py", code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "planned: pipeline 2" in done.stdout
    assert _processes_with(marker) == []
