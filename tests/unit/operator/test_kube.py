"""The operator's API paths."""

from __future__ import annotations

from trtfleet_operator.kube import object_path


def test_object_paths() -> None:
    assert object_path("batch/v1", "Job", "ns", "j") == "/apis/batch/v1/namespaces/ns/jobs/j"
    assert object_path("v1", "Pod", "ns", "p") == "/api/v1/namespaces/ns/pods/p"
