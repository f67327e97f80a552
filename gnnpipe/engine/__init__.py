"""The math of one training epoch, independent of where it runs (no Dask here)."""
