"""trtfleet's Kubernetes operator: BaseModels become engine builds and Triton fleets, Adapters become
converted artifacts with TRT-LLM task ids.

Layers (each imports only those below it):

* ``cli``, ``main``, ``handlers`` - flags, kopf settings and registration (thin);
* ``runtime`` - the I/O shell: observe, call a reconciler, act; ``kube`` - the API verbs over :mod:`trtfleet.kube`;
  ``taskids`` - the compare-and-swap allocator; ``metrics``;
* ``reconcile`` - pure reconcilers (spec + observed objects -> objects, status, events);
* ``builders`` - pure, deterministic Kubernetes objects (golden-tested); ``planning`` - the engine
  tooling's planners; ``names``, ``conditions``, ``artifacts``, ``config``, ``errors``.

``jobs.convert`` is not part of the operator process: it is the entrypoint of the adapter-convert Job.
"""
