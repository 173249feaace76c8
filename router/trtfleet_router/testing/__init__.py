"""Test doubles shipped with the router, for tests and benchmarks only: nothing in the router imports them.

``echo``: a Triton-gRPC/HTTP-compatible upstream with no model and TRT-LLM's real LoRA cache contract, for
measuring the router's own overhead and for fast tests of the upstream path.
"""
