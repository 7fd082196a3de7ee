"""The process's Prometheus set-up, done once by the composition root (``oste.server``) for every
process kind: no ``*_created`` series (they doubled the output and no query uses them), and
``oste_build_info{version=…}`` = 1, to tell which version each scraped process runs."""

from __future__ import annotations

import functools

from prometheus_client import Gauge, disable_created_metrics

from oste import __version__


@functools.cache
def set_up() -> Gauge:
    """Turn the ``*_created`` series off and export ``oste_build_info`` (once per process; later calls
    return the same gauge)."""
    disable_created_metrics()
    info = Gauge(
        "oste_build_info",
        "Always 1; its label says which OSTE version this process runs.",
        ["version"],
    )
    info.labels(version=__version__).set(1)
    return info
