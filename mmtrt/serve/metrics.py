"""The serving loop's figures in Prometheus' text format, beside Triton's own metrics (on Triton's metrics port)."""

from __future__ import annotations

FIGURES = (  # name, type, help, Metrics field
    ("mmtrt_queue_length", "gauge", "requests waiting for a place in the batch", "queued"),
    ("mmtrt_running_requests", "gauge", "requests decoding now", "running"),
    ("mmtrt_kv_blocks_used", "gauge", "KV places in use (paged: blocks; static: rows; hf: sequences)",
     "kv_blocks_used"),
    ("mmtrt_kv_blocks_total", "gauge", "KV places in all", "kv_blocks_total"),
    ("mmtrt_time_to_first_token_seconds", "gauge", "mean time from submit to the first token", "time_to_first_token_s"),
    ("mmtrt_tokens_per_second", "gauge", "tokens generated per second of busy decoding", "tokens_per_s"),
    ("mmtrt_requests_finished_total", "counter", "requests finished (stop, length, abort or error)",
     "requests_finished"),
    ("mmtrt_requests_refused_total", "counter", "requests refused at submit (queue full, draining)",
     "requests_refused"),
    ("mmtrt_tokens_generated_total", "counter", "tokens generated", "tokens_generated"),
    ("mmtrt_encoder_cache_hits_total", "counter", "images whose features came from the encoder cache",
     "encoder_cache_hits"),
    ("mmtrt_encoder_cache_misses_total", "counter", "images not found in the encoder cache", "encoder_cache_misses"),
    ("mmtrt_encoder_cache_bytes", "gauge", "bytes of image features the encoder cache holds", "encoder_cache_bytes"),
    ("mmtrt_speculative_acceptance_rate", "gauge", "drafted tokens accepted per token proposed (speculative decoding)",
     "speculative_acceptance"),
)


def prometheus_text(metrics, model: str) -> str:
    lines = []
    for name, kind, help_text, field in FIGURES:
        value = getattr(metrics, field)
        text = "NaN" if value is None else repr(float(value))
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f'{name}{{model="{model}"}} {text}']
    return "\n".join(lines) + "\n"
