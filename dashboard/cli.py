"""The dashboard's part of the `gnnpipe` command line, found through the ``gnnpipe.cli``
entry point (so the library never imports the dashboard)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any


def serve_run(run: Any, port: int = 0, address: str = "127.0.0.1") -> tuple[Any, str]:
    """Serve a live dashboard for ``run``; returns ``(server, url)``."""
    from dashboard.app import Dashboard

    return Dashboard(run).serve(port=port, address=address)


def snapshot(run: Any, folder: str | Path) -> Path:
    """Write ``dashboard.html`` (a static snapshot of the finished run) into ``folder``."""
    from dashboard.app import Dashboard

    return Dashboard(run).save(Path(folder) / "dashboard.html")


def _dashboard(args: argparse.Namespace) -> int:
    from dashboard.app import Dashboard

    if not args.explore and args.run is None:
        print("gnnpipe dashboard: give a run folder (runs/<id>/) or --explore")
        return 2
    board = Dashboard(None if args.explore else args.run)
    server, url = board.serve(port=args.port, address=args.address)
    print(f"dashboard at {url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
    return 0


def register(subparsers: Any) -> None:
    """Add ``gnnpipe dashboard``."""
    p = subparsers.add_parser("dashboard", help="serve the dashboard for a saved run, or --explore")
    p.add_argument("run", nargs="?", help="a run folder written by gnnpipe train (runs/<id>/)")
    p.add_argument("--explore", action="store_true", help="the schedule explorer alone")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--address", default="127.0.0.1", help="interface to bind (localhost)")
    p.set_defaults(func=_dashboard)
