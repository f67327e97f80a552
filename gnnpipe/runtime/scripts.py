"""Refuse to start a local Dask cluster from a script's unguarded top level, in one line.

Dask starts worker processes with multiprocessing's ``spawn`` method, which re-imports the main
script in every worker before it runs anything. A module-level ``gp.train(...)`` outside
``if __name__ == "__main__":`` would then start a cluster again inside each worker's bootstrap,
and the caller would only see ``RuntimeError: Nanny failed to start``. :func:`check_main_guard`
names the script's line instead, before any worker process exists.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import sys
import tokenize
from types import FrameType

import dask

__all__ = ["check_main_guard"]

#: Names a script's module-level code runs under: as the main script, or re-imported by spawn.
_MAIN_NAMES = ("__main__", "__mp_main__")


def check_main_guard() -> None:
    """Raise ``RuntimeError`` when starting Dask worker processes now would run this very call
    again in each of them: the call comes from the main script's module-level code outside
    ``if __name__ == "__main__":``, or this process is itself a spawned worker still
    re-importing the script (its bootstrap)."""
    bootstrapping = bool(getattr(multiprocessing.current_process(), "_inheriting", False))
    if not bootstrapping and not _reimported_by_workers():
        return
    frame = _script_frame()
    parsed = _parse(frame) if frame is not None else None
    if frame is None or parsed is None:
        if bootstrapping:
            raise RuntimeError(_message("this script", 0, "this call"))
        return
    tree, source = parsed
    if not bootstrapping and _guarded(tree, frame.f_lineno):
        return
    name = os.path.basename(frame.f_code.co_filename)
    raise RuntimeError(_message(name, frame.f_lineno, _callee(frame, tree, source)))


def _message(script: str, lineno: int, callee: str) -> str:
    where = f"{script} line {lineno}" if lineno else script
    return (f"{where}: {callee} starts Dask worker processes, which re-import this script; "
            f'put the script\'s code under `if __name__ == "__main__":`')


def _reimported_by_workers() -> bool:
    """Whether Dask's worker processes will re-run the main module: spawned (the default
    ``distributed.worker.multiprocessing-method``), from a file, not a package's ``__main__``
    (which multiprocessing never re-imports), not an interactive session."""
    # (distributed's own default where it has not been imported yet to register it)
    if dask.config.get("distributed.worker.multiprocessing-method", "spawn") != "spawn":
        return False
    main = sys.modules.get("__main__")
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if spec_name == "__main__" or spec_name.endswith(".__main__"):
        return False
    return getattr(main, "__file__", None) is not None


def _script_frame() -> FrameType | None:
    """The frame running the main script's module-level code (``__main__``, or ``__mp_main__``
    while spawn re-imports it), if the call comes through one."""
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") in _MAIN_NAMES:
            name = frame.f_globals["__name__"]
            if name == "__mp_main__" or _same_file(frame.f_code.co_filename, main_file):
                return frame
        frame = frame.f_back
    return None


def _same_file(a: str, b: str | None) -> bool:
    return b is not None and os.path.realpath(a) == os.path.realpath(b)


def _parse(frame: FrameType) -> tuple[ast.Module, str] | None:
    """The script's syntax tree and source, read from its file; None where the file no longer
    holds the code the frame runs (edited since the script started: its lines would not be the
    running ones) or cannot be read."""
    path = frame.f_code.co_filename
    try:
        with tokenize.open(path) as f:
            source = f.read()
        tree = ast.parse(source, filename=path)
        if compile(tree, path, "exec", dont_inherit=True) != frame.f_code:
            return None
        return tree, source
    except (OSError, SyntaxError, ValueError):
        return None


def _guarded(tree: ast.Module, lineno: int) -> bool:
    """Whether line ``lineno`` lies in the body of an ``if __name__ == "__main__":``."""
    return any(isinstance(node, ast.If) and _is_main_test(node.test)
               and node.body[0].lineno <= lineno <= (node.body[-1].end_lineno or lineno)
               for node in ast.walk(tree))


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = (test.left, test.comparators[0])
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))


def _callee(frame: FrameType, tree: ast.Module, source: str) -> str:
    """What the script's line calls (``gp.train``): the call the frame is executing (its exact
    source position, Python 3.11+), else the outermost call on the line, else the line itself."""
    lineno = frame.f_lineno
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and n.lineno <= lineno <= (n.end_lineno or n.lineno)]
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is not None and calls:
        here = list(positions())[frame.f_lasti // 2]
        exact = [n for n in calls
                 if (n.lineno, n.end_lineno, n.col_offset, n.end_col_offset) == tuple(here)]
        calls = exact or calls
    if calls:
        return ast.get_source_segment(source, calls[0].func) or "this call"
    return source.splitlines()[lineno - 1].strip() if lineno else "this call"
