"""Other projects' routing policies and two naive ones, re-implemented from their sources for comparison.

Each module names the upstream code it follows (repository, file, commit). They run in the same routing framework
as trtfleet's own policies (``routing/policies``), so benchmarks compare decisions on the same fleet view; none of
them is what trtfleet recommends.
"""
