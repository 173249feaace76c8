"""trtfleet's engine tooling: build plans, engine hashes, capacity planning, Triton repositories, builds.

Modules: :mod:`~trtfleet_engines.plan` (spec -> build plan, engine hash), :mod:`~trtfleet_engines.gpus`
(GPU table), :mod:`~trtfleet_engines.modeldims` (model dimensions), :mod:`~trtfleet_engines.capacity`
(does it fit), :mod:`~trtfleet_engines.triton` (config.pbtxt rendering), :mod:`~trtfleet_engines.runner`
and :mod:`~trtfleet_engines.storage` (executing plans, atomic publishing), :mod:`~trtfleet_engines.cli`
(``trtfleet engines``). Errors: :mod:`~trtfleet_engines.errors`.
"""
