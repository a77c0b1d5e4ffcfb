"""Lower a LLaVA model's PyTorch modules into ONNX components with named symbolic dimensions.

The vision graph stacks every hidden state and selects the feature layer, as Hugging Face computes it, so the
layers after the feature layer are still in the graph: removing them is the job of a pass that reports it.
"""

from __future__ import annotations

import contextlib
import gc
import io
import sys
import warnings
from contextvars import ContextVar

import onnx
import torch
from torch.export import Dim
from transformers.cache_utils import DynamicCache

from mmtrt.errors import UserError
from mmtrt.ir import source_weights
from mmtrt.ir.logits import slice_logits

OPSET = 23
_device: ContextVar[str] = ContextVar("export_device", default="cpu")


@contextlib.contextmanager
def on_device(name: str):
    """Calibration, and export where the source model does not keep its weights, on torch device `name` for the
    duration."""
    token = _device.set(name)
    try:
        yield
    finally:
        _device.reset(token)


def device() -> torch.device:
    """The compile's device: where calibration runs."""
    return torch.device(_device.get())


def trace_device() -> torch.device:
    """Where the export traces: the compile's device, except while the source model keeps the large weights
    (`source_weights.kept()`, every compile), where it is the CPU. There the weights are placeholders in CPU
    memory nobody writes, and the export computes nothing of size, so the GPU would save no time and would hold
    each component's float32 weights."""
    return torch.device("cpu") if source_weights.active() else device()


def resolve_device(choice: str) -> str:
    """`auto`: CUDA when torch sees a GPU, else the CPU; `cuda` without one is refused."""
    visible = torch.cuda.is_available()
    if choice == "auto":
        return "cuda" if visible else "cpu"
    if choice == "cuda" and not visible:
        raise UserError("--device cuda but torch sees no CUDA GPU; use --device cpu (or auto)")
    return choice


def vision_modules(llava) -> list[torch.nn.Module]:
    """What `VisionWithProjector` runs: the tower and the projector."""
    return [llava.model.vision_tower, llava.model.multi_modal_projector]


class VisionWithProjector(torch.nn.Module):
    """Tower, feature select and projector. `feature_layer` is LLaVA's vision_feature_layer: one hidden-state
    index, or a list whose hidden states are concatenated along the features."""

    def __init__(self, llava, feature_layer: int | list[int], strategy: str):
        super().__init__()
        self.tower = llava.model.vision_tower
        self.projector = llava.model.multi_modal_projector
        self.feature_layers = [feature_layer] if isinstance(feature_layer, int) else list(feature_layer)
        self.strategy = strategy

    def forward(self, pixel_values):
        hidden = torch.stack(self.tower(pixel_values, output_hidden_states=True).hidden_states)
        selected = torch.cat([hidden[layer] for layer in self.feature_layers], dim=-1)
        if self.strategy == "default":
            selected = selected[:, 1:]
        return self.projector(selected)


class TokenEmbedding(torch.nn.Module):
    def __init__(self, llava):
        super().__init__()
        self.embed = llava.model.language_model.embed_tokens

    def forward(self, input_ids):
        return self.embed(input_ids)


class DecoderWithCache(torch.nn.Module):
    """Prefill and decode through one graph: past K/V in, logits and present K/V out."""

    def __init__(self, llava):
        super().__init__()
        self.lm = llava.model.language_model
        self.head = llava.lm_head

    def forward(self, inputs_embeds, attention_mask, position_ids, past):
        cache = DynamicCache(config=self.lm.config)
        for i in range(0, len(past), 2):
            cache.update(past[i], past[i + 1], i // 2)
        out = self.lm(inputs_embeds=inputs_embeds, attention_mask=attention_mask, position_ids=position_ids,
                      cache=cache, use_cache=True)
        present = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        return (self.head(out.last_hidden_state), *present)


def kv_names(num_layers: int, prefix: str) -> list[str]:
    return [f"{prefix}.{i}.{kind}" for i in range(num_layers) for kind in ("key", "value")]


def _export(module, args, dynamic_shapes, input_names, output_names) -> onnx.ModelProto:
    args = torch.utils._pytree.tree_map(lambda t: t.to(trace_device()) if isinstance(t, torch.Tensor) else t, args)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(_captured(module, args, dynamic_shapes), args, dynamo=True, opset_version=OPSET,
                                    dynamic_shapes=dynamic_shapes, input_names=input_names,
                                    output_names=output_names, verbose=False)
    source_weights.refer(program.model)
    model = program.model_proto
    del program
    _forget_matched_graphs()
    return strip_provenance(model)


def _captured(module, args, dynamic_shapes):
    """The module as torch.export's non-strict capture gives it, which torch.onnx.export tries first. Where that
    fails, torch.onnx.export falls back to dynamo's strict capture, which clones every parameter it reads: the
    weights the compile keeps in the checkpoint (mmtrt/ir/source_weights.py) become float32 copies, twice a 0.5B
    model's compile memory. So a failed capture is tried again once, and then the fallback is said on stderr with
    its cause (the module itself is returned for torch.onnx.export's own strategies)."""
    from torch.onnx._internal.exporter._capture_strategies import TorchExportNonStrictStrategy

    for _ in range(2):
        result = TorchExportNonStrictStrategy(verbose=False)(module, args, None, dynamic_shapes)
        if result.success:
            return result.exported_program
    cause = " ".join(str(result.exception).split())[:300]
    print(f"warning: torch.export could not capture {type(module).__name__} without dynamo "
          f"({type(result.exception).__name__}: {cause}); its strict capture copies every weight in float32",
          file=sys.stderr)
    return module


def _forget_matched_graphs() -> None:
    """onnxscript's rewrite rules are module globals whose matchers keep the last graph they matched, and with
    it the torch tensors of every weight the export read (the whole LLM after its export): drop those
    references so a component's weights are freed with the component."""
    try:
        from onnxscript.rewriter._matcher import SimplePatternMatcher
    except ImportError:
        return
    for obj in gc.get_objects():
        if issubclass(type(obj), SimplePatternMatcher):  # isinstance reads __class__, which warns on some objects
            for name in ("_graph", "_match", "_current_node", "_tracer"):
                obj.__dict__.pop(name, None)
    gc.collect()


def strip_provenance(model: onnx.ModelProto) -> onnx.ModelProto:
    """Drop the exporter's per-node stack traces: they hold absolute paths, which would break reproducible hashes."""
    for node in model.graph.node:
        del node.metadata_props[:]
        node.doc_string = ""
    return model


def export_vision(llava, feature_layer: int | list[int], strategy: str, image_size: tuple[int, int]) -> onnx.ModelProto:
    module = VisionWithProjector(llava, feature_layer, strategy).eval()
    example = torch.randn(2, 3, *image_size)
    return _export(module, (example,), {"pixel_values": {0: Dim("num_images", min=1, max=64)}},
                   ["pixel_values"], ["image_features"])


def export_embedding(llava) -> onnx.ModelProto:
    example = torch.zeros(2, 5, dtype=torch.int64)
    dims = {"input_ids": {0: Dim("batch", min=1, max=64), 1: Dim("seq", min=1, max=65536)}}
    return _export(TokenEmbedding(llava).eval(), (example,), dims, ["input_ids"], ["inputs_embeds"])


def export_decoder(llava, num_layers: int, kv_heads: int, head_dim: int, hidden: int) -> onnx.ModelProto:
    batch, seq, past_len = 2, 5, 3
    batch_dim, seq_dim = Dim("batch", min=1, max=64), Dim("seq", min=1, max=65536)
    past_dim, total_dim = Dim("past", min=0, max=65536), Dim("total", min=1, max=131072)
    example = (
        torch.randn(batch, seq, hidden),
        torch.ones(batch, past_len + seq, dtype=torch.int64),
        torch.arange(past_len, past_len + seq).repeat(batch, 1),
        [torch.randn(batch, kv_heads, past_len, head_dim) for _ in range(2 * num_layers)],
    )
    dims = {
        "inputs_embeds": {0: batch_dim, 1: seq_dim},
        "attention_mask": {0: batch_dim, 1: total_dim},
        "position_ids": {0: batch_dim, 1: seq_dim},
        "past": [{0: batch_dim, 2: past_dim}] * (2 * num_layers),
    }
    inputs = ["inputs_embeds", "attention_mask", "position_ids", *kv_names(num_layers, "past")]
    outputs = ["logits", *kv_names(num_layers, "present")]
    return with_logits_from(_export(DecoderWithCache(llava).eval(), example, dims, inputs, outputs))


def with_logits_from(model: onnx.ModelProto) -> onnx.ModelProto:
    """The decoder's lm_head on the positions from its input `logits_from` on (mmtrt/ir/logits.py)."""
    slice_logits(model.graph, "llm")
    return model
