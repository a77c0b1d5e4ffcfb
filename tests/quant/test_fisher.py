"""The Fisher task sensitivity against independent references on the tiny LLaVA's source model: the directional
derivative of log p(y) along each error by central finite differences (float64 parameters; Llama's RMSNorm computes
in float32, which bounds the differences' accuracy, hence errors of 0.1 a weight, eps 1e-3 and a 1e-3 tolerance), and the source-parameter
error of AWQ-rescaled weights by its definition; the pass keeps the linears its reported scores rank first per byte.
"""

import copy

import numpy as np
import pytest
import torch

from mmtrt.errors import UserError
from mmtrt.ir.frontend import lower
from mmtrt.pipeline.source import source_model
from mmtrt.quant.fisher import TOKENS, fisher_scores, source_deltas, source_linears
from passes.quant.awq_int4 import AwqInt4, AwqInt4Config


@pytest.fixture(scope="module")
def double_source(tiny):
    return copy.deepcopy(tiny[0]).double().eval()


def _log_probs(llava, e: np.ndarray) -> torch.Tensor:
    with torch.no_grad():
        hidden = llava.model.language_model(inputs_embeds=torch.from_numpy(e)[None], use_cache=False).last_hidden_state
        return llava.lm_head(hidden[0, -1]).log_softmax(-1)


def test_scores_are_half_the_p_weighted_squared_directional_derivatives(double_source, rng):
    linears = source_linears(double_source)
    names = ["llm.lm_head", "llm.layers.0.q_proj", "llm.layers.1.down_proj"]
    deltas = {n: (0.1 * rng.normal(size=tuple(linears[n].weight.shape))).astype(np.float32) for n in names}
    width = double_source.lm_head.weight.shape[1]
    embeds = [rng.normal(size=(t, width)) for t in (7, 11)]
    scores = fisher_scores(double_source, embeds, deltas)
    eps = 1e-3
    for name in names:
        weight = linears[name].weight
        expected = 0.0
        for e in embeds:
            logp = _log_probs(double_source, e)
            p, top = logp.exp().topk(TOKENS)
            original = weight.detach().clone()
            with torch.no_grad():
                weight += eps * torch.from_numpy(deltas[name]).double()
                up = _log_probs(double_source, e)
                weight.copy_(original - eps * torch.from_numpy(deltas[name]).double())
                down = _log_probs(double_source, e)
                weight.copy_(original)
            derivative = (up - down)[top] / (2 * eps)
            expected += 0.5 * float((p * derivative ** 2).sum()) / len(embeds)
        assert scores[name] == pytest.approx(expected, rel=1e-3), name


def test_source_deltas_undo_the_rescaling(tiny, rng):
    linears = source_linears(tiny[0])
    w = linears["llm.layers.0.up_proj"].weight.detach().numpy().astype(np.float64)
    a, b = rng.uniform(0.5, 2, size=(w.shape[0], 1)), rng.uniform(0.5, 2, size=(1, w.shape[1]))
    w_ir = (a * w * b).astype(np.float32)
    noise = (0.01 * rng.normal(size=w.shape)).astype(np.float32)
    got = source_deltas(linears, {"llm.layers.0.up_proj": (w_ir, w_ir + noise)})["llm.layers.0.up_proj"]
    np.testing.assert_allclose(got, noise / (a * b), rtol=1e-4, atol=1e-7)
    with pytest.raises(UserError, match="reshaped"):
        source_deltas(linears, {"llm.layers.0.up_proj": (w_ir[:, :-1], w_ir[:, :-1])})


def test_the_pass_keeps_the_top_scores_per_byte_and_needs_the_source(tiny):
    config = AwqInt4Config(method="rtn", float_budget_mib=0.05, sensitivity="fisher", accuracy_level=0,
                           calibration={"samples": 2, "text_windows": 1})
    ir = lower(*tiny)
    with pytest.raises(UserError, match="source model"):
        AwqInt4(config).run(copy.deepcopy(ir))
    with source_model(*tiny):
        report = AwqInt4(config).run(ir)["llm"]
    scores, kept = report["task_sensitivity"], set(report["kept_float"])
    assert kept and len(scores) == report["linears_quantized"] + len(kept)
    assert min(scores[n] for n in kept) > 0
    with pytest.raises(ValueError, match="float_budget_mib"):
        AwqInt4Config(sensitivity="fisher")
