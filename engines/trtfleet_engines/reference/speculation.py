"""Speculative decoding in the reference engine: the n-gram (prompt-lookup) drafter, the runtime controls and the
acceptance counters, as TensorRT-LLM's PyTorch backend has them (pure, no clock).

The settings are the LLM-API ``speculative_config`` (:func:`SpeculationSettings.from_config`): the same keys on
the trtllm-serve face (``--config``) and, as JSON in ``reference_speculative_config``, on the Triton face.

* :class:`NGramPool` - upstream's ``NGramDecodingConfig``: every n-gram of a sequence (up to
  ``max_matching_ngram_size`` tokens) maps to the positions that followed it; a request's draft is what followed
  the longest suffix of its own text that occurred before (``is_use_oldest``: its first occurrence, else the
  latest; ``is_keep_all`` false keeps one occurrence per n-gram; ``is_public_pool``: one pool for every request,
  so a draft may come from another request's text). Drafts are read from the source sequence at proposal time, so
  a continuation grows as that sequence does.
* :class:`Speculator` - the draft length a step allows (``max_concurrency`` / ``draft_len_schedule`` by active
  requests; 0 for good once the rolling acceptance over ``acceptance_rate_window_size`` speculating iterations falls
  below ``acceptance_rate_threshold``), the drafts, and the counters upstream exports: drafted and accepted
  tokens, requests with drafts and the acceptance length (tokens a step gave a request that drafted), plus a
  per-adapter breakdown upstream does not have.

The batcher verifies a draft in the same step as the request's last token (one row of ``1 + k`` tokens) and
keeps the longest prefix the model's own greedy choice agrees with, plus that choice: greedy output is unchanged.
Only greedy requests draft (upstream's exact-match verification); sampled ones decode one token a step.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

NGRAM = "NGram"
MODES = (NGRAM,)
PUBLIC_POOL_SEQUENCES = 256
"""Finished sequences a public pool keeps drafting from (the oldest are forgotten first)."""


class UnsupportedModeError(ValueError):
    """A ``decoding_type`` upstream has and the reference engine does not draft with (it then runs without
    speculation: greedy outputs are the same either way)."""


@dataclass(frozen=True)
class SpeculationSettings:
    mode: str
    max_draft_len: int
    max_matching_ngram_size: int = 2
    is_public_pool: bool = True
    is_keep_all: bool = True
    is_use_oldest: bool = True
    max_concurrency: int | None = None
    draft_len_schedule: tuple[tuple[int, int], ...] = ()
    acceptance_rate_window_size: int = 0
    acceptance_rate_threshold: float | None = None
    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> SpeculationSettings:
        """Parse a ``speculative_config`` mapping; ``ValueError`` names the key that cannot be used."""
        mode = config.get("decoding_type")
        if mode not in MODES:
            raise UnsupportedModeError(f"speculative_config.decoding_type {mode!r}: the reference engine drafts with "
                             f"{' or '.join(MODES)}")
        schedule = config.get("draft_len_schedule") or {}
        if not isinstance(schedule, Mapping):
            raise ValueError("speculative_config.draft_len_schedule must map batch sizes to draft lengths")
        settings = cls(
            mode=str(mode),
            max_draft_len=_positive(config.get("max_draft_len"), "max_draft_len"),
            max_matching_ngram_size=_positive(config.get("max_matching_ngram_size", 2), "max_matching_ngram_size"),
            is_public_pool=_flag(config.get("is_public_pool", True), "is_public_pool"),
            is_keep_all=_flag(config.get("is_keep_all", True), "is_keep_all"),
            is_use_oldest=_flag(config.get("is_use_oldest", True), "is_use_oldest"),
            max_concurrency=None if config.get("max_concurrency") is None else _positive(
                config.get("max_concurrency"), "max_concurrency"),
            draft_len_schedule=tuple(sorted((int(k), int(v)) for k, v in schedule.items())),
            acceptance_rate_window_size=int(config.get("acceptance_rate_window_size") or 0),
            acceptance_rate_threshold=None if config.get("acceptance_rate_threshold") is None else float(
                config["acceptance_rate_threshold"]),
        )
        return settings


def _positive(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"speculative_config.{key} must be a positive integer, got {value!r}")
    return value


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"speculative_config.{key} must be true or false, got {value!r}")
    return value


class NGramPool:
    """n-gram -> where it occurred (sequence key, position after it), over the sequences it was shown."""

    def __init__(self, max_matching_ngram_size: int, *, keep_all: bool = True, use_oldest: bool = True,
                 public: bool = True) -> None:
        self.max_n = max_matching_ngram_size
        self.keep_all = keep_all
        self.use_oldest = use_oldest
        self.public = public
        self._sequences: dict[object, list[int]] = {}
        self._indexed: dict[object, int] = {}
        self._index: dict[object, dict[tuple[int, ...], list[tuple[object, int]]]] = {}
        self._finished: OrderedDict[object, None] = OrderedDict()

    def _pool_of(self, key: object) -> dict[tuple[int, ...], list[tuple[object, int]]]:
        return self._index.setdefault(None if self.public else key, {})

    def update(self, key: object, tokens: Sequence[int]) -> None:
        """Index ``tokens`` (the whole sequence so far) for ``key``; only new positions are added."""
        history = self._sequences.setdefault(key, [])
        history.extend(tokens[len(history):])
        pool = self._pool_of(key)
        start = self._indexed.get(key, 0)
        # A position ``end`` is useful once a token follows it: n-grams ending at ``end`` point to ``end``.
        for end in range(max(start, 1), len(history)):
            for n in range(1, min(self.max_n, end) + 1):
                gram = tuple(history[end - n:end])
                refs = pool.setdefault(gram, [])
                if self.keep_all:
                    refs.append((key, end))
                else:
                    refs[:] = [(key, end)]
        self._indexed[key] = max(start, len(history))

    def propose(self, key: object, tokens: Sequence[int], max_len: int) -> tuple[int, ...]:
        """The continuation of the longest suffix of ``tokens`` seen before (at most ``max_len`` tokens)."""
        if max_len < 1 or not tokens:
            return ()
        pool = self._pool_of(key)
        for n in range(min(self.max_n, len(tokens)), 0, -1):
            refs = pool.get(tuple(tokens[len(tokens) - n:]))
            if not refs:
                continue
            source, end = refs[0] if self.use_oldest else refs[-1]
            continuation = self._sequences[source][end:end + max_len]
            if continuation:
                return tuple(continuation)
        return ()

    def release(self, key: object) -> None:
        """``key`` finished: a private pool forgets it; a public one keeps drafting from it for a while."""
        if not self.public:
            self._index.pop(key, None)
            self._sequences.pop(key, None)
            self._indexed.pop(key, None)
            return
        self._finished[key] = None
        while len(self._finished) > PUBLIC_POOL_SEQUENCES:
            old, _ = self._finished.popitem(last=False)
            self._sequences.pop(old, None)
            self._indexed.pop(old, None)
            pool = self._pool_of(old)
            for gram in [g for g, refs in pool.items() if any(r[0] == old for r in refs)]:
                kept = [r for r in pool[gram] if r[0] != old]
                if kept:
                    pool[gram] = kept
                else:
                    del pool[gram]


@dataclass
class AcceptanceCounts:
    drafted: int = 0
    accepted: int = 0
    steps_with_drafts: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.steps_with_drafts += 1 if drafted else 0


@dataclass(frozen=True)
class IterationSpeculation:
    """One iteration's ``specDecodingStats``: what upstream's JSON ``/metrics`` carries per iteration."""

    num_draft_tokens: int
    num_accepted_tokens: int
    num_requests_with_draft_tokens: int

    @property
    def acceptance_length(self) -> float:
        """Tokens a request that drafted got per step: 1 + accepted drafts, averaged."""
        if not self.num_requests_with_draft_tokens:
            return 1.0
        return 1.0 + self.num_accepted_tokens / self.num_requests_with_draft_tokens


@dataclass
class Speculator:
    """The drafter, the runtime controls and the counters of one engine (the batcher's; not thread-safe)."""

    settings: SpeculationSettings
    total: AcceptanceCounts = field(default_factory=AcceptanceCounts)
    by_adapter: dict[int, AcceptanceCounts] = field(default_factory=dict)
    """Per LoRA task id (0: the base model)."""
    disabled: bool = False
    """The rolling acceptance fell below ``acceptance_rate_threshold``: no more drafts, ever."""
    last_iteration: IterationSpeculation = IterationSpeculation(0, 0, 0)
    _window: deque[float] = field(default_factory=deque)
    _pool: NGramPool | None = None

    def __post_init__(self) -> None:
        s = self.settings
        self._pool = NGramPool(s.max_matching_ngram_size, keep_all=s.is_keep_all, use_oldest=s.is_use_oldest,
                               public=s.is_public_pool)

    def draft_len(self, active_requests: int) -> int:
        """The draft length this step allows at ``active_requests`` (upstream's controls)."""
        s = self.settings
        if self.disabled:
            return 0
        if s.max_concurrency is not None:
            return s.max_draft_len if active_requests <= s.max_concurrency else 0
        for batch, length in s.draft_len_schedule:
            if active_requests <= batch:
                return min(length, s.max_draft_len)
        return 0 if s.draft_len_schedule else s.max_draft_len

    def observe(self, key: object, tokens: Sequence[int]) -> None:
        assert self._pool is not None
        self._pool.update(key, tokens)

    def propose(self, key: object, tokens: Sequence[int], max_len: int) -> tuple[int, ...]:
        assert self._pool is not None
        return self._pool.propose(key, tokens, max_len)

    def release(self, key: object) -> None:
        assert self._pool is not None
        self._pool.release(key)

    def record_iteration(self, results: Sequence[tuple[int | None, int, int]]) -> None:
        """One iteration's verifications: (task id or None, drafted, accepted) per request that drafted."""
        drafted = sum(d for _, d, _ in results)
        accepted = sum(a for _, _, a in results)
        self.last_iteration = IterationSpeculation(drafted, accepted, len(results))
        for task_id, d, a in results:
            self.total.add(d, a)
            self.by_adapter.setdefault(task_id or 0, AcceptanceCounts()).add(d, a)
        s = self.settings
        if not drafted or s.acceptance_rate_threshold is None or s.acceptance_rate_window_size < 1:
            return
        self._window.append(accepted / drafted)
        while len(self._window) > s.acceptance_rate_window_size:
            self._window.popleft()
        if len(self._window) == s.acceptance_rate_window_size and \
                sum(self._window) / len(self._window) < s.acceptance_rate_threshold:
            self.disabled = True
