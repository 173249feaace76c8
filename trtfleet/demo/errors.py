"""The demo's errors, mapped to exit codes in :func:`trtfleet.demo.run` and nowhere else.

``DemoError``
  ``StartupError``     a step failed or timed out (a child exited, a port never answered); carries the
                       tail of the relevant logs
  ``RequestError``     a request to the running demo failed (``--once``)
  ``DemoInterrupted``  SIGINT / SIGTERM arrived while starting: stop quietly
"""

from __future__ import annotations


class DemoError(Exception):
    """Root of the demo's errors."""


class StartupError(DemoError):
    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message)
        self.log_tail = log_tail


class RequestError(DemoError):
    """A request to the router failed."""


class DemoInterrupted(DemoError):
    def __init__(self) -> None:
        super().__init__("interrupted")
