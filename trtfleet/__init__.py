"""trtfleet: a Kubernetes control plane for Triton + TensorRT-LLM multi-LoRA fleets.

``trtfleet.api`` holds the API types shared by every component; the components
live in their own packages: ``trtfleet_engines`` (engine plans, Triton configs,
capacity, adapter conversion, CPU reference engine), ``trtfleet_router`` and
``trtfleet_operator``.
"""

from trtfleet.version import __version__

__all__ = ["__version__"]
