"""Command-line entry points (python -m avsr.bin.<tool>).

Importing this package -- which every tool does before its own imports, and so before torch -- sets
``OMP_WAIT_POLICY=PASSIVE`` where the machine is shared (:func:`avsr.threads.prepare_openmp`): torch's
OpenMP runtime reads it once, when torch loads. The tools that compute set their intra-op threads later
(:func:`avsr.threads.apply_threads`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from avsr.threads import prepare_openmp

prepare_openmp()

#: the one log line format of every tool: time, logger, level, message
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


def setup_logging(path: Path | None = None) -> None:
    """Log INFO in :data:`LOG_FORMAT` to stderr and, when given, to ``path`` too (appending; its folder is
    made, and any earlier logging setup is replaced)."""
    handlers: list[logging.Handler] = [logging.StreamHandler()]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path))
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, handlers=handlers, force=path is not None)
