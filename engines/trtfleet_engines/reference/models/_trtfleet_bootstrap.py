"""Make the worker's packages importable in the Triton Python backend stub (imported first by every model).

The stub's embedded interpreter ignores ``PYTHONPATH``; ``trtfleet worker`` / ``start_worker`` put this
interpreter's import roots in ``TRTFLEET_WORKER_SITE_DIRS`` instead. ``site.addsitedir`` also runs their
``.pth`` files (an editable install's finder), and the roots go first so the worker's numpy wins over
whatever the stub's base interpreter has. Without the variable (an image with trtfleet installed in the
stub's own Python) this does nothing.
"""

from __future__ import annotations

import os
import site
import sys

SITE_DIRS_ENV = "TRTFLEET_WORKER_SITE_DIRS"


def add_site_dirs() -> None:
    before = list(sys.path)
    for directory in os.environ.get(SITE_DIRS_ENV, "").split(os.pathsep):
        if directory and directory not in before:
            site.addsitedir(directory)
    added = [path for path in sys.path if path not in before]
    sys.path[:] = added + before


add_site_dirs()
