"""Small argument checkers shared by every layer: ``name: expected X, got Y``.

A value of the wrong kind (a string where a number is due) raises ``TypeError``; a number of the
wrong form or range (``2.5`` epochs, ``lr=inf``) raises ``ValueError``.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from typing import Any

__all__ = ["boolean", "choice", "finite_float", "folder", "integer", "nonnegative_float",
           "positive_float", "positive_int", "share"]


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {value!r}")
    return float(value)


def integer(name: str, value: Any, minimum: int) -> int:
    """An integer ``>= minimum`` (numpy integers too; bools and floats such as 2.0 refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    if not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def positive_int(name: str, value: Any) -> int:
    """An integer ``>= 1``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a positive integer, got {value!r}")
    if not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")
    return int(value)


def positive_float(name: str, value: Any) -> float:
    """A finite number ``> 0``."""
    v = _number(name, value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name}: expected a positive number (finite), got {value!r}")
    return v


def nonnegative_float(name: str, value: Any) -> float:
    """A finite number ``>= 0``."""
    v = _number(name, value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name}: expected a number >= 0 (finite), got {value!r}")
    return v


def finite_float(name: str, value: Any) -> float:
    """Any finite number."""
    v = _number(name, value)
    if not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return v


def share(name: str, value: Any) -> float:
    """A number in ``[0, 1]``."""
    v = _number(name, value)
    if not 0.0 <= v <= 1.0:
        raise ValueError(f"{name}: expected a share in [0, 1], got {value!r}")
    return v


def boolean(name: str, value: Any) -> bool:
    """``True`` or ``False`` (not ``"yes"``, not 1)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected True or False, got {value!r}")
    return value


def choice(name: str, value: Any, options: Sequence[str]) -> str:
    """One of ``options``."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name}: expected one of {tuple(options)}, got {value!r}")
    return value


def folder(name: str, value: Any) -> str:
    """A folder path (``str`` or ``os.PathLike``) that is not an existing file, made absolute."""
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a folder path (str or os.PathLike), got {value!r}")
    path = os.fspath(value)
    if not path:
        raise ValueError(f"{name}: expected a folder path, got an empty string")
    if os.path.isfile(path):
        raise ValueError(f"{name}: expected a folder, but {path!r} is a file")
    return os.path.abspath(path)  # ranks on workers with another working directory see it too
