"""Where training runs: Dask clusters and torch.distributed communication.

From the bottom: the worker environment, rendezvous and placement; the rank's job
(:mod:`~gnnpipe.runtime.spec`), communication (:mod:`~gnnpipe.runtime.comm`) and clusters
(:mod:`~gnnpipe.runtime.cluster`); one program per mode (:mod:`~gnnpipe.runtime.pipeline`,
:mod:`~gnnpipe.runtime.graph`, :mod:`~gnnpipe.runtime.hybrid`); what every rank does
(:mod:`~gnnpipe.runtime.rank`); launching the ranks (:mod:`~gnnpipe.runtime.launch`); the
run's handle (:mod:`~gnnpipe.runtime.handle`); and starting a job
(:mod:`~gnnpipe.runtime.start`).
"""

__all__: list[str] = []  # a layer: its modules are imported by name
