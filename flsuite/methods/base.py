"""Moved to `flsuite.federation.method` (the engine owns the contract); kept so user modules importing it still work."""

from flsuite.federation.method import ClientModule, HyperParameters, Method

__all__ = ["ClientModule", "HyperParameters", "Method"]
