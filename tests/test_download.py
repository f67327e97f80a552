"""A clone alone: the named datasets download from their sources (here a local HTTP server on
127.0.0.1 serving the published files) into the user cache, checked, and read from there."""

from __future__ import annotations

import functools
import http.server
import threading
import zipfile
from pathlib import Path

import pytest
import torch

import gnnpipe as gp
from gnnpipe.datasets.sources import SOURCES

#: The suite's data root (conftest's), noted before a test points the loaders away from it.
_DATA_ROOT = gp.datasets.default_root("facebook")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        self.server.requests.append(self.path)  # type: ignore[attr-defined]


@pytest.fixture
def published(tmp_path: Path) -> Path:
    """A folder of the files as their sources publish them: Cora's raw files, SNAP's
    ``facebook_large.zip`` (the MUSAE files under their ``musae_facebook_*`` names), Squirrel's
    npz; built from the data root the suite reads."""
    root, out = _DATA_ROOT, tmp_path / "published"
    out.mkdir()
    for member in SOURCES["cora"].members:
        (out / member.name).write_bytes((root / "planetoid/Cora/raw" / member.name).read_bytes())
    with zipfile.ZipFile(out / "facebook_large.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        for member in SOURCES["facebook"].members:
            zf.write(root / "musae-facebook" / member.name, member.archived_as)
    (out / "squirrel.npz").write_bytes((root / "heterophilous/squirrel.npz").read_bytes())
    return out


@pytest.fixture
def server(published: Path):
    handler = functools.partial(_Quiet, directory=str(published))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    thread.join()
    httpd.server_close()


@pytest.fixture
def clone_alone(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No data root beside the checkout: the user cache in ``tmp_path``, sources on the server."""
    monkeypatch.delenv("GNNPIPE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GNNPIPE_DATA_URL", f"http://127.0.0.1:{server.server_address[1]}")
    return tmp_path / "cache" / "gnnpipe"


def _same(a, b) -> bool:
    return all(torch.equal(a[k], b[k]) for k in ("x", "y", "edge_index", "train_mask",
                                                "val_mask", "test_mask"))


@pytest.mark.parametrize("name, folder", [("facebook", "musae-facebook"),
                                          ("cora", "planetoid/Cora/raw"),
                                          ("squirrel", "heterophilous")])
def test_a_dataset_downloads_into_the_cache_once(name, folder, clone_alone, server):
    local = gp.datasets.load(name, root=_local_root(name))
    downloaded = gp.datasets.load(name)
    assert _same(downloaded, local)
    assert sorted(p.name for p in (clone_alone / folder).iterdir()) == sorted(
        m.name for m in SOURCES[name].members)  # no temporary file left
    asked = len(server.requests)
    assert asked == len(SOURCES[name].downloads)
    assert _same(gp.datasets.load(name), local) and len(server.requests) == asked  # cached


def _local_root(name: str) -> Path:
    return _DATA_ROOT / "planetoid" if name == "cora" else _DATA_ROOT


def test_a_file_of_the_wrong_size_is_refused_and_nothing_is_kept(published, clone_alone):
    npz = published / "squirrel.npz"
    npz.write_bytes(npz.read_bytes()[:-10])
    with pytest.raises(OSError, match=r"squirrel: squirrel.npz from http://127.0.0.1:\d+/"
                                      r"squirrel.npz has 704,267 bytes, expected 704,277; put"):
        gp.datasets.load("squirrel")
    assert not clone_alone.exists()


def test_an_archive_without_a_member_names_it(published, clone_alone):
    with zipfile.ZipFile(published / "facebook_large.zip", "w") as zf:
        zf.writestr("facebook_large/musae_facebook_edges.csv", "id_1,id_2\n0,1\n")
    with pytest.raises(OSError, match="facebook: facebook_large.zip has no "
                                      "facebook_large/musae_facebook_target.csv"):
        gp.datasets.load("facebook")
    assert not clone_alone.exists()


def test_a_read_only_data_root_downloads_into_the_cache(clone_alone, tmp_path, monkeypatch):
    root = tmp_path / "readonly"
    root.mkdir()
    root.chmod(0o555)
    monkeypatch.setenv("GNNPIPE_DATA", str(root))
    try:
        data = gp.datasets.load("squirrel")
    finally:
        root.chmod(0o755)
    assert data.num_nodes == 5201 and list(root.iterdir()) == []
    assert (clone_alone / "heterophilous" / "squirrel.npz").is_file()
