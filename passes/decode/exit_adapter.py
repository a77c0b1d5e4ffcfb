"""The early-exit draft's exit adapter: a linear map from the hidden state after K decoder layers to what the final
norm and lm_head read, trained at compile time so that the draft predicts the full model's next token.

A model not trained for early exit has no usable prediction at its middle layers (SmolLM2 at 12 of 30 layers agrees
with its own last layer on a few percent of tokens), so the draft needs a map from its hidden state to the full
model's. Both hidden states come from the IR's own LLM graph in ONNX Runtime, on the calibration data (the graph's
residual stream read before norm 2K and before the final norm), so the adapter is fitted to the LLM that verifies.
It starts from the least-squares fit of the last hidden state, then Adam minimizes the KL divergence from the full model's next-token distribution through the LLM's own
final norm and lm_head (read from the graph, frozen), on seeded batches of positions, on one thread (same recipe,
same bytes). Held-out text (the reference text's first windows) scores the draft's top-1 agreement with the full
model, which is what greedy speculation accepts, and the KL, without and with the adapter.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

from mmtrt.errors import UserError
from mmtrt.ir import source_weights
from mmtrt.ir.graph import ModelIR
from mmtrt.ir.logits import is_logits_slice
from mmtrt.ir.rewrite import attr
from mmtrt.quant.calibration import TEXT_WINDOW, Sequence, _llm_feeds, _tokenizer, calibration_batches
from mmtrt.quant.session import run_with_outputs, session
from passes.decode.speculative_config import ExitAdapter

PREFIX = "speculative.adapter"


@dataclass
class Head:
    """The LLM's final norm (scale, epsilon) and lm_head ([hidden, vocab]) as float32 arrays."""

    scale: np.ndarray
    epsilon: float
    weight: np.ndarray


def final_head(llm: onnx.ModelProto, norm: onnx.NodeProto) -> Head:
    """The final norm `norm` and the MatMul that reads it into the logits; refused when the lm_head is not a
    float MatMul (quantized by an earlier pass)."""
    graph, inits = llm.graph, {t.name: t for t in llm.graph.initializer}
    readers = [n for n in graph.node if norm.output[0] in n.input]
    if len(readers) == 1 and is_logits_slice(readers[0]):
        readers = [n for n in graph.node if readers[0].output[0] in n.input]  # the lm_head reads from logits_from on
    head = readers[0] if len(readers) == 1 else None
    if head is None or head.op_type != "MatMul" or head.input[1] not in inits or head.output[0] != "logits" \
            or norm.input[1] not in inits:
        raise UserError("speculative adapter: the LLM's final norm does not feed a float lm_head MatMul into the "
                        "logits (an earlier pass rewrote it); put speculative before passes that quantize or fuse "
                        "the lm_head")
    return Head(source_weights.array(inits[norm.input[1]]).astype(np.float32),
                float(attr(norm, "epsilon", 1e-5)), source_weights.array(inits[head.input[1]]).astype(np.float32))


def hidden_states(ir: ModelIR, names: list[str], feeds: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
    """The tensors `names` of the LLM graph at every position of `feeds`, each [positions, hidden] in float32."""
    out = [[] for _ in names]
    for captured in run_with_outputs(ir.components["llm"].onnx, names, feeds):
        for i, name in enumerate(names):
            out[i].append(captured[name].reshape(-1, captured[name].shape[-1]).astype(np.float32))
    return [np.concatenate(parts) for parts in out]


def training_feeds(ir: ModelIR, data) -> list[dict[str, np.ndarray]]:
    return calibration_batches(ir, data.images, data.samples, data.text_windows, data.text).llm


def heldout_feeds(ir: ModelIR, windows: int, training_windows: int) -> list[dict[str, np.ndarray]]:
    """The reference text's first `windows` windows, which training from its end (`training_windows`) must not
    reach."""
    from mmtrt.eval.suites import reference_text

    tokenizer = _tokenizer(ir)
    ids = np.array(tokenizer(reference_text(), add_special_tokens=False)["input_ids"], np.int64)
    if TEXT_WINDOW * (windows + training_windows) > len(ids):
        raise UserError(f"speculative adapter: {training_windows} training and {windows} held-out windows of "
                        f"{TEXT_WINDOW} tokens overlap in the reference text's {len(ids)} tokens; lower them")
    embeds = session(ir.components["embed"].onnx).run(None, {"input_ids": ids[:TEXT_WINDOW * windows].reshape(
        windows, TEXT_WINDOW)})[0]
    return [_llm_feeds(ir, [Sequence(e)]) for e in embeds]


@contextmanager
def one_thread():
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _logits(h, head):
    import torch

    normed = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + head[1]) * head[0]
    return normed @ head[2]


def fit(x: np.ndarray, y: np.ndarray, head: Head, cfg: ExitAdapter) -> tuple[np.ndarray, np.ndarray, list[float]]:
    """The map (weight [hidden, hidden], bias [hidden]) from `x` towards `y`: least squares, then `cfg.steps` of
    distillation; the batch losses every tenth of the steps."""
    import torch

    with one_thread():
        tx, ty = torch.from_numpy(x), torch.from_numpy(y)
        xa = torch.cat([tx, torch.ones(len(tx), 1)], 1).double()
        gram = xa.T @ xa
        gram += cfg.ridge * gram.diagonal().mean() * torch.eye(len(gram), dtype=torch.float64)
        solved = torch.linalg.solve(gram, xa.T @ ty.double()).float()
        weight, bias = solved[:-1].clone().requires_grad_(True), solved[-1].clone().requires_grad_(True)
        frozen = (torch.from_numpy(head.scale), head.epsilon, torch.from_numpy(head.weight))
        optimizer = torch.optim.Adam([weight, bias], lr=cfg.lr)
        generator, losses = torch.Generator().manual_seed(cfg.seed), []
        for step in range(cfg.steps):
            at = torch.randint(0, len(tx), (cfg.batch_tokens,), generator=generator)
            with torch.no_grad():
                teacher = torch.log_softmax(_logits(ty[at], frozen), -1)
            student = torch.log_softmax(_logits(tx[at] @ weight + bias, frozen), -1)
            loss = torch.nn.functional.kl_div(student, teacher, log_target=True, reduction="batchmean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if (step + 1) % max(1, cfg.steps // 10) == 0:
                losses.append(round(loss.item(), 4))
        return weight.detach().numpy().copy(), bias.detach().numpy().copy(), losses


def score(x: np.ndarray, y: np.ndarray, head: Head, weight: np.ndarray | None = None,
          bias: np.ndarray | None = None) -> dict[str, float]:
    """Top-1 agreement of the draft with the full model and the mean KL from the full model's distribution to the
    draft's, over the positions of `x` (the draft's hidden state) and `y` (the full model's), with the map or
    without it (None)."""
    import torch

    frozen = (torch.from_numpy(head.scale), head.epsilon, torch.from_numpy(head.weight))
    agree, kl = 0, 0.0
    with one_thread(), torch.no_grad():
        for start in range(0, len(x), 256):
            h = torch.from_numpy(x[start:start + 256])
            if weight is not None:
                h = h @ torch.from_numpy(weight) + torch.from_numpy(bias)
            student = torch.log_softmax(_logits(h, frozen), -1)
            teacher = torch.log_softmax(_logits(torch.from_numpy(y[start:start + 256]), frozen), -1)
            agree += int((student.argmax(-1) == teacher.argmax(-1)).sum())
            kl += float(torch.nn.functional.kl_div(student, teacher, log_target=True, reduction="sum"))
    return {"top1_agreement": round(agree / len(x), 4), "kl": round(kl / len(x), 4)}


def train(ir: ModelIR, norms: list[onnx.NodeProto], keep: int, cfg: ExitAdapter
          ) -> tuple[np.ndarray, np.ndarray, dict]:
    """The adapter of a draft keeping `keep` layers of the LLM whose RMS norms are `norms` (two per layer, then the
    final one), and the pass report's account of it."""
    llm = ir.components["llm"].onnx
    head = final_head(llm, norms[-1])
    names = [norms[2 * keep].input[0], norms[-1].input[0]]
    x, y = hidden_states(ir, names, training_feeds(ir, cfg.data))
    weight, bias, losses = fit(x, y, head, cfg)
    hx, hy = hidden_states(ir, names, heldout_feeds(ir, cfg.data.heldout_windows,
                                                    cfg.data.text_windows if cfg.data.text == "reference" else 0))
    data = cfg.data
    return weight, bias, {
        "form": "linear map, hidden x hidden and a bias, before the shared final norm and lm_head",
        "parameters": weight.size + bias.size,
        "trained_on": {"positions": len(x), "text": f"{data.text_windows} windows of {TEXT_WINDOW} tokens, "
                       + ("Python's documentation from its end" if data.text == "reference" else "the recipe's text"),
                       "images": 0 if data.images == "none" else f"{data.samples} {data.images} images with their "
                                                                   "prompts"},
        "steps": cfg.steps, "batch_tokens": cfg.batch_tokens, "batch_loss": losses,
        "heldout": {"positions": len(hx), "text": f"the first {data.heldout_windows} windows of {TEXT_WINDOW} tokens "
                    "of Python's documentation, never trained on",
                    "without_adapter": score(hx, hy, head), "with_adapter": score(hx, hy, head, weight, bias)},
    }


def attach(draft: onnx.ModelProto, hidden: str, norm: onnx.NodeProto, weight: np.ndarray, bias: np.ndarray) -> None:
    """`norm` (the draft's final norm) reads `hidden` @ weight + bias, in the norm's float type."""
    graph = draft.graph
    dtype = helper.tensor_dtype_to_np_dtype(next(t.data_type for t in graph.initializer if t.name == norm.input[1]))
    graph.initializer.extend([numpy_helper.from_array(weight.astype(dtype), f"{PREFIX}.weight"),
                              numpy_helper.from_array(bias.astype(dtype), f"{PREFIX}.bias")])
    nodes = [helper.make_node("MatMul", [hidden, f"{PREFIX}.weight"], [f"{PREFIX}.mapped"], name=f"{PREFIX}.matmul"),
             helper.make_node("Add", [f"{PREFIX}.mapped", f"{PREFIX}.bias"], [f"{PREFIX}.out"], name=f"{PREFIX}.add")]
    at = list(graph.node).index(norm)
    for i, node in enumerate(nodes):
        graph.node.insert(at + i, node)
    norm.input[0] = f"{PREFIX}.out"
