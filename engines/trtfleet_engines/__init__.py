"""trtfleet's engine tooling: build plans, engine hashes, capacity planning, Triton repositories, builds.

Layers (each imports only those below it; ``a | b``: neither imports the other; enforced by ``engines-layers``
in ``.importlinter``)::

    cli | reference/              ``trtfleet engines``; the CPU reference engine (numpy Llama behind Triton)
    runner | pytorch/             execute a plan and publish the engine; the trtllm-serve runtime's planning
    plan | capacity               spec -> build plan and engine hash; does the engine fit a GPU
    buildplan | triton/ | lora/   a plan as data; config.pbtxt rendering; PEFT -> TRT-LLM LoRA conversion
    speculation                   speculative decoding: what each TRT-LLM release takes, the draft's fit and cost
    constraints | storage |       what the pinned TRT-LLM builds; where engines are published; model
    modeldims                     dimensions
    gpus                          the GPU table
    errors                        the engine tooling's error tree
"""
