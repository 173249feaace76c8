"""The errors of :mod:`trtfleet.batch`; the router maps them onto OpenAI error bodies in one place.

::

    BatchLayerError            anything this package raises
    ├── StoreError             the store could not be read or written (I/O, S3 answers, bad URI)
    ├── NotFound               no file or batch with this id
    └── InvalidBatchRequest    a create / upload / cancel request that OpenAI would refuse (``param`` names
                               the field; ``code`` is OpenAI's error code when it has one)
"""

from __future__ import annotations


class BatchLayerError(Exception):
    """Base of every error :mod:`trtfleet.batch` raises."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class StoreError(BatchLayerError):
    """A store operation failed."""


class NotFound(BatchLayerError):
    """No object with this id."""


class InvalidBatchRequest(BatchLayerError):
    """The request is invalid."""
