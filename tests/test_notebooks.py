"""Every notebook under ``notebooks/`` executes top to bottom without a cell error.

Notebooks are executed in memory (nothing is written back) in a kernel running this test's
interpreter, with ``GNNPIPE_NB_EPOCHS`` set small so training cells stay fast.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager, find_kernel_specs
from nbclient import NotebookClient

NOTEBOOKS_DIR = Path(__file__).resolve().parents[1] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
NB_EPOCHS = "20"


def _kernel_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kernel spec whose interpreter is ``sys.executable``: the installed ``python3`` spec if it
    already points there, else a temporary spec found through ``JUPYTER_PATH``."""
    spec_dir = find_kernel_specs().get("python3")
    if spec_dir is not None:
        argv = KernelSpecManager().get_kernel_spec("python3").argv
        if argv and Path(argv[0]) == Path(sys.executable):
            return "python3"
    name = "gnnpipe-test"
    kernel_dir = tmp_path / "jupyter" / "kernels" / name
    kernel_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "gnnpipe", "language": "python"}
    (kernel_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    found = KernelSpecManager().get_kernel_spec(name)
    assert found.argv[0] == sys.executable, found.argv
    return name


def test_notebooks_found() -> None:
    assert NOTEBOOKS, f"no notebooks under {NOTEBOOKS_DIR}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GNNPIPE_NB_EPOCHS", NB_EPOCHS)  # the kernel inherits the environment
    # One intra-op thread unless told otherwise: on a busy machine (pytest -n, other jobs) torch's
    # OpenMP threads oversubscribe the cores and a Cora epoch slows down some 30x.
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    kernel_name = _kernel_name(tmp_path, monkeypatch)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name=kernel_name,
                            resources={"metadata": {"path": str(NOTEBOOKS_DIR)}})
    client.execute()  # raises CellExecutionError on the first failing cell
    missing = [i for i, cell in enumerate(nb.cells)
               if cell.cell_type == "code" and cell.get("execution_count") is None]
    assert not missing, f"{path.name}: code cells {missing} did not run"
