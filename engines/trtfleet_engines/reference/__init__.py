"""The CPU reference engine: a tiny Llama run in numpy behind a real Triton server.

``tokenizer`` is the byte-level tokenizer the tiny model was trained with; ``numpy_llama`` the
in-flight-batching forward pass (packed tokens, per-sequence KV caches, per-row multi-LoRA) that
reproduces the transformers + PEFT model, built on ``llama_weights`` (config and base weights) and
``numpy_lora`` (adapters parsed from TensorRT-LLM's ``lora_weights`` / ``lora_config`` tensors).
The trained weights and three sample PEFT adapters (``upper``, ``reverse``, ``json``) live in
``assets/`` and are regenerated only by ``hack/gen_reference_assets.py``.
"""
