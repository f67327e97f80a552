"""Reading the pickled Planetoid ``ind.<name>.*`` files without running code from them.

A pickle may name any importable callable and have it called while loading; the restricted
unpickler here admits only the globals the Planetoid files hold (numpy arrays and dtypes, scipy
CSR/CSC matrices, a ``defaultdict`` of lists) and refuses any other before it is imported.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import Any

__all__ = ["RefusedPickle", "load_planetoid_pickle"]

_ALLOWED = {
    ("numpy", "dtype"),
    ("numpy", "ndarray"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("scipy.sparse.csr", "csr_matrix"),
    ("scipy.sparse._csr", "csr_matrix"),
    ("scipy.sparse.csc", "csc_matrix"),
    ("scipy.sparse._csc", "csc_matrix"),
    ("collections", "defaultdict"),
    ("__builtin__", "list"),
    ("builtins", "list"),
}
# Python 2 pickles name these modules; current numpy and scipy keep them as aliases.
_RENAMED = {"__builtin__": "builtins", "scipy.sparse.csr": "scipy.sparse",
            "scipy.sparse.csc": "scipy.sparse"}


class RefusedPickle(ValueError):
    """A file that is not a Planetoid pickle (it names a global outside the allowlist)."""


class _PlanetoidUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BufferedIOBase, path: os.PathLike | str) -> None:
        super().__init__(file, encoding="latin1")  # the files were written by Python 2
        self._path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise RefusedPickle(f"root: {self._path} is not a Planetoid file: it references "
                                f"{module}.{name}, refused")
        return super().find_class(_RENAMED.get(module, module), name)


def load_planetoid_pickle(path: os.PathLike | str) -> Any:
    """Unpickle one Planetoid file, admitting only the types such files hold.

    Raises:
        RefusedPickle: the file names any other global (nothing of it is imported or called),
            or is not a pickle at all.
    """
    with open(path, "rb") as f:
        try:
            return _PlanetoidUnpickler(f, path).load()
        except RefusedPickle:
            raise
        except Exception as exc:  # truncated or not a pickle: still a bad file, not a crash
            raise RefusedPickle(f"root: {path} is not a Planetoid file: {exc}") from exc
