"""Durable batches: OpenAI's Files and Batches objects, input-line validation and the output format (pure),
over a store of blobs with a local-directory and an ``s3://`` implementation.

The router's batch runner (``trtfleet_router.batch``) executes the lines; this package holds what the
router, the operator and tools share and imports none of them.
"""
