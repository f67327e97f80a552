"""What the benchmark scripts share: command-line options, the child-process protocol, the
environment record and the results files.

The scripts run as ``.venv/bin/python benchmarks/<name>.py``, which puts this folder on
``sys.path``; they import from here with ``from _common import ...``. Functions sent to Dask
workers must not use anything from here: a worker cannot import ``_common``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).parent / "results"

# The named datasets: the data folder beside the checkout when there is one (the project's
# machines and CI have it), else gnnpipe's own default (the user cache, downloading once).
_SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
if "GNNPIPE_DATA" not in os.environ and _SHARED_DATA.is_dir():
    os.environ["GNNPIPE_DATA"] = str(_SHARED_DATA)


def add_output_args(ap: argparse.ArgumentParser, *, child: bool = False) -> None:
    """Add ``--quick`` and ``--out``; with ``child``, the hidden ``--child`` (:func:`run_child`)."""
    ap.add_argument("--quick", action="store_true", help="tiny smoke test; writes nothing")
    ap.add_argument("--out", type=Path, help="results folder (default: benchmarks/results)")
    if child:
        ap.add_argument("--child", help=argparse.SUPPRESS)


def output_dir(args: argparse.Namespace) -> Path | None:
    """``--out``, else :data:`RESULTS`; ``None`` (write nothing) under ``--quick`` alone."""
    return args.out or (None if args.quick else RESULTS)


def run_child(script: str, cfg: dict[str, Any],
              env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``script --child cfg`` in a fresh interpreter (with ``env`` added to the environment);
    its last stdout line is the result."""
    return run_children(script, [cfg], env)[0]


def run_children(script: str, cfgs: list[dict[str, Any]],
                 env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """:func:`run_child` for every ``cfg`` at the same time, each in its own interpreter; their
    results in ``cfgs``' order. Output goes to files, so no child waits on a full pipe while
    another is being read."""
    with contextlib.ExitStack() as files:
        outs = [(files.enter_context(tempfile.TemporaryFile("w+")),
                 files.enter_context(tempfile.TemporaryFile("w+"))) for _ in cfgs]
        procs = [subprocess.Popen([sys.executable, script, "--child", json.dumps(cfg)],
                                  stdout=out, stderr=err,
                                  env=None if env is None else {**os.environ, **env})
                 for cfg, (out, err) in zip(cfgs, outs)]
        for proc in procs:
            proc.wait()
        results = []
        for cfg, proc, (out, err) in zip(cfgs, procs, outs):
            out.seek(0)
            err.seek(0)
            if proc.returncode != 0:
                raise RuntimeError(f"child {cfg} failed:\n{err.read()[-3000:]}")
            results.append(json.loads(out.read().strip().splitlines()[-1]))
    return results


def serve_child(args: argparse.Namespace, child: Callable[[dict[str, Any]], Any]) -> bool:
    """In a ``--child`` process, print ``child(cfg)`` as JSON and return True; else False."""
    if not args.child:
        return False
    print(json.dumps(child(json.loads(args.child))))
    return True


def rss_mb() -> float:
    """This process's resident set size now (``VmRSS``), in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def environment(versions: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    """The machine and software a benchmark ran on, for its results file.

    Keys in order: ``versions`` (default: this process's ``torch``), ``python``, ``extra``,
    ``cpu``, ``cpu_count``, ``loadavg_start``, ``date``. The caller adds ``loadavg_end`` and
    ``wall_s`` at the end (:func:`finish`).
    """
    if versions is None:
        import torch

        versions = {"torch": torch.__version__}
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    return {**versions, "python": platform.python_version(), **extra, "cpu": cpu,
            "cpu_count": os.cpu_count(), "loadavg_start": os.getloadavg(), "date": utc_now()}


def finish(env: dict[str, Any], start: float) -> None:
    """Add the load average now and the seconds since ``start`` (``perf_counter``) to ``env``."""
    env["loadavg_end"], env["wall_s"] = os.getloadavg(), time.perf_counter() - start


def payload(env: dict[str, Any], summary: Any, runs: list[dict[str, Any]],
            args: argparse.Namespace) -> dict[str, Any]:
    """The usual JSON record: ``environment``, ``summary`` (a DataFrame's rows), ``runs`` and
    ``args`` (the command line as strings, without ``--child``)."""
    return {"environment": env, "summary": summary.to_dict(orient="records"), "runs": runs,
            "args": {k: str(v) for k, v in vars(args).items() if k != "child"}}


def write_results(out: Path, name: str, record: dict[str, Any], markdown: str, *,
                  indent: int = 1, end: str = "\n",
                  default: Callable[[Any], Any] | None = None) -> None:
    """Write ``record`` to ``out/<name>.json`` (``json.dumps`` with ``indent`` and ``default``,
    then ``end``) and ``markdown`` to ``out/<name>.md``, creating ``out``; print both paths."""
    out.mkdir(parents=True, exist_ok=True)
    raw, text = out / f"{name}.json", out / f"{name}.md"
    raw.write_text(json.dumps(record, indent=indent, default=default) + end)
    text.write_text(markdown)
    print(f"wrote {raw} and {text}")


def run_pool(fn: Callable[..., dict[str, Any]], jobs: list[tuple], workers: int, threads: int,
             describe: Callable[[dict[str, Any]], str],
             journal: Path | None = None) -> list[dict[str, Any]]:
    """``fn(*job)`` for every job in ``workers`` spawned processes of ``threads`` torch threads
    each (``fn`` must be importable there); print ``describe(result)`` as each finishes and
    append it to ``journal`` (JSON lines; :func:`read_journal`), so that hours of runs survive
    a script stopped before it writes its results."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results, start = [], time.perf_counter()
    with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                             initializer=_set_threads, initargs=(threads,)) as pool:
        for fut in as_completed([pool.submit(fn, *job) for job in jobs]):
            results.append(fut.result())
            print(f"[{time.perf_counter() - start:6.0f}s] {describe(results[-1])}", flush=True)
            if journal is not None:
                journal.parent.mkdir(parents=True, exist_ok=True)
                with journal.open("a") as f:
                    f.write(json.dumps(results[-1], default=str) + "\n")
    return results


def read_journal(journal: Path | None) -> list[dict[str, Any]]:
    """The results an earlier run appended to ``journal`` (none if it is absent)."""
    if journal is None or not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines() if line.strip()]


def resume_journal(out: Path | None, name: str, jobs: list[tuple], fields: tuple[str, ...]
                   ) -> tuple[Path | None, list[dict[str, Any]], list[tuple]]:
    """Pick up where a stopped run of script ``name`` left off: its journal's path (None without
    ``out``), the runs the journal holds, and the ``jobs`` still to run. A job's first
    ``len(fields)`` items name its run as those fields of a result do."""
    journal = out / f"{name}.journal.jsonl" if out is not None else None
    recovered = read_journal(journal)
    have = {tuple(r.get(f) for f in fields) for r in recovered}
    return journal, recovered, [job for job in jobs if tuple(job[:len(fields)]) not in have]


def _set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def accuracy_rows(results: list[dict[str, Any]], keys: list[str]) -> Any:
    """Per distinct ``keys`` value (in first-seen order): test accuracy at best validation per
    seed, mean, sample std, best epochs and median epoch time, as a DataFrame."""
    import statistics

    import pandas as pd

    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    rows = []
    for key, rs in groups.items():
        rs.sort(key=lambda r: r["seed"])
        accs = [r["test_acc"] for r in rs]
        rows.append({**dict(zip(keys, key)), "seeds": " ".join(str(r["seed"]) for r in rs),
                     "per_seed": " ".join(f"{a:.3f}" for a in accs),
                     "mean": statistics.mean(accs),
                     "std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                     "best_epoch": " ".join(str(r["epoch"]) for r in rs),
                     "epoch_s": statistics.median(r["median_epoch_s"] for r in rs)})
    return pd.DataFrame(rows)
