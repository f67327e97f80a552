"""Where training runs: Dask clusters, torch.distributed communication, one module per mode."""
