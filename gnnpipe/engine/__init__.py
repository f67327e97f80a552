"""The math of one training epoch, independent of where it runs (no Dask here):

- :mod:`~gnnpipe.engine.graph` and :mod:`~gnnpipe.engine.message_passing`: normalised
  adjacency, chunk rows and PyG message passing on full graphs, chunks and halos;
  :mod:`~gnnpipe.engine.state`: an engine's model and Adam state as checkpoint shards hold them;
  :mod:`~gnnpipe.engine.memory`: the peak memory a run adds to its process, measured alike in
  every mode;
- :mod:`~gnnpipe.engine.single`: the exact full-graph epoch;
- :mod:`~gnnpipe.engine.chunked`: GNNPipe's chunked epoch (historical embeddings) of one stage,
  :mod:`~gnnpipe.engine.buffers` its full-graph buffers;
  :mod:`~gnnpipe.engine.driver`: the one epoch loop every mode runs (``EpochProgram``);
- :mod:`~gnnpipe.engine.local`: every stage in one process; :mod:`~gnnpipe.engine.probe`: what
  a stack's blocks aggregate.
"""

__all__: list[str] = []  # a layer: its modules are imported by name
