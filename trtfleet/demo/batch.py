"""The demo's batch example (pure): an OpenAI Batch API round trip against the demo's router, whose
batch store is a directory in the demo's work directory."""

from __future__ import annotations

import json
from collections.abc import Sequence


def batch_example(base_url: str, models: Sequence[str], prompt: str, max_tokens: int) -> list[str]:
    """Lines of a Python snippet: one request line per model, uploaded, run as a batch, read back."""
    rows = [
        {
            "custom_id": f"{model}-1",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
        }
        for model in models
    ]
    lines = "".join(json.dumps(row) + "\n" for row in rows)
    return [
        "  import time",
        "  from openai import OpenAI",
        f'  client = OpenAI(base_url="{base_url}/v1", api_key="unused")',
        f"  upload = client.files.create(file=('requests.jsonl', {lines!r}.encode()), purpose='batch')",
        "  batch = client.batches.create(input_file_id=upload.id, endpoint='/v1/completions', completion_window='24h')",
        "  while (batch := client.batches.retrieve(batch.id)).status not in ('completed', 'failed', 'cancelled'):",
        "      time.sleep(1)",
        "  print(client.files.content(batch.output_file_id).text)",
    ]
