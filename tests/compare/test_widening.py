"""The PyTorch reference widens a decoder layer to float32 only while it runs: its outputs are the model's widened
whole, bit for bit, and no two layers are float32 at once (a 7B LLM widened whole would not fit a 24 GB host)."""

import copy

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from mmtrt.compare.runners import TorchRunner


def _float32_layers(model) -> list[int]:
    return [i for i, layer in enumerate(model.model.layers)
            if next(layer.parameters()).dtype == torch.float32]


class _Logits:
    def __init__(self, model):
        self.model = model

    def run(self, feeds):
        with torch.no_grad():
            return {"logits": self.model(input_ids=torch.from_numpy(feeds["input_ids"])).logits.numpy()}


def test_each_layer_is_float32_only_while_it_runs_and_the_outputs_are_the_whole_widened_models():
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    own = {name: (t.data_ptr(), t.detach().clone()) for name, t in model.state_dict(keep_vars=True).items()}
    ids = torch.randint(0, config.vocab_size, (1, 11))
    seen = []
    for layer in model.model.layers:
        layer.self_attn.register_forward_pre_hook(lambda _m, _a: seen.append(_float32_layers(model)))
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
