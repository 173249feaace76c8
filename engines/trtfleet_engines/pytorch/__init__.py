"""TensorRT-LLM's PyTorch backend (``trtllm-serve``) as a trtfleet runtime: pure planning pieces.

* :mod:`~trtfleet_engines.pytorch.options` renders the LLM-API options YAML (``trtllm-serve --config``);
* :mod:`~trtfleet_engines.pytorch.capacity` plans one GPU's memory (weights, KV cache, LoRA tiers sized as
  ``lora_config.max_loras`` / ``max_cpu_loras``);
* :mod:`~trtfleet_engines.pytorch.serving` builds the pod's ``trtllm-serve`` argv, its probes and the
  prepare step (checkpoint staging, optional ModelOpt quantization) as data.

Nothing here does I/O. Every upstream fact these modules build on is listed, with the TensorRT-LLM file
and commit it was read at, in ``docs/design/pytorch-backend.md``. Errors are the engine tooling's tree
(:mod:`trtfleet_engines.errors`): a spec the PyTorch backend cannot serve raises ``UnsupportedError``;
capacity problems are returned in the plan, not raised.
"""
