"""Where the named datasets live on disk and where they come from when they are not there.

Every named graph lives under one *data root* in a fixed layout (the layout of the folder the
project's tests read)::

    <data root>/planetoid/<Name>/raw/ind.<name>.*     Cora, CiteSeer, PubMed (Planetoid's files)
    <data root>/musae-facebook/facebook_*.csv, .json  Facebook Page-Page (the MUSAE release)
    <data root>/heterophilous/squirrel.npz            Squirrel (Platonov et al., 2023)

The data root is ``$GNNPIPE_DATA`` when set, else the user cache (``$XDG_CACHE_HOME/gnnpipe``,
by default ``~/.cache/gnnpipe``). A graph whose files are missing there is downloaded from its
public source into that root (or into the cache when the root is read-only): each file into a
temporary name beside its place, its size (and, where recorded, its SHA-256) checked, then moved
into place, so an interrupted or corrupt download leaves nothing behind. ``$GNNPIPE_DATA_URL``
replaces every source's address by ``$GNNPIPE_DATA_URL/<file name>`` (a mirror, or the tests'
local server).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

__all__ = ["SOURCES", "Download", "Member", "Source", "cache_root", "data_root", "fetch",
           "missing_files"]

logger = logging.getLogger(__name__)

_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Member:
    """One file a dataset needs: its name in the dataset's folder, its size in bytes, its
    SHA-256 where recorded, and its name inside the download when that is an archive."""

    name: str
    size: int | None = None
    sha256: str | None = None
    archived_as: str | None = None


@dataclass(frozen=True)
class Download:
    """One file to fetch: a plain file that is ``members[0]``, or a zip archive holding every
    member (``archived_as``)."""

    url: str
    members: tuple[Member, ...]

    @property
    def is_archive(self) -> bool:
        return self.url.endswith(".zip")


@dataclass(frozen=True)
class Source:
    """A dataset's folder (under the data root, or under ``planetoid/`` there for Planetoid
    graphs) and the downloads that fill it."""

    folder: str
    downloads: tuple[Download, ...]
    origin: str
    #: the folder under the data root that holds ``folder`` (``planetoid`` for Planetoid)
    parent: str = ""

    @property
    def in_data_root(self) -> str:
        """``folder``'s path under the data root."""
        return f"{self.parent}/{self.folder}" if self.parent else self.folder

    @property
    def members(self) -> tuple[Member, ...]:
        return tuple(m for d in self.downloads for m in d.members)


_PLANETOID_URL = "https://github.com/kimiyoung/planetoid/raw/master/data"
_RAW = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
#: The size and SHA-256 of Cora's raw files (the Planetoid repository's).
_CORA = {
    "x": (22119, "23cfa55d91c6f624233f5eb7b6e3f141f1bd2b2ae39608a63cf5d084bb27baab"),
    "tx": (148025, "b9afbaa4a400df991f6f02ef677e1e44da55ffc04801fd02f9e673987829226a"),
    "allx": (257305, "9419ba2f26f5c35243db64aba110e0f35a04851609e0dc5433450676ca6b8543"),
    "y": (4054, "94465c14eb53e04ca262198dcbb2521ee8af60fb3f3d546cd6ca24a511b0e7d1"),
    "ty": (28135, "41f5ac76596a1699cc33f53084a2419e92961c42bb75f36fc38e616d348532ad"),
    "ally": (47959, "2b998f5cc7fedc86e7f97ca2498f47a1ffc1462c29e2d578b23bf3f62b6e7d71"),
    "graph": (59847, "58f13302f39dde8852dad6fe6d15b89b077b6d7f837626bce671ef80344b383d"),
    "test.index": (5000, "297ce89af2b51a6a194181c7dbe1796c6a1cf9cd9349a88383b1b1e227867875"),
}


def _planetoid(key: str, folder: str) -> Source:
    known = _CORA if key == "cora" else {}
    downloads = tuple(
        Download(f"{_PLANETOID_URL}/ind.{key}.{raw}",
                 (Member(f"ind.{key}.{raw}", *known.get(raw, (None, None))),))
        for raw in _RAW)
    return Source(f"{folder}/raw", downloads, "github.com/kimiyoung/planetoid", "planetoid")


#: Every named dataset's source. Facebook comes from SNAP's copy of the MUSAE release (the
#: same three files, named ``musae_facebook_*`` in its archive; sizes checked); PyG's
#: ``FacebookPagePage`` ships 128 derived features instead of the release's 4,714.
SOURCES: dict[str, Source] = {
    "cora": _planetoid("cora", "Cora"),
    "citeseer": _planetoid("citeseer", "CiteSeer"),
    "pubmed": _planetoid("pubmed", "PubMed"),
    "facebook": Source("musae-facebook", (Download(
        "https://snap.stanford.edu/data/facebook_large.zip", (
            Member("facebook_edges.csv", 1882610,
                   archived_as="facebook_large/musae_facebook_edges.csv"),
            Member("facebook_target.csv", 1177912,
                   archived_as="facebook_large/musae_facebook_target.csv"),
            Member("facebook.json", 2088766,
                   archived_as="facebook_large/musae_facebook_features.json"))),),
        "snap.stanford.edu/data/facebook-large-page-page-network.html"),
    "squirrel": Source("heterophilous", (Download(
        "https://github.com/yandex-research/heterophilous-graphs/raw/main/data/squirrel.npz",
        (Member("squirrel.npz", 704277,
                "d436e3b42c0546b105241c0ab0766097074e68e55f67b133eeb9b0162e55cbd9"),)),),
        "github.com/yandex-research/heterophilous-graphs"),
}


def cache_root() -> Path:
    """The user cache's data root: ``$XDG_CACHE_HOME/gnnpipe`` (default ``~/.cache/gnnpipe``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "gnnpipe"


def data_root() -> Path:
    """``$GNNPIPE_DATA`` when set, else :func:`cache_root`."""
    env = os.environ.get("GNNPIPE_DATA")
    return Path(env).expanduser() if env else cache_root()


def missing_files(folder: Path, source: Source) -> list[str]:
    """The names of ``source``'s files that ``folder`` lacks."""
    return [m.name for m in source.members if not (folder / m.name).is_file()]


def fetch(name: str, folder: Path) -> Path:
    """Download dataset ``name``'s missing files into ``folder`` (created) and return it.

    Raises:
        OSError: a download failed or a file is not what the source publishes; the message
            names the address, the file and where to put the files by hand.
    """
    source = SOURCES[name]
    created = next((p for p in (*reversed(folder.parents), folder) if not p.exists()), None)
    folder.mkdir(parents=True, exist_ok=True)
    wanted = set(missing_files(folder, source))
    try:
        for download in source.downloads:
            members = [m for m in download.members if m.name in wanted]
            if members:
                _download(name, download, members, folder, source)
    except BaseException:
        if created is not None:  # the folders this call made go again: nothing half-written
            shutil.rmtree(created, ignore_errors=True)
        raise
    return folder


def _address(url: str) -> str:
    mirror = os.environ.get("GNNPIPE_DATA_URL")
    return f"{mirror.rstrip('/')}/{url.rsplit('/', 1)[1]}" if mirror else url


def _download(name: str, download: Download, members: list[Member], folder: Path,
              source: Source) -> None:
    url = _address(download.url)
    hint = (f"put {', '.join(m.name for m in source.members)} in {folder} by hand "
            f"(from {source.origin}), or set GNNPIPE_DATA to a folder that has "
            f"{source.in_data_root}/")
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        got = Path(tmp) / url.rsplit("/", 1)[1]
        try:
            _copy_url(url, got, f"{name}: {got.name}")
        except (urllib.error.URLError, OSError, ValueError) as err:
            raise OSError(f"{name}: could not download {url} ({err}); {hint}") from None
        if download.is_archive:
            _unzip(name, got, members, Path(tmp), hint)
        else:
            got.rename(Path(tmp) / members[0].name)
        for member in members:  # every file checked before any is moved into place
            _check(name, Path(tmp) / member.name, member, url, hint)
        for member in members:
            os.replace(Path(tmp) / member.name, folder / member.name)
    logger.info("%s: downloaded %s into %s", name, url, folder)


def _copy_url(url: str, dest: Path, label: str) -> None:
    with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
        total = int(response.headers.get("Content-Length") or 0) or None
        with dest.open("wb") as out, tqdm(total=total, unit="B", unit_scale=True,
                                          desc=label, leave=False) as bar:
            while block := response.read(1 << 20):
                out.write(block)
                bar.update(len(block))


def _unzip(name: str, archive: Path, members: list[Member], into: Path, hint: str) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            names = set(zf.namelist())
            for member in members:
                if member.archived_as not in names:
                    raise OSError(f"{name}: {archive.name} has no {member.archived_as}; {hint}")
                with zf.open(member.archived_as) as src, (into / member.name).open("wb") as dst:
                    shutil.copyfileobj(src, dst)
    except zipfile.BadZipFile as err:
        raise OSError(f"{name}: {archive.name} is not a zip archive ({err}); {hint}") from None


def _check(name: str, path: Path, member: Member, url: str, hint: str) -> None:
    size = path.stat().st_size
    if member.size is not None and size != member.size:
        raise OSError(f"{name}: {member.name} from {url} has {size:,} bytes, expected "
                      f"{member.size:,}; {hint}")
    if size == 0:
        raise OSError(f"{name}: {member.name} from {url} is empty; {hint}")
    if member.sha256 is not None:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != member.sha256:
            raise OSError(f"{name}: {member.name} from {url} has SHA-256 {digest}, expected "
                          f"{member.sha256}; {hint}")
