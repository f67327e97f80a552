"""gnnpipe's Panel + HoloViews dashboard: live or replayed runs and the schedule explorer."""

from __future__ import annotations

from typing import Any

__all__ = ["Dashboard"]


def __getattr__(name: str) -> Any:
    """``Dashboard`` loads on first use: the ``gnnpipe`` command line imports this package to add
    its subcommand, and must not pay for Panel and torch to print ``--help``."""
    if name == "Dashboard":
        from dashboard.app import Dashboard

        return Dashboard
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
