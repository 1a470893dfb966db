"""flsuite: federated learning experiments on heterogeneous clients."""

__version__ = "0.1.0"
