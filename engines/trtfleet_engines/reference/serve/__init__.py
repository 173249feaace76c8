"""The CPU reference engine's ``pytorch`` mode: trtllm-serve's HTTP contract over the tiny numpy Llama.

What a ``trtllm-serve`` pod of TensorRT-LLM's PyTorch backend answers, without a GPU: OpenAI completions and
chat (streaming and not) with ``lora_request {lora_name, lora_int_id, lora_path}`` naming a PEFT directory the
server reads itself; ``lora_int_id`` as the cache key of a two-tier LoRA cache (device ``max_loras``, host
``max_cpu_loras``) with LRU eviction of adapters no request uses; requests wait, not fail, while their
adapter cannot get device pages; the health, version, model list and metrics routes; upstream's status codes
and error bodies. The engine underneath is the Triton reference engine's own batcher, model, sampling and
tokenizer, so both runtimes give the same greedy outputs for the sample adapters.

Modules: ``settings`` (flags and the options YAML), ``protocol`` (request bodies, response shapes),
``adapters`` (PEFT loading, tiers, admission), ``bridge`` (engine thread <-> asyncio), ``generation`` (one
request's phases), ``metrics`` (Prometheus), ``app`` (routes and the one place errors become statuses).
Run it with ``python -m trtfleet_engines.reference.serve [MODEL_DIR] --port 8000 --config options.yaml``.

Error tree: ``settings.SettingsError`` (cannot start), ``adapters.AdapterLoadError`` (an adapter that does not
load), ``generation.RequestError`` (a refused request, with its status); engine-side failures are the reference
engine's ``RequestRejected`` family (``trtfleet_engines.reference.errors``).
"""
