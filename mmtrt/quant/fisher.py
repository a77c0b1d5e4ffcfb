"""Task sensitivity of each quantized linear: how far its rounding error moves the source model's answer.

A linear's own output error says nothing of what the layers after it make of that error. Here each linear's error
is measured where the task reads the model: the source PyTorch model's next-token distribution p at the answer
position of the calibration images (the last prompt position, where the first answer token is predicted). To second
order, KL(p || p with the error dW) = 1/2 dW^T F dW with F the Fisher information; per linear (F's diagonal blocks)
and over the most likely answer tokens y:

    score = 1/2 mean over images of  sum_y p(y) <d log p(y) / dW, dW>^2

dW is taken in the source model's parameters (the IR's weights are AWQ's rescaled ones: W' = a W b elementwise, so
dW = dW' * W / W'). One backward pass per (image, token), so the cost is that of a few dozen training steps.
"""

from __future__ import annotations

import numpy as np
import torch

from mmtrt.errors import UserError
from mmtrt.pipeline.source import frozen

TOKENS = 3  # answer tokens per image, most likely first (the digits answers hold over 90 % of p in the top 3)


def source_linears(llava) -> dict[str, torch.nn.Linear]:
    """The source LLM's linears under the IR's names (`llm.layers.3.q_proj`, `llm.lm_head`)."""
    out = {"llm.lm_head": llava.lm_head}
    for i, layer in enumerate(llava.model.language_model.layers):
        for holder in (layer.self_attn, layer.mlp):
            for role, module in holder.named_children():
                if isinstance(module, torch.nn.Linear):
                    out[f"llm.layers.{i}.{role}"] = module
    return out


def source_deltas(linears: dict[str, torch.nn.Linear], lowered: dict[str, tuple[np.ndarray, np.ndarray]]
                  ) -> dict[str, np.ndarray]:
    """Each linear's rounding error in the source's parameters, from (the IR's float weight, its dequantized
    INT4 weight), both [N, K]."""
    out = {}
    for name, (w_ir, w_hat) in lowered.items():
        source = linears.get(name)
        if source is None or tuple(source.weight.shape) != w_ir.shape:
            raise UserError(f"awq_int4 sensitivity: fisher reads the source model's linears, but {name} is not one of "
                            f"them in this shape (a pass before awq_int4 reshaped it); use sensitivity: output_error")
        w = source.weight.detach().double().numpy()
        ratio = np.divide(w, w_ir, out=np.zeros_like(w), where=w_ir != 0)
        out[name] = ((w_hat.astype(np.float64) - w_ir) * ratio).astype(np.float32)
    return out


def fisher_scores(llava, embeds: list[np.ndarray], deltas: dict[str, np.ndarray]) -> dict[str, float]:
    """The score of every linear in `deltas`, over the answer position of each image sequence's LLM input
    embeddings ([T, D], image features in place)."""
    linears = source_linears(llava)
    chosen = {name: linears[name] for name in deltas}
    dw = {name: torch.from_numpy(d) for name, d in deltas.items()}
    totals = dict.fromkeys(deltas, 0.0)
    with frozen(llava):
        for m in chosen.values():
            m.weight.requires_grad_(True)
        for e in embeds:
            hidden = llava.model.language_model(inputs_embeds=torch.from_numpy(e)[None].to(llava.lm_head.weight.dtype),
                                                use_cache=False).last_hidden_state
            logp = llava.lm_head(hidden[0, -1]).double().log_softmax(-1)
            p, top = logp.detach().exp().topk(TOKENS)
            for k, (py, y) in enumerate(zip(p.tolist(), top.tolist())):
                grads = torch.autograd.grad(logp[y], [m.weight for m in chosen.values()], retain_graph=k + 1 < TOKENS)
                for (name, _), g in zip(chosen.items(), grads):
                    totals[name] += 0.5 * py * float((g.double() * dw[name]).sum()) ** 2 / len(embeds)
    return totals
