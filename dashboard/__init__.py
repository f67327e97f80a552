"""gnnpipe's Panel + HoloViews dashboard: live or replayed runs and the schedule explorer.

``Dashboard(run)`` shows a run (live while it trains, or a saved run folder); ``Compare(a, b)``
puts two runs side by side. Both load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Compare", "Dashboard"]

_HOMES = {"Compare": "dashboard.compare", "Dashboard": "dashboard.app"}


def __getattr__(name: str) -> Any:
    """``Dashboard`` and ``Compare`` load on first use: the ``gnnpipe`` command line imports this
    package to add its subcommand, and must not pay for Panel and torch to print ``--help``."""
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    """The public API only (what tab completion offers)."""
    return sorted(__all__)
