"""Byte sizes and bandwidths as users write them (``"8GB"``, ``"512MiB"``, ``"1GB/s"``)."""

from __future__ import annotations

import math
import numbers
import re

__all__ = ["DEFAULT_BANDWIDTH", "format_bytes", "parse_bandwidth", "parse_bytes"]

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}
#: Stage-to-stage bandwidth assumed when none is given (bytes/s; gloo over loopback TCP).
DEFAULT_BANDWIDTH = 1e9


def parse_bytes(value: float | str, name: str = "memory_limit") -> int:
    """Bytes from an int, a float or a string such as ``"8GB"`` (10⁹) or ``"512MiB"`` (2²⁰)."""
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ValueError(f"{name}: expected a size such as '8GB', '512MiB' or 1000000, "
                             f"got {value!r}")
        value = float(match.group(1)) * _UNITS[unit]
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected bytes as a number or a string such as '8GB', "
                        f"got {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: expected a positive size, got {value!r}")
    return int(value)


def format_bytes(nbytes: float) -> str:
    """``1234567`` → ``'1.23 MB'`` (decimal units, as :func:`parse_bytes` reads them)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(nbytes) >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{int(nbytes)} B"


def parse_bandwidth(value: float | str | None) -> float:
    """Bytes/s from a number or a string such as ``"1GB/s"``; :data:`DEFAULT_BANDWIDTH` for None."""
    if value is None:
        return DEFAULT_BANDWIDTH
    if isinstance(value, str):
        try:
            return float(parse_bytes(value.strip().removesuffix("/s"), "bandwidth"))
        except ValueError:
            raise ValueError(f"bandwidth: expected bytes per second such as '1GB/s', '125MB/s' "
                             f"or 1e9, got {value!r}") from None
    return float(parse_bytes(value, "bandwidth"))
