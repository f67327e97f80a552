"""Run folders of the command line: unique, created atomically, and written even when a run
fails (the partial history and the trace of what ran)."""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

from gnnpipe.cli.args import CliError

__all__ = ["RunFailed", "finish", "new_run_folder"]

_ATTEMPTS = 100


class RunFailed(Exception):
    """A run that started and then failed; what it did is saved in ``folder``."""

    def __init__(self, folder: Path, cause: BaseException) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.folder, self.cause = folder, cause


def _stamp() -> str:
    return time.strftime("%Y%m%d-%H%M%S")


def _suffix() -> str:
    return secrets.token_hex(3)


def new_run_folder(out: str | Path, label: str) -> Path:
    """Create and return ``out/<date>-<time>-<label>-<random>``, a folder no run used before
    (``mkdir`` without ``exist_ok``: a name taken meanwhile is retried with another suffix)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for _ in range(_ATTEMPTS):
        folder = out / f"{_stamp()}-{label}-{_suffix()}"
        try:
            folder.mkdir()
        except FileExistsError:
            continue
        return folder
    raise CliError(f"--out: no free run folder name in {out} after {_ATTEMPTS} tries")


def _save_partial(run: Any, out: str | Path, label: str, error: BaseException) -> Path:
    """Save what a failed distributed run did (its live history and timeline) in a new run
    folder; ``config.json`` gets ``status: failed`` and the ``error``."""
    from gnnpipe.run import Run

    partial = Run(config=run.config, history=run.history, timeline=run.live_timeline(),
                  comm=run.comm, launch=run.launch, error=f"{type(error).__name__}: {error}")
    return partial.save(new_run_folder(out, label))


def finish(run: Any, out: str | Path, label: str, progress: bool = True) -> Path:
    """Wait for ``run`` (a progress bar with loss and accuracy for distributed runs), then save it
    in a new run folder. Ctrl-C stops the ranks at the end of the epoch and saves what ran; a
    failure saves the partial run and raises :class:`RunFailed`."""
    from gnnpipe.api.train import follow

    if not run.done:
        try:
            try:
                follow(run, progress)
            except KeyboardInterrupt:
                print("stopping at the end of this epoch (Ctrl-C again: leave without saving)",
                      flush=True)
                run.stop()
                run.wait()
        except Exception as err:  # a RankFailure, or an error of the client itself
            raise RunFailed(_save_partial(run, out, label, err), err) from err
    return run.save(new_run_folder(out, label))
