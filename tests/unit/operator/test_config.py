"""The operator's settings: build retries, images from the environment."""

from __future__ import annotations

import pytest
from trtfleet_operator.config import BuildPolicy, Images
from trtfleet_operator.errors import (
    ConfigError,
)


def test_build_retry_delay_doubles_and_is_capped() -> None:
    policy = BuildPolicy(retry_base_s=60, retry_max_s=300)
    assert [policy.retry_delay_s(a) for a in (1, 2, 3, 4)] == [60, 120, 240, 300]


def test_images_from_the_environment_and_the_removed_runtime_image_refused() -> None:
    images = Images.from_env({"TRTFLEET_WORKER_IMAGE": "w:1", "TRTFLEET_MODELOPT_IMAGE": "m:1"})
    assert (images.worker, images.modelopt) == ("w:1", "m:1")
    assert Images.from_env({}).modelopt is None
    with pytest.raises(ConfigError, match="TRTFLEET_RUNTIME_IMAGE no longer exist"):
        Images.from_env({"TRTFLEET_RUNTIME_IMAGE": "ghcr.io/trtfleet/trtllm-runtime:1"})
