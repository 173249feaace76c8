"""trtfleet's adapter-aware router: OpenAI and Triton front ends over a fleet of Triton pods.

Layers (imports only go down; ``a | b``: neither imports the other; enforced by ``router-layers`` in
``.importlinter``; the router never imports ``trtfleet_engines`` or ``trtfleet_operator``)::

    cli                           flags and subcommands
    app                           wiring, servers, background loops, graceful drain
    batch/ | epp/                 batches run through the router's own OpenAI path (store and runner:
                                  trtfleet.batch); the Gateway API endpoint picker (Envoy ext_proc)
    server/                       OpenAI HTTP, Triton HTTP, Triton gRPC, batch HTTP, API keys, SSE framing
    upstream/ | peering/ |        dispatcher (admission, attempts over one Transport, miss recovery), health checks,
    discovery/ | warmstart |      prewarming; replicas sharing residency; static file / Kubernetes; warm scale-up;
    placementloop                 re-planning host copies of adapters and pushing the due prefetches
    liveview | weights            the registry plus one Fleet per base model; the weight store
    models_registry | metrics     served names -> base model / adapter; Prometheus metrics
    chat | activity |             chat templates; adapters active in a window; event-loop metrics; orjson
    loopmetrics | jsoncodec
    errors | routing/ | logs |    the error tree and its mapping; the pure routing core (no I/O); JSON logs;
    internalaccess                who may use the internal endpoints (the peer port, /debug)

``testing/`` holds test doubles (the echo upstream) for tests and benchmarks; nothing in the router imports it.

A request: a front end parses and validates it, resolves ``model`` in the registry (API key check), checks engine
limits, and hands the dispatcher an :class:`~trtfleet_router.upstream.call.UpstreamCall` whose payload is the request
in one form. The dispatcher's admission asks the base model's :class:`~trtfleet_router.routing.fleet.Fleet` for a pod
(waiting for capacity or a ready pod when there is none), the first transport that carries the attempt sends it
(with the adapter's weights when that pod is cold), the pod's answer streams back, and a LoRA cache miss or a
failing pod is recovered before anything reached the client. The endpoint picker decides the same way and lets the
gateway carry the request. docs/architecture.md walks through where each step lives.
"""
