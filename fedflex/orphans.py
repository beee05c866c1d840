"""A process that ends when the process that started it is gone.

Used by the ServerApp under ``flwr run`` (server side) and by ``deploy local``'s tests;
it lives in the core so that the server side needs nothing from ``fedflex.launch``.
"""

from __future__ import annotations

import logging
import os
import threading
import time

logger = logging.getLogger(__name__)


def exit_when_orphaned(grace: float = 10.0, interval: float = 0.5) -> threading.Thread:
    """End this process ``grace`` seconds after its parent died (a daemon thread).

    For the ServerApp under ``flwr run``: its parent is the SuperLink's SuperExec, which
    ends with the SuperLink. Flower's own monitor asks the ServerApp to exit when that
    pid no longer exists, but a dead parent that nobody reaps still exists (a zombie),
    and an exit that hangs is never forced, so an orphaned ServerApp ran on for minutes,
    holding its results directory. The parent's death is seen here as re-parenting (the
    parent pid changes, at once, reaped or not); Flower's graceful exit gets ``grace``
    seconds, then the process exits with status 1 (its last checkpoint stays).
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        logger.error("the process that started this one (pid %d) is gone: exiting within %.0f s", parent, grace)
        time.sleep(grace)
        logging.shutdown()
        os._exit(1)

    thread = threading.Thread(target=watch, name="exit-when-orphaned", daemon=True)
    thread.start()
    return thread
