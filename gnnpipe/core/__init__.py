"""The bottom layer: records and checks every other layer reads, with no torch and no Dask.

- :mod:`~gnnpipe.core.checks`: ``name: expected X, got Y`` argument checkers;
- :mod:`~gnnpipe.core.kinds`: :class:`Mode`, :class:`OpKind`, :class:`BlockKind` (``str`` enums);
- :mod:`~gnnpipe.core.units`: byte and bandwidth parsing and formatting;
- :mod:`~gnnpipe.core.techniques`: :class:`Techniques`, GNNPipe's convergence switches;
- :mod:`~gnnpipe.core.timeline`: :class:`Timeline`, the op table the simulator and the runtime
  both produce;
- :mod:`~gnnpipe.core.job`: :class:`TrainConfig`, the one typed description of a job.
"""

__all__: list[str] = []  # a layer: its modules are imported by name
