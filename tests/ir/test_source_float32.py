"""The PyTorch reference widens a decoder layer to float32 only while it runs: its outputs are the model's widened
whole, bit for bit, and no two layers are float32 at once (a 7B LLM widened whole would not fit a 24 GB host)."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mmtrt.compare.runners import TorchRunner
from mmtrt.ir.source_float32 import in_float32


def _float32_layers(model) -> list[int]:
    return [i for i, layer in enumerate(model.model.layers)
            if next(layer.parameters()).dtype == torch.float32]


def _tiny_llama():
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def _watch(model) -> list[list[int]]:
    """Which layers are float32 as each layer's attention starts."""
    seen = []
    for layer in model.model.layers:
        layer.self_attn.register_forward_pre_hook(lambda _m, _a: seen.append(_float32_layers(model)))
    return seen


class _Logits:
    def __init__(self, model):
        self.model = model

    def run(self, feeds):
        with torch.no_grad():
            return {"logits": self.model(input_ids=torch.from_numpy(feeds["input_ids"])).logits.numpy()}


def test_each_layer_is_float32_only_while_it_runs_and_the_outputs_are_the_whole_widened_models():
    model = _tiny_llama()
    own = {name: (t.data_ptr(), t.detach().clone()) for name, t in model.state_dict(keep_vars=True).items()}
    ids = torch.randint(0, model.config.vocab_size, (1, 11))
    seen = _watch(model)
    runner = TorchRunner(lambda: _Logits(model), [model.model, model.lm_head],
                         [{"name": "input_ids", "dtype": "int64", "shape": [1, 11]}], "torch:llm")
    runner.activate()
    outside = model.model.embed_tokens.weight.dtype, model.model.norm.weight.dtype, model.lm_head.weight.dtype
    assert _float32_layers(model) == [] and outside == (torch.float32,) * 3
    logits = runner.infer({"input_ids": ids.numpy()})["logits"]
    runner.deactivate()

    assert seen == [[0], [1], [2], [3]], seen
    assert all(t.dtype == torch.bfloat16 and t.data_ptr() == own[name][0] and torch.equal(t, own[name][1])
               for name, t in model.state_dict(keep_vars=True).items())
    whole = copy.deepcopy(model).float()
    with torch.no_grad():
        assert torch.equal(torch.from_numpy(logits), whole(input_ids=ids).logits)


@pytest.mark.parametrize("room, by_layer", [(10**12, False), (10**5, True)])
def test_a_model_computes_in_float32_whole_where_it_fits_else_a_layer_at_a_time(room, by_layer):
    """`eval --suite parity` generates with the source: whole in float32 where that fits in half the memory
    available (each layer widened once, not once a token), else a layer at a time; the same logits either way."""
    model = _tiny_llama()
    reference = copy.deepcopy(model).float()
    seen = _watch(model)
    ids = torch.randint(0, model.config.vocab_size, (1, 9))
    with in_float32(model, available=room), torch.no_grad():
        logits = model(input_ids=ids).logits
    layers = len(model.model.layers)
    assert seen == ([[i] for i in range(layers)] if by_layer else [list(range(layers))] * layers), seen
    assert all(t.dtype == torch.bfloat16 for t in model.parameters())
    with torch.no_grad():
        assert torch.equal(logits, reference(input_ids=ids).logits)
