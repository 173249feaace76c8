"""The reference engine's Triton ``llmapi`` mode: TRT-LLM's Python-backend ``tensorrt_llm`` llmapi model's
tensors over the same numpy tiny Llama and PEFT adapter tiers as the reference ``pytorch`` mode."""
