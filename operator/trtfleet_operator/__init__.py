"""trtfleet's Kubernetes operator: BaseModels become engine builds and Triton fleets, Adapters become
converted artifacts with TRT-LLM task ids.

Layers (each imports only those below it; ``a | b``: neither imports the other; enforced by ``operator-layers``
in ``.importlinter``)::

    cli | jobs/                   flags; the convert, prepare and collect Jobs' entrypoints (not the operator)
    main                          kopf settings, peering, liveness, metrics endpoint
    handlers                      kopf registration (thin), the one place errors become kopf's
    holdwatch                     scale from zero: long-polls the routers for held requests
    runtime | autoscaler |        the I/O shells: observe, call a reconciler or a decision, act
    mergeadvisor
    reconcile/ | kube             pure reconcilers and decisions; the API verbs over trtfleet.kube
    builders/ | taskids |         pure Kubernetes objects (golden-tested); the task-id allocator; Prometheus
    metrics | signals             metrics; demand signals from the routers' metrics (pure)
    planning | names |            the engine tooling's planners; derived object names; status conditions;
    conditions | artifacts |      the convert Job's report; the operator's settings; log lines with context
    config | logs
    errors                        the operator's error tree

Inside ``reconcile/``: one reconciler per kind (``basemodel``, with its ``inferencepool`` step; ``adapter``, which
hands ``mode: merged`` to ``merged`` and QLoRA base variants to ``variant``), the hash-keyed build Job lifecycle
they share (``engine``), the timers' decisions (``autoscale``, ``merging``, ``deletioncost``, ``collect``), and
their shared pieces (``common``, ``serving``, ``events``, ``types``). Inside ``builders/``: ``enginebuild`` (the
engine build Job, its plan ConfigMap, the engine record), ``convert`` and ``collect`` (those Jobs), ``serving``,
``pytorch``, ``llmapi`` and ``service`` (the serving pods' objects), ``inferencepool``, ``clibundle`` and
``common``.
"""
