"""The Gateway API endpoint picker: a router process answering an InferencePool's gateway over Envoy's ext_proc.

``envoy`` (the protocol's messages), ``request`` (what a gateway's request becomes), ``coldloads`` (weights pushed
before a request that cannot carry them), ``exchange`` (one request's stream), ``server`` (the port and its health).
"""
