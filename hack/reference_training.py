"""The training side of hack/gen_reference_assets.py: the tasks (echo, upper, reverse, json), random
prompts and batches over the byte vocabulary, the training loop with its base-model curriculum, and greedy
decoding / last-position logits / exact-match accuracy of the real torch model.

Imported by hack/gen_reference_assets.py and hack/gen_qlora_adapter.py (through it); needs the fixture venv
(torch + transformers), never the tests.
"""

from __future__ import annotations

import json
import math
import random
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engines"))

from trtfleet_engines.reference.tokenizer import EOS_ID, PAD_ID, decode, encode, prompt_ids

MAX_PROMPT_CHARS = 48
ALPHABET = string.ascii_lowercase
# Mixed prompts are still mostly lowercase: each character is lowercase with probability ~0.6.
MIXED_ALPHABET = string.ascii_lowercase * 3 + string.ascii_uppercase + string.digits + "{}\":,.!?-'"
BASE_MIXED_FRACTION = 0.3
BASE_LOWERCASE_SHARE = 0.4  # of the base model's steps, before mixed prompts start
MAX_NEW_TOKENS = MAX_PROMPT_CHARS + 16

TASKS: dict[str, Callable[[str], str]] = {
    "base": lambda p: p,
    "upper": str.upper,
    "reverse": lambda p: p[::-1],
    "json": lambda p: json.dumps({"echo": p}),
}


def log(message: str) -> None:
    print(f"[gen-reference-assets] {message}", file=sys.stderr, flush=True)


def random_prompt(rng: random.Random, max_chars: int = MAX_PROMPT_CHARS, alphabet: str = ALPHABET) -> str:
    """Words (1-8 characters of ``alphabet``) joined by single spaces, 1..max_chars characters."""
    target = rng.randint(1, max_chars)
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < target:
        words.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))))
    return " ".join(words)[:target].strip() or rng.choice(alphabet)


def make_batch(
    rng: random.Random, task: str, batch_size: int, mixed_fraction: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    seqs = []
    for _ in range(batch_size):
        mixed = rng.random() < mixed_fraction
        p = random_prompt(rng, alphabet=MIXED_ALPHABET if mixed else ALPHABET)
        seqs.append((prompt_ids(p), [*encode(TASKS[task](p)), EOS_ID]))
    width = max(len(a) + len(b) for a, b in seqs)
    ids = torch.full((batch_size, width), PAD_ID, dtype=torch.long)
    labels = torch.full((batch_size, width), -100, dtype=torch.long)
    for row, (prompt, answer) in enumerate(seqs):
        full = prompt + answer
        ids[row, : len(full)] = torch.tensor(full)
        labels[row, len(prompt) : len(full)] = torch.tensor(answer)
    return ids, labels


def train(model: torch.nn.Module, task: str, *, steps: int, lr: float, batch_size: int, seed: int) -> None:
    rng = random.Random(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup))) * 0.95 + 0.05

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    start = time.monotonic()
    for step in range(steps):
        # Curriculum for the base model: plain lowercase echo until the copy circuit has formed, then also
        # mixed-case text with digits and punctuation, so the embeddings and lm_head rows of every character
        # an adapter writes (upper case, {"}:) are trained: a LoRA adapter alone cannot make an untrained
        # token id likely.
        mixed = BASE_MIXED_FRACTION if task == "base" and step >= steps * BASE_LOWERCASE_SHARE else 0.0
        ids, labels = make_batch(rng, task, batch_size, mixed)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        if step % 200 == 0 or step == steps - 1:
            log(f"{task}: step {step}/{steps} loss {loss.item():.4f} ({time.monotonic() - start:.0f} s)")
    model.eval()


@torch.no_grad()
def greedy(model: torch.nn.Module, prompt: str, max_new_tokens: int = MAX_NEW_TOKENS) -> list[int]:
    """Greedy decoding with the real model (KV cache, one sequence, no padding); new ids without EOS."""
    ids = torch.tensor([prompt_ids(prompt)])
    out = model(input_ids=ids, use_cache=True)
    past, generated = out.past_key_values, []
    for _ in range(max_new_tokens):
        token = int(out.logits[0, -1].argmax())
        if token == EOS_ID:
            break
        generated.append(token)
        out = model(input_ids=torch.tensor([[token]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
    return generated


@torch.no_grad()
def last_logits(model: torch.nn.Module, prompt: str) -> list[float]:
    logits = model(input_ids=torch.tensor([prompt_ids(prompt)])).logits[0, -1]
    return [float(x) for x in logits.float().numpy()]


def accuracy(model: torch.nn.Module, task: str, prompts: list[str]) -> float:
    hits = sum(decode(greedy(model, p)) == TASKS[task](p) for p in prompts)
    return hits / len(prompts)
