"""trtfleet's adapter-aware router: OpenAI and Triton front ends over a fleet of Triton pods.

Layers (imports only go down; the router never imports ``trtfleet_engines`` or ``trtfleet_operator``)::

    cli, app                      wiring, servers, background loops, graceful drain
    server/                       OpenAI HTTP, Triton HTTP, Triton gRPC, API keys, SSE framing
    upstream/                     dispatcher (route, weights, miss recovery, retries), channels, scraping
    discovery/                    static fleet file / flags, Kubernetes watches
    fleets, models_registry,      the live view: served names -> base model / adapter, one Fleet per base
    weights, chat, metrics        weight store, chat templates, Prometheus metrics
    errors                        the error tree and its HTTP / gRPC / OpenAI mapping (one table)
    routing/                      the pure routing core (decisions and shadow caches; no I/O)

A request: a front end parses and validates it, resolves ``model`` in the registry (API key check),
checks engine limits, and hands a ``ModelInferRequest`` for the base model's text-level upstream model
to the dispatcher, which asks the base model's :class:`~trtfleet_router.routing.fleet.Fleet` for a pod,
attaches the adapter's weights when that pod is cold, streams the pod's answer back, and recovers a
LoRA cache miss or a failing pod before anything reached the client.
"""
