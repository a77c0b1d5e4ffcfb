"""The exit adapter's training: the same data gives the same bytes whatever torch's thread count, and its
least-squares start and distillation steps fit a known map (the full model's hidden state made from the draft's by
a random linear map, so a perfect adapter exists)."""

import numpy as np
import torch

from passes.decode.exit_adapter import Head, fit, score
from passes.decode.speculative_config import ExitAdapter


def problem(rng, positions=512, hidden=16, vocab=40):
    x = rng.standard_normal((positions, hidden)).astype(np.float32)
    true = np.eye(hidden, dtype=np.float32) + 0.5 * rng.standard_normal((hidden, hidden)).astype(np.float32)
    head = Head(1 + 0.1 * rng.standard_normal(hidden).astype(np.float32), 1e-6,
                rng.standard_normal((hidden, vocab)).astype(np.float32))
    return x, x @ true + 0.1, head


def top2_margin(y, head):
    """The gap between each position's two largest logits, relative to their scale."""
    normed = y / np.sqrt((y * y).mean(-1, keepdims=True) + head.epsilon) * head.scale
    top = np.sort(normed @ head.weight, axis=-1)[:, -2:]
    return (top[:, 1] - top[:, 0]) / np.abs(top).max(-1)


def test_training_gives_the_same_bytes_on_any_thread_count(rng):
    x, y, head = problem(rng)
    cfg = ExitAdapter(steps=5, batch_tokens=32, lr=1e-3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        first = fit(x, y, head, cfg)
        torch.set_num_threads(2)
        second = fit(x, y, head, cfg)
    finally:
        torch.set_num_threads(threads)
    assert first[0].tobytes() == second[0].tobytes() and first[1].tobytes() == second[1].tobytes()
    assert torch.get_num_threads() == threads


def test_an_exact_map_is_found_and_scores_full_agreement(rng):
    x, y, head = problem(rng)
    held_x, held_y, _ = problem(np.random.default_rng(rng.integers(1 << 30)))
    held_y = held_x @ np.linalg.lstsq(x, y - 0.1, rcond=None)[0] + 0.1  # the same map on fresh inputs
    clear = top2_margin(held_y, head) > 1e-3  # a float32 fit cannot decide a tie closer than its own rounding
    assert clear.mean() > 0.95
    held_x, held_y = held_x[clear], held_y[clear]
    weight, bias, losses = fit(x, y, head, ExitAdapter(steps=10, batch_tokens=64, lr=1e-4, ridge=0))
    before, after = score(held_x, held_y, head), score(held_x, held_y, head, weight, bias)
    assert after["top1_agreement"] == 1.0 and after["kl"] < 1e-4
    assert before["top1_agreement"] < 0.9 and before["kl"] > 100 * after["kl"]
    assert len(losses) == 10 and max(losses) < 1e-3
