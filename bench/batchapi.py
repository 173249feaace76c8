"""The bench's side of the OpenAI Batch API, through the official client: the input file, upload and create, wait
for an end."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from typing import Any, Final

from bench.batchscenario import BatchScenario
from bench.traces import prompt_text

BATCH_WAIT_S: Final = 3600.0


def batch_input(scenario: BatchScenario, names: Sequence[str]) -> bytes:
    rng = random.Random(scenario.seed)
    rows = []
    for index in range(scenario.lines):
        body = {
            "model": rng.choice(list(names)),
            "prompt": prompt_text(f"batch-{index}", scenario.prompt_tokens),
            "max_tokens": scenario.max_tokens,
            "temperature": 0,
        }
        rows.append({"custom_id": f"line-{index}", "method": "POST", "url": "/v1/completions", "body": body})
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def start_batch(base_url: str, data: bytes) -> tuple[Any, str]:
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=120)
    upload = client.files.create(file=("bench.jsonl", data), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/completions", completion_window="24h")
    return client, batch.id


def wait_batch(client: Any, batch_id: str) -> Any:
    deadline = time.monotonic() + BATCH_WAIT_S
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        if time.monotonic() > deadline:
            raise RuntimeError(f"batch {batch_id} still {batch.status} after {BATCH_WAIT_S} s")
        time.sleep(0.5)
