"""What a run's numbers mean, computed from the job and its timeline, with no cluster:

- :mod:`~gnnpipe.analysis.volume`: :func:`~gnnpipe.analysis.volume.comm_volume`, the bytes per
  epoch each mode sends, from the graph, the chunking and the model's aggregations;
- :mod:`~gnnpipe.analysis.efficiency`: parallel efficiency and each rank's compute,
  communication, waiting and idle shares of a measured timeline;
- :mod:`~gnnpipe.analysis.whatif`: a measured run's op costs replayed through other schedules.
"""

__all__: list[str] = []  # a layer: its modules are imported by name
