"""PEFT LoRA adapters -> TensorRT-LLM's runtime LoRA format, and what they cost in the LoRA cache.

``peft`` reads and validates PEFT directories (torch-free), ``convert`` produces
``model.lora_weights.npy`` / ``model.lora_config.npy`` exactly as NVIDIA's converter does (with the
checks it lacks), ``manifest`` records sha256s, ``inspect`` reports rank, modules and cache pages,
``cli`` is ``trtfleet lora``. Errors: ``errors.LoraConversionError`` and its subclasses.
"""
