"""Log lines with their structured context: ``extra={...}`` fields are appended as ``key=value``."""

from __future__ import annotations

import logging

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
_KOPF = {"k8s_ref", "k8s_skip", "settings"}
"""kopf's own extras: the object reference is in kopf's message already, the settings are noise."""


class ContextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = {k: v for k, v in vars(record).items() if k not in _STANDARD | _KOPF and not k.startswith("_")}
        return line + "".join(f" {k}={v!r}" for k, v in sorted(context.items())) if context else line


def configure(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(ContextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
