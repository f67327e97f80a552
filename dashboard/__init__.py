"""gnnpipe's Panel + HoloViews dashboard: live or replayed runs and the schedule explorer."""

from __future__ import annotations

from dashboard.app import Dashboard

__all__ = ["Dashboard"]
