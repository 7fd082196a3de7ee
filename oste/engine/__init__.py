"""The dispatch engine: long-running services on the dispatch Store contract.

``Engine`` is all a process needs: ``Engine(config)``, ``await start()``, ``notify_due(when)``,
``await stop(grace)``; ``await drain()`` fires everything due now (tests, scripts).
"""

from oste.engine.config import EngineConfig
from oste.engine.runtime import DrainResult, Engine

__all__ = ["DrainResult", "Engine", "EngineConfig"]
