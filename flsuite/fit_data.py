"""The Federation `flsuite fit` runs, built from its parsed config (`build_federation`), with the feature cache's index
consulted first (`fit_federation`): a build the index holds as already embedded is served from the cache files."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import yaml
from jsonargparse import ArgumentParser, Namespace

from flsuite.data import cache_index  # stats and JSON only

if TYPE_CHECKING:
    from flsuite.federation.run import Federation

__all__ = ["build_federation", "fit_federation"]

log = logging.getLogger("flsuite")


def build_federation(parser: ArgumentParser, cfg: Namespace) -> Federation:
    import inspect

    from flsuite.federation.run import Federation

    init = parser.instantiate(cfg)
    names = [p for p in inspect.signature(Federation.__init__).parameters if p != "self"]
    return Federation(**{name: init[name] for name in names})


def fit_federation(parser: ArgumentParser, cfg: Namespace, config_yaml: str) -> Federation:
    """The run's Federation. When the feature cache's index holds its data as already embedded and unchanged
    (`flsuite.data.cache_index`: the same entry `flsuite features` answers from, with the pools it read), its data
    source is built without its encoder and serves the build from the cache files (`Benchmark.use_index`): no image
    decoded, no encoder built; the log says so. Anything changed is a miss: the build runs as before."""
    start = time.perf_counter()
    resolved = yaml.safe_load(config_yaml) or {}
    cache_dir = cache_index.resolved_cache_dir(resolved) if isinstance(resolved.get("data"), dict) else None
    hit = cache_index.lookup(cache_dir, cache_index.request_key(resolved)) if cache_dir is not None else None
    if cache_dir is None or hit is None or not hit.pools:
        if cache_dir is not None and (resolved["data"].get("init_args") or {}).get("encoder") is not None:
            log.info(
                "feature cache index: no unchanged entry for this data in %s; "
                "building it (the cache serves what it holds)",
                cache_dir,
            )
        return build_federation(parser, cfg)
    lean = cfg.clone()
    if "data.init_args.encoder" in lean:
        lean["data.init_args.encoder"] = None  # built only should the index prove stale
    federation = build_federation(parser, lean)

    def encoder() -> Any:
        data: Any = build_federation(parser, cfg).data
        return data.encoder

    use_index = getattr(federation.data, "use_index", None)
    if use_index is None or not use_index(hit.pools, encoder=encoder):
        return build_federation(parser, cfg)
    log.info(
        "already embedded (feature cache index): %s images, %s, decided in %.2f s; "
        "building the data from the cache files (no image decoded, no encoder built)",
        f"{hit.images:,}",
        hit.cache_dir,
        time.perf_counter() - start,
    )
    return federation
