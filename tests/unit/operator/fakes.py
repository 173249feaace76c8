"""In-memory stand-ins for the API server behind the operator's Protocols, for unit tests of its shells.

:class:`FakeKube` implements :class:`trtfleet_operator.runtime.KubeVerbs` with the API server's rules that the
runtime relies on: objects keyed by path, label selectors (``k=v`` and ``k in (a,b)``), a resourceVersion
bumped by every write, a merge patch carrying a stale resourceVersion refused with 409, a delete with a uid
precondition that only removes that object. It records every call in order, and fails the calls a test names
(once each).
:class:`CounterStore` implements :class:`trtfleet_operator.taskids.TaskIdStore` the same way.
"""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trtfleet_operator.errors import ConflictError, KubeError, NotFoundError
from trtfleet_operator.kube import path_of

Obj = dict[str, Any]


@dataclass(frozen=True)
class Call:
    verb: str
    """get, serves, list, apply, patch, patch-status, delete or event."""
    path: str
    body: Any = None


def _merge_patch(target: Obj, patch: Mapping[str, Any]) -> Obj:
    """RFC 7386: maps merge, None removes, anything else replaces."""
    out = copy.deepcopy(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge_patch(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


_TERM = re.compile(r"\s*([^,=\s]+)\s*(?:=\s*([^,]*)|\s+in\s+\(([^)]*)\))\s*(?:,|$)")


def _selected(obj: Obj, selector: str | None) -> bool:
    """Whether ``obj``'s labels match ``selector`` (terms ``k=v`` and ``k in (a,b)``, all of them)."""
    labels = obj["metadata"].get("labels") or {}
    for key, value, values in _TERM.findall(selector or ""):
        allowed = {v.strip() for v in values.split(",")} if values else {value}
        if labels.get(key) not in allowed:
            return False
    return True


@dataclass
class FakeKube:
    objects: dict[str, Obj] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    served: set[tuple[str, str]] = field(default_factory=set)
    """``(api version, plural)`` the fake's discovery lists beyond the built-in kinds (CRDs installed)."""
    failures: dict[tuple[str, str], KubeError] = field(default_factory=dict)
    """``(verb, path)`` -> the error the next such call raises (once)."""
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(100))

    def put(self, obj: Obj) -> Obj:
        """Store ``obj`` as the API server would (uid, resourceVersion); returns the stored copy."""
        stored = copy.deepcopy(obj)
        meta = stored["metadata"]
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta["resourceVersion"] = str(next(self._versions))
        self.objects[path_of(stored)] = stored
        return copy.deepcopy(stored)

    def _call(self, verb: str, path: str, body: Any = None) -> None:
        self.calls.append(Call(verb, path, copy.deepcopy(body)))
        error = self.failures.pop((verb, path), None)
        if error is not None:
            raise error

    def verbs(self) -> list[tuple[str, str]]:
        return [(c.verb, c.path) for c in self.calls]

    async def get(self, path: str) -> Obj | None:
        self._call("get", path)
        obj = self.objects.get(path)
        return copy.deepcopy(obj) if obj is not None else None

    async def serves(self, api_version: str, plural: str) -> bool:
        self._call("serves", f"/apis/{api_version}")
        return (api_version, plural) in self.served

    async def apply(self, obj: Mapping[str, Any]) -> Obj:
        path = path_of(obj)
        self._call("apply", path, obj)
        old = self.objects.get(path)
        merged = copy.deepcopy(dict(obj))
        if old is not None:
            merged["metadata"]["uid"] = old["metadata"]["uid"]
            merged.setdefault("status", old.get("status"))
        return self.put(merged)

    async def patch_merge(self, path: str, patch: Mapping[str, Any], *, status: bool = False) -> Obj:
        self._call("patch-status" if status else "patch", path, patch)
        old = self.objects.get(path)
        if old is None:
            raise NotFoundError(404, "NotFound", path)
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != old["metadata"]["resourceVersion"]:
            raise ConflictError(409, "Conflict", "the object has been modified")
        return self.put(_merge_patch(old, patch))

    async def delete(self, path: str, *, uid: str | None = None, propagation: str = "Background") -> bool:
        self._call("delete", path, {"uid": uid})
        old = self.objects.get(path)
        if old is None or (uid is not None and old["metadata"]["uid"] != uid):
            return False
        del self.objects[path]
        return True

    async def event(self, involved: Mapping[str, Any], *, type_: str, reason: str, message: str, now: str) -> None:
        self._call("event", path_of(involved), {"type": type_, "reason": reason, "message": message, "now": now})

    async def list(self, path: str, *, label_selector: str | None = None) -> list[Obj]:
        self._call("list", path, label_selector)
        return [
            copy.deepcopy(obj)
            for key, obj in sorted(self.objects.items())
            if key.rsplit("/", 1)[0] == path and _selected(obj, label_selector)
        ]


@dataclass
class CounterStore:
    """``status.nextTaskId`` per BaseModel, with a version bumped by every write (compare-and-swap)."""

    next_ids: dict[tuple[str, str], int] = field(default_factory=dict)
    versions: dict[tuple[str, str], int] = field(default_factory=dict)
    reads: int = 0

    async def read_next_task_id(self, namespace: str, basemodel: str) -> tuple[int | None, str]:
        self.reads += 1
        key = (namespace, basemodel)
        return self.next_ids.get(key), str(self.versions.get(key, 1))

    async def write_next_task_id(self, namespace: str, basemodel: str, resource_version: str, value: int) -> None:
        key = (namespace, basemodel)
        if resource_version != str(self.versions.get(key, 1)):
            raise ConflictError(409, "Conflict", "the object has been modified")
        self.next_ids[key] = value
        self.versions[key] = self.versions.get(key, 1) + 1
