"""Ray for the Ray executor: imported lazily (with its install hint), and a local Ray started without a token notice."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


def import_ray():
    try:
        import ray
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError('RayExecutor needs Ray: python -m pip install -e ".[ray]" (in a clone of flsuite)') from err
    return ray


#: Ray's logger for its token-authentication notices, and the start of the one a local run drops.
_RAY_AUTH_LOGGER = "ray._private.authentication.authentication_token_setup"
_TOKEN_AUTH_ENABLED = "Token authentication is enabled for this Ray cluster."


def _drop_token_auth_enabled(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(_TOKEN_AUTH_ENABLED)


@contextlib.contextmanager
def quiet_local_token_notice(local: bool) -> Iterator[None]:
    """Drop Ray's "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out"
    warning while flsuite starts a local Ray: it tells a local user to opt out of a protection of a cluster that only
    this process uses. Ray has no option for it: its switch, RAY_AUTH_MODE, is read into Ray's cached config (set
    after `import ray`, the local start fails) and would stay in the user's environment. So a filter on Ray's logger,
    for this call only; Ray's other notices, and the same warning in a user's own `ray.init`, still show."""
    if not local:
        yield
        return
    logger = logging.getLogger(_RAY_AUTH_LOGGER)
    logger.addFilter(_drop_token_auth_enabled)
    try:
        yield
    finally:
        logger.removeFilter(_drop_token_auth_enabled)
