"""Many hosts, proven: two "hosts" made of network namespaces joined by a veth pair, each with its
own host name and one ``dask worker``, the scheduler on the first; ``pipeline`` and ``graph`` run
across them through the scheduler address and match the one-process modes, byte for byte.

All traffic stays on the namespaces' own addresses (and their loopback): the veth pair has no end
in the root namespace, and the client runs inside the first namespace (this file, run as a script).
Run as root with ``ip`` and ``unshare`` (iproute2, util-linux); elsewhere the test is skipped.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ADDRS = ("10.231.0.1", "10.231.0.2")  # inside the namespaces only
SUBNET = "10.231.0.0/24"
PORT = 8786
EPOCHS = 4
ROOT = Path(__file__).resolve().parents[2]
DASK = ROOT / ".venv" / "bin" / "dask"
_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)


def _why_no_namespaces() -> str | None:
    """Why two namespace hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return f"network namespaces need root (running as uid {os.geteuid()})"
    if missing := [t for t in ("ip", "unshare") if shutil.which(t) is None]:
        return f"network namespaces need {' and '.join(missing)} on PATH"
    if not DASK.exists():
        return f"the hosts run {DASK}, which does not exist"
    return None


@dataclass
class Hosts:
    """Two namespace hosts: namespace, veth end and address of each, the processes started."""

    names: tuple[str, str]
    ifaces: tuple[str, str]
    logs: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def scheduler(self) -> str:
        return f"tcp://{ADDRS[0]}:{PORT}"

    def exec(self, host: int, argv: list[str], log: str) -> subprocess.Popen:
        """Start ``argv`` on ``host`` (its namespace, under its own host name)."""
        with open(self.logs / log, "w") as out:
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.names[host], "unshare", "--uts", "sh", "-c",
                 'hostname "$0" && exec "$@"', self.names[host], *argv],
                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=_env(),
                start_new_session=True)  # its own process group, ended as one
        self.procs.append(proc)
        return proc

    def log_tails(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}"
                         for p in sorted(self.logs.glob("*.log")))


def _env() -> dict[str, str]:
    """The test's environment, less any interface choice (the ranks must find theirs)."""
    return {k: v for k, v in os.environ.items() if k not in _IFNAME_VARS}


def _make_hosts(hosts: Hosts) -> str | None:
    """Both namespaces, the veth pair between them (created inside them), addresses, loopback
    up, no route anywhere else; what the system said if it refuses network namespaces."""
    first = _ip("netns", "add", hosts.names[0])
    if first.returncode != 0:
        return first.stderr.strip()
    _check(_ip("netns", "add", hosts.names[1]))
    a, b = hosts.ifaces
    _check(_ip("link", "add", a, "netns", hosts.names[0], "type", "veth",
               "peer", "name", b, "netns", hosts.names[1]))
    for name, iface, addr in zip(hosts.names, hosts.ifaces, ADDRS):
        for cmd in (["link", "set", "lo", "up"], ["addr", "add", f"{addr}/24", "dev", iface],
                    ["link", "set", iface, "up"]):
            _check(_ip("-n", name, *cmd))
        lo = _ip("-n", name, "-o", "addr", "show", "dev", "lo").stdout
        assert "127.0.0.1" in lo, f"loopback of {name} is not up: {lo!r}"
        routes = _ip("-n", name, "-4", "route", "show").stdout.splitlines()
        assert [r.split()[0] for r in routes] == [SUBNET], routes
    return None


def _check(done: subprocess.CompletedProcess) -> None:
    assert done.returncode == 0, f"{' '.join(done.args)}: {done.stderr.strip()}"


def _stop(hosts: Hosts) -> None:
    """End every process started, then any left inside the namespaces, then the namespaces
    (which takes the veth pair with them)."""
    for proc in hosts.procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    for proc in hosts.procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    for name in hosts.names:
        for pid in _ip("netns", "pids", name).stdout.split():  # only ours live in there
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", name)


@pytest.fixture
def two_hosts(tmp_path: Path) -> Iterator[Hosts]:
    """The scheduler and one worker on host 0, one worker on host 1; torn down even on failure."""
    if reason := _why_no_namespaces():
        pytest.skip(reason)
    tag = os.getpid() % 100_000
    hosts = Hosts((f"gnnpipe-{tag}-a", f"gnnpipe-{tag}-b"), (f"gp{tag}a", f"gp{tag}b"), tmp_path)
    try:
        if reason := _make_hosts(hosts):
            pytest.skip(f"cannot make network namespaces here: {reason}")
        hosts.exec(0, [str(DASK), "scheduler", "--host", ADDRS[0], "--port", str(PORT),
                       "--no-dashboard"], "scheduler.log")
        for i, addr in enumerate(ADDRS):
            hosts.exec(i, [str(DASK), "worker", hosts.scheduler, "--nthreads", "1", "--host",
                           addr, "--no-dashboard", "--death-timeout", "120",
                           "--local-directory", str(tmp_path / f"worker{i}")], f"worker{i}.log")
        yield hosts
    finally:
        _stop(hosts)


def test_pipeline_and_graph_across_two_hosts(two_hosts: Hosts) -> None:
    out = two_hosts.logs / "result.json"
    client = two_hosts.exec(0, [sys.executable, __file__, two_hosts.scheduler, str(out)],
                            "client.log")
    try:
        rc = client.wait(timeout=600)
    except subprocess.TimeoutExpired:
        rc = None
    assert rc == 0, f"client exited with {rc}\n{two_hosts.log_tails()}"
    res = json.loads(out.read_text())
    for mode in ("pipeline", "graph"):
        run = res[mode]
        assert sorted(w.split("://")[1].rsplit(":", 1)[0] for w in run["workers"]) == list(ADDRS)
        assert len(run["loss"]) == EPOCHS
        ref = res["local" if mode == "pipeline" else "single"]["loss"]
        assert max(abs(a - b) / abs(b) for a, b in zip(run["loss"], ref)) < 1e-5, (mode, run, ref)
        assert run["comm_bytes"] == [run["predicted"]] * EPOCHS
        assert run["training_bytes"] == EPOCHS * run["predicted"]
    # each rank's gloo transport used the veth end holding its worker's address
    assert res["ifnames"] == {f"tcp://{a}": i for a, i in zip(ADDRS, two_hosts.ifaces)}
    # one timeline across hosts: stage 1 never starts a chunk before stage 0 finished it
    assert res["pipeline"]["min_stage_gap"] >= -1e-3


# ---------------------------------------------------------------- the client, inside host 0
def _gloo_ifname() -> str | None:
    return os.environ.get("GLOO_SOCKET_IFNAME")


def _summary(run, model, data, mode: str, **kwargs) -> dict:
    import gnnpipe as gp

    kinds = ["activation", "gradient", "halo", "halo_grad", "boundary", "boundary_grad"]
    found = {"loss": run.history["loss"].tolist()}
    if mode in ("pipeline", "graph"):
        found.update(workers=run.workers, comm_bytes=run.history["comm_bytes"].tolist(),
                     predicted=gp.comm_volume(model, data, mode, **kwargs),
                     training_bytes=int(run.comm[run.comm["kind"].isin(kinds)]["bytes"].sum()))
    return found


def _min_stage_gap(run) -> float:
    """Smallest (stage 1 forward start - stage 0 forward end) over the chunks of every epoch."""
    fwd = run.timeline.df
    fwd = fwd[fwd["kind"] == "forward"].set_index(["epoch", "chunk", "rank"])
    return min(fwd.loc[(e, c, 1), "start"] - fwd.loc[(e, c, 0), "end"]
               for e, c, r in fwd.index if r == 0)


def _client_main(address: str, out: str) -> None:
    import torch
    from distributed import Client

    import gnnpipe as gp

    torch.set_num_threads(1)
    with Client(address, timeout=60) as c:
        c.wait_for_workers(2, timeout=180)
    data = gp.datasets.synthetic(num_nodes=600, avg_degree=8, num_classes=4, num_features=24,
                                 homophily=0.8, seed=3)
    res: dict = {}
    pipe = {"stages": 2, "chunks": 4, "epochs": EPOCHS, "progress": False}
    gcnii = gp.models.gcnii(data.num_features, hidden=16, out_dim=4, layers=4, dropout=0.3)
    for mode, cluster in (("local", None), ("pipeline", address)):
        torch.manual_seed(0)
        run = gp.train(copy.deepcopy(gcnii), data, mode, cluster=cluster, timeout=120, **pipe)
        res[mode] = _summary(run, gcnii, data, mode, stages=2)
    res["pipeline"]["min_stage_gap"] = _min_stage_gap(run)
    gcn = gp.models.gcnii(data.num_features, hidden=16, out_dim=4, layers=4, dropout=0.0)
    for mode, cluster, kw in (("single", None, {}), ("graph", address, {"parts": 2})):
        torch.manual_seed(0)
        run = gp.train(copy.deepcopy(gcn), data, mode, epochs=EPOCHS, cluster=cluster,
                       timeout=120, progress=False, **kw)
        res[mode] = _summary(run, gcn, data, mode, **kw)
    with Client(address, timeout=60) as c:
        found = c.run(_gloo_ifname)
    res["ifnames"] = {w.rsplit(":", 1)[0]: name for w, name in found.items()}
    Path(out).write_text(json.dumps(res))


if __name__ == "__main__":
    _client_main(sys.argv[1], sys.argv[2])
