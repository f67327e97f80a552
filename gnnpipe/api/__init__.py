"""The public API's door: :mod:`~gnnpipe.api.door` checks ``gp.train``'s arguments once and
parses them into a :class:`~gnnpipe.core.job.TrainConfig`; :mod:`~gnnpipe.api.train` runs it in
this process or starts it on Dask workers."""

__all__: list[str] = []  # a layer: its modules are imported by name
