"""Derived object names and label values."""

from __future__ import annotations

import pytest
from trtfleet_operator.names import dns_label, engine_hash_label, hash16, label_value


@pytest.mark.parametrize(
    ("name", "ok"),
    [("llama3-8b", True), ("Llama_3", False), ("3llama", False), ("x" * 63, True), ("x" * 64, False)],
)
def test_dns_label(name: str, ok: bool) -> None:
    out = dns_label(name)
    assert (out == name) is ok
    assert len(out) <= 63 and out[0].isalpha() and out == dns_label(name)


def test_label_values_and_hashes() -> None:
    full = "9b7bc2b52787f3bde86ae741e34ccf8a6a14ab6e0dabfdb5bf4aa116d8e10e30"
    assert engine_hash_label(full) == hash16(full) == full[:16]
    assert label_value("sql") == "sql"
    long = label_value("a" * 100)
    assert len(long) <= 63 and long == label_value("a" * 100) and long != label_value("a" * 101)
