"""The operator's flags."""

from __future__ import annotations

import argparse

import pytest
from trtfleet_operator.cli import config_from_args, configure


def test_cli_flags() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(
        [
            "--namespace",
            "a",
            "-n",
            "b",
            "--engine-pvc",
            "e",
            "--build-retry-delay",
            "5",
            "--convert-node-selector",
            "pool=cpu",
        ]
    )
    config = config_from_args(args)
    assert args.namespace == ["a", "b"] and config.storage.engine_pvc == "e"
    assert config.build.retry_base_s == 5 and config.convert_node_selector == (("pool", "cpu"),)
    with pytest.raises(SystemExit):
        parser.parse_args(["--namespace", "a", "--all-namespaces"])
