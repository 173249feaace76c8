"""The tensors of TRT-LLM's in-flight-batching Triton models, as data.

Names, data types, dims and flags follow the model templates NVIDIA ships in TensorRT-LLM's
``triton_backend/all_models/inflight_batcher_llm/*/config.pbtxt`` (TRT-LLM 1.x: tensorrt_llm and ensemble
@2a9abd95, preprocessing @808059da, postprocessing @89fd9b74, tensorrt_llm_bls @bff88ea8): the Python models
NVIDIA ships in the image (preprocessing, postprocessing, BLS) look several of these names up when they
load, so the lists are kept complete rather than trimmed to what trtfleet itself sends. ``ENGINE_DTYPE``
marks tensors whose type must equal the engine dtype (LoRA weights, prompt tables): the templates hard-code
TYPE_FP16 there, which breaks bf16 engines.

Flags: ``o`` optional, ``r`` allow_ragged_batch, ``s`` reshape to a scalar (``reshape: { shape: [ ] }``).
"""

from __future__ import annotations

from trtfleet_engines.triton.pbtxt import ENGINE_DTYPE, LOGITS_DTYPE, Tensor

LORA_INPUT_NAMES = frozenset({"lora_task_id", "lora_weights", "lora_config"})


def _t(name: str, data_type: str, dims: tuple[int, ...], flags: str = "") -> Tensor:
    return Tensor(
        name=name,
        data_type=data_type if data_type in (ENGINE_DTYPE, LOGITS_DTYPE) else f"TYPE_{data_type}",
        dims=dims,
        optional="o" in flags,
        ragged="r" in flags,
        reshape_scalar="s" in flags,
    )


ONE = (1,)
VEC = (-1,)
MAT = (-1, -1)

TENSORRT_LLM_INPUTS: tuple[Tensor, ...] = (
    _t("input_ids", "INT32", VEC, "ro"),
    _t("encoder_input_features", ENGINE_DTYPE, MAT, "ro"),
    _t("encoder_output_lengths", "INT32", ONE, "so"),
    _t("input_lengths", "INT32", ONE, "s"),
    _t("request_output_len", "INT32", ONE, "s"),
    _t("num_return_sequences", "INT32", ONE, "so"),
    _t("draft_input_ids", "INT32", VEC, "ro"),
    _t("decoder_input_ids", "INT32", VEC, "ro"),
    _t("decoder_input_lengths", "INT32", ONE, "so"),
    _t("draft_logits", LOGITS_DTYPE, MAT, "ro"),
    _t("draft_acceptance_threshold", "FP32", ONE, "so"),
    _t("end_id", "INT32", ONE, "so"),
    _t("pad_id", "INT32", ONE, "so"),
    _t("stop_words_list", "INT32", (2, -1), "ro"),
    _t("bad_words_list", "INT32", (2, -1), "ro"),
    _t("embedding_bias", "FP32", VEC, "ro"),
    _t("beam_width", "INT32", ONE, "so"),
    _t("temperature", "FP32", ONE, "so"),
    _t("runtime_top_k", "INT32", ONE, "so"),
    _t("runtime_top_p", "FP32", ONE, "so"),
    _t("runtime_top_p_min", "FP32", ONE, "so"),
    _t("runtime_top_p_decay", "FP32", ONE, "so"),
    _t("runtime_top_p_reset_ids", "INT32", ONE, "so"),
    _t("len_penalty", "FP32", ONE, "so"),
    _t("early_stopping", "BOOL", ONE, "so"),
    _t("repetition_penalty", "FP32", ONE, "so"),
    _t("min_tokens", "INT32", ONE, "so"),
    _t("beam_search_diversity_rate", "FP32", ONE, "so"),
    _t("presence_penalty", "FP32", ONE, "so"),
    _t("frequency_penalty", "FP32", ONE, "so"),
    _t("seed", "UINT64", ONE, "so"),
    _t("return_log_probs", "BOOL", ONE, "so"),
    _t("return_context_logits", "BOOL", ONE, "so"),
    _t("return_generation_logits", "BOOL", ONE, "so"),
    _t("return_perf_metrics", "BOOL", ONE, "so"),
    _t("return_num_input_tokens", "BOOL", ONE, "so"),
    _t("return_num_output_tokens", "BOOL", ONE, "so"),
    _t("exclude_input_in_output", "BOOL", ONE, "so"),
    _t("stop", "BOOL", ONE, "so"),
    _t("streaming", "BOOL", ONE, "so"),
    _t("prompt_embedding_table", ENGINE_DTYPE, MAT, "ro"),
    _t("prompt_table_extra_ids", "UINT64", VEC, "ro"),
    _t("prompt_vocab_size", "INT32", ONE, "so"),
    _t("cross_attention_mask", "BOOL", MAT, "ro"),
    _t("mrope_rotary_cos_sin", "FP32", VEC, "o"),
    _t("mrope_position_deltas", "INT64", ONE, "o"),
    _t("lora_task_id", "UINT64", ONE, "so"),
    _t("lora_weights", ENGINE_DTYPE, MAT, "ro"),
    _t("lora_config", "INT32", (-1, 3), "ro"),
    _t("context_phase_params", "UINT8", VEC, "ro"),
    _t("skip_cross_attn_blocks", "BOOL", ONE, "ro"),
    _t("retention_token_range_starts", "INT32", VEC, "ro"),
    _t("retention_token_range_ends", "INT32", VEC, "ro"),
    _t("retention_token_range_priorities", "INT32", VEC, "ro"),
    _t("retention_token_range_durations_ms", "INT32", VEC, "ro"),
    _t("retention_decode_priority", "INT32", ONE, "ro"),
    _t("retention_decode_duration_ms", "INT32", ONE, "ro"),
    _t("guided_decoding_guide_type", "STRING", ONE, "ro"),
    _t("guided_decoding_guide", "STRING", ONE, "ro"),
    _t("lookahead_window_size", "INT32", ONE, "ro"),
    _t("lookahead_ngram_size", "INT32", ONE, "ro"),
    _t("lookahead_verification_set_size", "INT32", ONE, "ro"),
)

# Outputs shared by tensorrt_llm, the ensemble and the BLS model (after the first two / text_output).
_STATS_OUTPUTS: tuple[Tensor, ...] = (
    _t("cum_log_probs", "FP32", VEC),
    _t("output_log_probs", "FP32", MAT),
    _t("context_logits", LOGITS_DTYPE, MAT),
    _t("generation_logits", LOGITS_DTYPE, (-1, -1, -1)),
    _t("batch_index", "INT32", ONE),
    _t("sequence_index", "INT32", ONE),
)
_PERF_OUTPUTS: tuple[Tensor, ...] = (
    _t("kv_cache_alloc_new_blocks", "INT32", ONE),
    _t("kv_cache_reused_blocks", "INT32", ONE),
    _t("kv_cache_alloc_total_blocks", "INT32", ONE),
    _t("arrival_time_ns", "INT64", ONE),
    _t("first_scheduled_time_ns", "INT64", ONE),
    _t("first_token_time_ns", "INT64", ONE),
    _t("last_token_time_ns", "INT64", ONE),
    _t("acceptance_rate", "FP32", ONE),
    _t("total_accepted_draft_tokens", "INT32", ONE),
    _t("total_draft_tokens", "INT32", ONE),
    _t("num_input_tokens", "INT32", ONE),
    _t("num_output_tokens", "INT32", ONE),
)

TENSORRT_LLM_OUTPUTS: tuple[Tensor, ...] = (
    (_t("output_ids", "INT32", MAT), _t("sequence_length", "INT32", VEC))
    + _STATS_OUTPUTS
    + (_t("context_phase_params", "UINT8", VEC),)
    + _PERF_OUTPUTS
)

TEXT_OUTPUTS: tuple[Tensor, ...] = (_t("text_output", "STRING", VEC),) + _STATS_OUTPUTS + _PERF_OUTPUTS
"""Outputs of the ensemble and the BLS model."""

PREPROCESSING_INPUTS: tuple[Tensor, ...] = (
    _t("QUERY", "STRING", ONE),
    _t("DECODER_QUERY", "STRING", ONE, "o"),
    _t("IMAGE_BYTES", "UINT8", (-1, -1, -1, -1), "o"),
    _t("IMAGE_URL", "STRING", VEC, "o"),
    _t("IMAGE_SIZES", "INT64", (-1, 2), "o"),
    _t("VIDEO_BYTES", "UINT8", (-1, -1, -1, -1), "o"),
    _t("REQUEST_OUTPUT_LEN", "INT32", ONE),
    _t("BAD_WORDS_DICT", "STRING", VEC, "o"),
    _t("STOP_WORDS_DICT", "STRING", VEC, "o"),
    _t("EMBEDDING_BIAS_WORDS", "STRING", VEC, "o"),
    _t("EMBEDDING_BIAS_WEIGHTS", "FP32", VEC, "o"),
    _t("END_ID", "INT32", ONE, "o"),
    _t("PAD_ID", "INT32", ONE, "o"),
    _t("PROMPT_TABLE_EXTRA_ID", "UINT64", ONE, "o"),
)

PREPROCESSING_OUTPUTS: tuple[Tensor, ...] = (
    _t("INPUT_ID", "INT32", VEC),
    _t("REQUEST_INPUT_LEN", "INT32", ONE),
    _t("DECODER_INPUT_ID", "INT32", VEC),
    _t("REQUEST_DECODER_INPUT_LEN", "INT32", ONE),
    _t("BAD_WORDS_IDS", "INT32", (2, -1)),
    _t("STOP_WORDS_IDS", "INT32", (2, -1)),
    _t("EMBEDDING_BIAS", "FP32", VEC),
    _t("REQUEST_OUTPUT_LEN", "INT32", VEC),
    _t("OUT_END_ID", "INT32", ONE),
    _t("OUT_PAD_ID", "INT32", ONE),
    _t("OUT_PROMPT_TABLE_EXTRA_IDS", "UINT64", VEC),
    _t("PIXEL_VALUES", "FP16", (-1, -1, -1, -1)),
    _t("ASPECT_RATIO_IDS", "INT64", VEC),
    _t("ASPECT_RATIO_MASK", "INT64", MAT),
    _t("CROSS_ATTENTION_MASK", "INT64", (-1, -1, -1)),
    _t("IMAGE_SIZES", "INT64", (-1, 2)),
    _t("IS_VIDEO_INPUT", "BOOL", ONE),
    _t("ATTENTION_MASK", "INT64", VEC),
    _t("IMAGE_GRID_THW", "INT64", (3,)),
    _t("VISION_INPUT_ID", "INT32", VEC),
)

POSTPROCESSING_INPUTS: tuple[Tensor, ...] = (
    _t("TOKENS_BATCH", "INT32", MAT),
    _t("SEQUENCE_LENGTH", "INT32", VEC),
)
POSTPROCESSING_OUTPUTS: tuple[Tensor, ...] = (_t("OUTPUT", "STRING", VEC),)

_SAMPLING_INPUTS: tuple[Tensor, ...] = (
    _t("bad_words", "STRING", VEC, "o"),
    _t("stop_words", "STRING", VEC, "o"),
    _t("exclude_input_in_output", "BOOL", ONE, "o"),
    _t("end_id", "INT32", ONE, "o"),
    _t("pad_id", "INT32", ONE, "o"),
    _t("top_k", "INT32", ONE, "o"),
    _t("top_p", "FP32", ONE, "o"),
    _t("temperature", "FP32", ONE, "o"),
    _t("length_penalty", "FP32", ONE, "o"),
    _t("repetition_penalty", "FP32", ONE, "o"),
    _t("min_tokens", "INT32", ONE, "o"),
    _t("presence_penalty", "FP32", ONE, "o"),
    _t("frequency_penalty", "FP32", ONE, "o"),
    _t("seed", "UINT64", ONE, "o"),
)

ENSEMBLE_INPUTS: tuple[Tensor, ...] = (
    (
        _t("text_input", "STRING", ONE),
        _t("decoder_text_input", "STRING", ONE, "o"),
        _t("max_tokens", "INT32", ONE),
        _t("num_return_sequences", "INT32", ONE, "o"),
    )
    + _SAMPLING_INPUTS
    + (
        _t("return_log_probs", "BOOL", ONE, "o"),
        _t("return_context_logits", "BOOL", ONE, "o"),
        _t("return_generation_logits", "BOOL", ONE, "o"),
        _t("return_perf_metrics", "BOOL", ONE, "o"),
        _t("return_num_input_tokens", "BOOL", ONE, "o"),
        _t("return_num_output_tokens", "BOOL", ONE, "o"),
        _t("beam_width", "INT32", ONE, "o"),
        _t("stream", "BOOL", ONE, "o"),
        _t("prompt_embedding_table", ENGINE_DTYPE, MAT, "o"),
        _t("prompt_table_extra_id", "UINT64", ONE, "o"),
        _t("prompt_vocab_size", "INT32", ONE, "o"),
        _t("embedding_bias_words", "STRING", VEC, "o"),
        _t("embedding_bias_weights", "FP32", VEC, "o"),
        _t("lora_task_id", "UINT64", ONE, "o"),
        _t("lora_weights", ENGINE_DTYPE, MAT, "or"),
        _t("lora_config", "INT32", (-1, 3), "or"),
        _t("guided_decoding_guide_type", "STRING", ONE, "or"),
        _t("guided_decoding_guide", "STRING", ONE, "or"),
    )
)

BLS_INPUTS: tuple[Tensor, ...] = (
    (
        _t("text_input", "STRING", ONE),
        _t("decoder_text_input", "STRING", ONE, "o"),
        _t("image_input", "FP16", (-1, 3, -1, -1), "o"),
        _t("image_bytes_input", "UINT8", (-1, -1, -1, -1), "o"),
        _t("image_url_input", "STRING", ONE, "o"),
        _t("image_sizes_input", "INT64", (-1, 2), "o"),
        _t("video_bytes_input", "UINT8", (-1, -1, -1, -1), "o"),
        _t("max_tokens", "INT32", ONE),
    )
    + _SAMPLING_INPUTS
    + (
        _t("return_log_probs", "BOOL", ONE, "so"),
        _t("return_context_logits", "BOOL", ONE, "so"),
        _t("return_generation_logits", "BOOL", ONE, "so"),
        _t("num_return_sequences", "INT32", ONE, "so"),
        _t("beam_width", "INT32", ONE, "o"),
        _t("stream", "BOOL", ONE, "o"),
        _t("prompt_embedding_table", ENGINE_DTYPE, MAT, "o"),
        _t("prompt_vocab_size", "INT32", ONE, "o"),
        _t("prompt_table_extra_id", "UINT64", ONE, "o"),
        _t("embedding_bias_words", "STRING", VEC, "o"),
        _t("embedding_bias_weights", "FP32", VEC, "o"),
        _t("num_draft_tokens", "INT32", ONE, "o"),
        _t("use_draft_logits", "BOOL", ONE, "so"),
        _t("lora_task_id", "UINT64", ONE, "so"),
        _t("lora_weights", ENGINE_DTYPE, MAT, "or"),
        _t("lora_config", "INT32", (-1, 3), "or"),
        _t("return_perf_metrics", "BOOL", ONE, "so"),
        _t("return_num_input_tokens", "BOOL", ONE, "so"),
        _t("return_num_output_tokens", "BOOL", ONE, "so"),
        _t("guided_decoding_guide_type", "STRING", ONE, "o"),
        _t("guided_decoding_guide", "STRING", ONE, "o"),
    )
)

# Ensemble wiring, (model tensor, ensemble tensor) pairs, in the templates' order.
PREPROCESSING_STEP_INPUTS: tuple[tuple[str, str], ...] = (
    ("QUERY", "text_input"),
    ("DECODER_QUERY", "decoder_text_input"),
    ("REQUEST_OUTPUT_LEN", "max_tokens"),
    ("BAD_WORDS_DICT", "bad_words"),
    ("STOP_WORDS_DICT", "stop_words"),
    ("EMBEDDING_BIAS_WORDS", "embedding_bias_words"),
    ("EMBEDDING_BIAS_WEIGHTS", "embedding_bias_weights"),
    ("END_ID", "end_id"),
    ("PAD_ID", "pad_id"),
    ("PROMPT_TABLE_EXTRA_ID", "prompt_table_extra_id"),
)
PREPROCESSING_STEP_OUTPUTS: tuple[tuple[str, str], ...] = (
    ("REQUEST_INPUT_LEN", "_REQUEST_INPUT_LEN"),
    ("INPUT_ID", "_INPUT_ID"),
    ("REQUEST_DECODER_INPUT_LEN", "_REQUEST_DECODER_INPUT_LEN"),
    ("DECODER_INPUT_ID", "_DECODER_INPUT_ID"),
    ("REQUEST_OUTPUT_LEN", "_REQUEST_OUTPUT_LEN"),
    ("STOP_WORDS_IDS", "_STOP_WORDS_IDS"),
    ("BAD_WORDS_IDS", "_BAD_WORDS_IDS"),
    ("EMBEDDING_BIAS", "_EMBEDDING_BIAS"),
    ("OUT_END_ID", "_PREPROCESSOR_END_ID"),
    ("OUT_PAD_ID", "_PREPROCESSOR_PAD_ID"),
    ("OUT_PROMPT_TABLE_EXTRA_IDS", "_OUT_PROMPT_TABLE_EXTRA_IDS"),
)
TENSORRT_LLM_STEP_INPUTS: tuple[tuple[str, str], ...] = (
    ("input_ids", "_INPUT_ID"),
    ("decoder_input_ids", "_DECODER_INPUT_ID"),
    ("input_lengths", "_REQUEST_INPUT_LEN"),
    ("decoder_input_lengths", "_REQUEST_DECODER_INPUT_LEN"),
    ("exclude_input_in_output", "exclude_input_in_output"),
    ("request_output_len", "_REQUEST_OUTPUT_LEN"),
    ("end_id", "_PREPROCESSOR_END_ID"),
    ("pad_id", "_PREPROCESSOR_PAD_ID"),
    ("embedding_bias", "_EMBEDDING_BIAS"),
    ("runtime_top_k", "top_k"),
    ("runtime_top_p", "top_p"),
    ("temperature", "temperature"),
    ("len_penalty", "length_penalty"),
    ("repetition_penalty", "repetition_penalty"),
    ("min_tokens", "min_tokens"),
    ("presence_penalty", "presence_penalty"),
    ("frequency_penalty", "frequency_penalty"),
    ("seed", "seed"),
    ("return_log_probs", "return_log_probs"),
    ("return_context_logits", "return_context_logits"),
    ("return_generation_logits", "return_generation_logits"),
    ("return_perf_metrics", "return_perf_metrics"),
    ("return_num_input_tokens", "return_num_input_tokens"),
    ("return_num_output_tokens", "return_num_output_tokens"),
    ("num_return_sequences", "num_return_sequences"),
    ("beam_width", "beam_width"),
    ("streaming", "stream"),
    ("prompt_embedding_table", "prompt_embedding_table"),
    ("prompt_vocab_size", "prompt_vocab_size"),
    ("stop_words_list", "_STOP_WORDS_IDS"),
    ("bad_words_list", "_BAD_WORDS_IDS"),
    ("prompt_table_extra_ids", "_OUT_PROMPT_TABLE_EXTRA_IDS"),
    ("lora_task_id", "lora_task_id"),
    ("lora_weights", "lora_weights"),
    ("lora_config", "lora_config"),
    ("guided_decoding_guide_type", "guided_decoding_guide_type"),
    ("guided_decoding_guide", "guided_decoding_guide"),
)
TENSORRT_LLM_STEP_OUTPUTS: tuple[tuple[str, str], ...] = (
    ("output_ids", "_TOKENS_BATCH"),
    ("sequence_length", "_SEQUENCE_LENGTH"),
) + tuple((t.name, t.name) for t in _STATS_OUTPUTS + _PERF_OUTPUTS)
POSTPROCESSING_STEP_INPUTS: tuple[tuple[str, str], ...] = (
    ("TOKENS_BATCH", "_TOKENS_BATCH"),
    ("SEQUENCE_LENGTH", "_SEQUENCE_LENGTH"),
)
POSTPROCESSING_STEP_OUTPUTS: tuple[tuple[str, str], ...] = (("OUTPUT", "text_output"),)
