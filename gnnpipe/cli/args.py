"""The command line's parser class and argument types: cheap to import (no torch), every flag's
default in its help, and one-line errors that name the flag.

The modes and schedules come from :mod:`gnnpipe.core.kinds`; the names of models, datasets and
the modes a plan weighs are written out here (the library's tables import torch);
``tests/test_cli.py`` checks they equal the library's.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from gnnpipe.core.kinds import Mode, Precision, TrainSchedule

__all__ = [
    "DATASETS",
    "DISTRIBUTED",
    "MODELS",
    "MODES",
    "PLANNED_MODES",
    "PRECISIONS",
    "SCHEDULES",
    "CliError",
    "DefaultsFormatter",
    "Parser",
    "bandwidth",
    "byte_size",
    "dataset_spec",
    "mode_list",
    "nonneg_float",
    "nonneg_int",
    "port_number",
    "positive_float",
    "positive_int",
    "probability",
    "schedule_list",
    "writable_file",
    "writable_folder",
]

MODES = tuple(m.value for m in Mode)
DISTRIBUTED = tuple(m.value for m in Mode if m.distributed)
PRECISIONS = tuple(p.value for p in Precision)
SCHEDULES = tuple(s.value for s in TrainSchedule)
#: The modes ``gnnpipe plan`` weighs (``local`` holds a pipeline's memory in one process).
PLANNED_MODES = ("single", "pipeline", "graph", "hybrid")
MODELS = ("gcn", "gcnii", "resgcn_plus", "sage")
DATASETS = ("citeseer", "cora", "facebook", "pubmed", "squirrel")


class CliError(Exception):
    """A bad command line found after parsing; ``main`` prints it as one line and exits 2."""


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends ``(default: ...)`` to every option's help that does not state its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        shows = action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)
        if "default" in text or action.default is argparse.SUPPRESS or not shows:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``prog: error: --flag: why``), and whose
    subcommands (plugins' too) get :class:`DefaultsFormatter`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        message = message.removeprefix("argument ").replace("\n", " ")
        self.exit(2, f"{self.prog}: error: {message}\n")


def _integer(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low:
        raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
    return value


def _real(text: str, ok: Callable[[float], bool], what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not ok(value):
        raise argparse.ArgumentTypeError(f"expected a finite number {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _integer(text, 1)


def nonneg_int(text: str) -> int:
    return _integer(text, 0)


def positive_float(text: str) -> float:
    return _real(text, lambda v: v > 0, "> 0")


def nonneg_float(text: str) -> float:
    return _real(text, lambda v: v >= 0, ">= 0")


def probability(text: str) -> float:
    return _real(text, lambda v: 0 <= v < 1, "in [0, 1)")


def port_number(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535 (0: any free port), "
                                         f"got {text!r}")
    return value


def dataset_spec(text: str) -> str:
    """``cora``, ``citeseer``, ``pubmed`` or ``synthetic:NODES``, normalised (``synthetic`` alone
    is ``synthetic:10000``)."""
    name, colon, nodes = text.strip().lower().partition(":")
    if name == "synthetic":
        if not colon:
            return "synthetic:10000"
        if nodes.isdigit() and int(nodes) >= 1:
            return f"synthetic:{int(nodes)}"
    elif name in DATASETS and not colon:
        return name
    raise argparse.ArgumentTypeError(f"expected one of {', '.join(DATASETS)} or synthetic:NODES "
                                     f"(NODES an integer >= 1), got {text!r}")


def _names(text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """Comma-separated names, each one of ``allowed``, without repeats, in the order given."""
    names = [n.strip().lower() for n in text.split(",")]
    if not text.strip() or any(n not in allowed for n in names):
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(allowed)}"
                                         f", got {text!r}")
    return tuple(dict.fromkeys(names))


def mode_list(text: str) -> tuple[str, ...]:
    """``graph`` or ``pipeline,graph``: modes a plan weighs (:data:`PLANNED_MODES`)."""
    return _names(text, PLANNED_MODES)


def schedule_list(text: str) -> tuple[str, ...]:
    """``1f1b`` or ``gnnpipe,1f1b``: pipeline schedules a plan weighs (:data:`SCHEDULES`)."""
    return _names(text, SCHEDULES)


def byte_size(text: str) -> int:
    """Bytes from ``8GB``, ``512MiB`` or a plain number."""
    from gnnpipe.core.units import parse_bytes

    try:
        return parse_bytes(text, "size")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("size: ")) from None


def bandwidth(text: str) -> float:
    """Bytes/s from ``1GB/s`` or a plain number."""
    from gnnpipe.core.units import parse_bandwidth

    try:
        return parse_bandwidth(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected bytes/s such as '1GB/s' or 1000000000, "
                                         f"got {text!r}") from None


def _probe(folder: Path, flag: str) -> None:
    """Fail unless a file can be created in the existing ``folder`` (leaves nothing behind)."""
    try:
        os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".gnnpipe-probe-"))
    except OSError as err:
        raise CliError(f"{flag}: cannot write in {folder} ({err.strerror or err})") from None


def _existing_parent(path: Path, flag: str) -> Path:
    parent = path.absolute()
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise CliError(f"{flag}: {parent} is a file, so {path} cannot be created")
    return parent


def writable_folder(path: str | Path, flag: str) -> Path:
    """``path``, a folder that exists or can be created, and can be written in."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CliError(f"{flag}: {path} is a file, expected a folder (or a new path)")
    _probe(_existing_parent(path, flag), flag)
    return path


def writable_file(path: str | Path, flag: str) -> Path:
    """``path``, a file (new, or to be replaced) in a folder that exists or can be created."""
    path = Path(path)
    if path.is_dir():
        raise CliError(f"{flag}: {path} is a folder, expected a file name")
    _probe(_existing_parent(path.parent, flag), flag)
    return path
