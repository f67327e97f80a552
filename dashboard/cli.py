"""The dashboard's part of the `gnnpipe` command line, found through the ``gnnpipe.cli``
entry point (so the library never imports the dashboard). Importing it is cheap: Panel loads
only when a dashboard is served."""

from __future__ import annotations

import argparse
import socket
import time
from pathlib import Path
from typing import Any

from gnnpipe.cli.args import CliError, port_number

__all__ = ["RUN_FILES", "register", "serve_run", "snapshot"]

RUN_FILES = ("config.json", "history.csv", "timeline.json")


def serve_run(run: Any, port: int = 0, address: str = "127.0.0.1") -> tuple[Any, str]:
    """Serve a live dashboard for ``run``; returns ``(server, url)``."""
    from dashboard.app import Dashboard

    return Dashboard(run).serve(port=port, address=address)


def snapshot(run: Any, folder: str | Path) -> Path:
    """Write ``dashboard.html`` (a static snapshot of the finished run) into ``folder``."""
    from dashboard.app import Dashboard

    return Dashboard(run).save(Path(folder) / "dashboard.html")


def _check_run(path: str | Path) -> Path:
    """``path``: a run folder (with one of :data:`RUN_FILES`) or a timeline/trace file."""
    path = Path(path)
    if not path.exists():
        raise CliError(f"run: no run folder or trace file at {path}")
    if path.is_dir() and not any((path / name).exists() for name in RUN_FILES):
        raise CliError(f"run: {path} is not a run folder (none of {', '.join(RUN_FILES)})")
    return path


def _check_port(address: str, port: int) -> None:
    """Fail unless ``address:port`` can be listened on now (a busy port would otherwise kill
    the server's thread while the command waits forever)."""
    if port == 0:
        return
    try:
        family, kind, _, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as err:
        raise CliError(f"--address: cannot resolve {address!r} ({err.strerror})") from None
    with socket.socket(family, kind) as probe:
        try:
            probe.bind(where)
        except OSError as err:
            raise CliError(f"--port: cannot listen on {address}:{port} ({err.strerror}); "
                           "choose another port, or --port 0 for a free one") from None


def _dashboard(args: argparse.Namespace) -> int:
    if args.explore == (args.run is not None):
        raise CliError("run: give a run folder (runs/<id>/) or --explore, one of the two")
    run = None if args.explore else _check_run(args.run)
    _check_port(args.address, args.port)
    from dashboard.app import Dashboard

    server, url = Dashboard(run).serve(port=args.port, address=args.address)
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
    p.add_argument("run", nargs="?",
                   help="a run folder written by gnnpipe train (runs/<id>/) (default: none; "
                        "then --explore)")
    p.add_argument("--explore", action="store_true", help="the schedule explorer alone")
    p.add_argument("--port", type=port_number, default=0, help="0 picks a free port")
    p.add_argument("--address", default="127.0.0.1", help="interface to bind (localhost)")
    p.set_defaults(func=_dashboard)
