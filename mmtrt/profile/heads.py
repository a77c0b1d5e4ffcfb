"""Per layer and head: attention entropy, head redundancy, and what the image tokens are worth (alignment, saliency).

The numbers come from the bundle's own graphs, not the source model, so they describe what ships (after
dead_layer_elimination, token_prune, awq_int4 or channel_prune). A probe copy of each graph exposes, for every
ONNX `Attention` node, its output per head (`Y`, [batch, heads, seq, head_dim]) and its attention probabilities
(the op's optional `qk_matmul_output` with `qk_matmul_output_mode` 3: after the softmax), as extra graph
outputs. The copy is built in memory (ONNX Runtime refuses external data outside a model's folder). A graph
whose attention is not the ONNX op has no head analysis, and says so. Why the bundle and not the source model:
it is what ships, after every pass, and it needs no checkpoint on the profiling host.

- entropy: per head, the mean over query rows of -sum p log p (nats) of its attention probabilities;
- redundancy: per layer, the cosine similarity between every two heads' outputs over all tokens and channels;
  a head's score is its largest similarity to another head;
- alignment: cosine between each projected image feature (the vision output) and each text embedding of the
  prompt (the embed output at the non-image positions); its mean, and per image token the best text match;
- saliency: what token_prune ranks by: attention from [CLS] to each patch at the layer it reads (the feature
  layer's, mean over heads) and the L2 norm of each patch's feature at the projector's input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from mmtrt.backends.onnxruntime_backend import session_options
from mmtrt.ir.facts import deepest_feature_layer
from mmtrt.profile.layers import projector_matmuls

PROBE = "mmtrt_probe"
AFTER_SOFTMAX = 3


class ProbeSession:
    """A copy of one component's graph that also returns every Attention node's probabilities and head outputs
    and, for the vision graph, the projector's input."""

    def __init__(self, bundle: Path, artifact: str, threads: int | None = 1):
        model = onnx.load(str(bundle / artifact))
        self.layers = _expose_attention(model.graph)
        self.projector_input = _expose_projector_input(model.graph) if artifact.startswith("vision") else None
        options = session_options(threads, False, ops={n.op_type for n in model.graph.node})
        self.session = ort.InferenceSession(model.SerializeToString(), sess_options=options,
                                            providers=["CPUExecutionProvider"])
        self.names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.session.run(None, feeds)))


def _expose_attention(graph: onnx.GraphProto) -> list[tuple[str, str]]:
    layers = []
    for i, node in enumerate(n for n in graph.node if n.op_type == "Attention"):
        while len(node.output) < 4:
            node.output.append("")
        node.output[3] = f"{PROBE}/attention_probs_{i}"
        mode = next((a for a in node.attribute if a.name == "qk_matmul_output_mode"), None)
        if mode is None:
            node.attribute.append(helper.make_attribute("qk_matmul_output_mode", AFTER_SOFTMAX))
        else:
            mode.i = AFTER_SOFTMAX
        graph.output.append(helper.make_empty_tensor_value_info(node.output[3]))
        if node.output[0] not in {o.name for o in graph.output}:
            graph.output.append(helper.make_empty_tensor_value_info(node.output[0]))
        layers.append((node.output[3], node.output[0]))
    return layers


def _expose_projector_input(graph: onnx.GraphProto) -> str | None:
    matmuls = projector_matmuls(graph)
    if not matmuls:
        return None
    graph.output.append(helper.make_empty_tensor_value_info(matmuls[0].input[0]))
    return matmuls[0].input[0]


def entropy(probs: np.ndarray) -> np.ndarray:
    """[batch, heads, q, k] probabilities -> [heads] mean entropy in nats."""
    p = probs.astype(np.float64)
    terms = np.where(p > 0, -p * np.log(np.where(p > 0, p, 1)), 0.0)
    return terms.sum(-1).mean(axis=(0, 2))


def head_similarity(outputs: np.ndarray) -> np.ndarray:
    """[batch, heads, seq, dim] -> [heads, heads] cosine similarity of the heads' flattened outputs."""
    flat = np.moveaxis(outputs.astype(np.float64), 1, 0).reshape(outputs.shape[1], -1)
    unit = flat / np.maximum(np.linalg.norm(flat, axis=1, keepdims=True), 1e-30)
    return unit @ unit.T


def redundancy(similarity: np.ndarray) -> np.ndarray:
    """Per head, the largest similarity to another head."""
    off = similarity - np.eye(len(similarity)) * 2
    return off.max(axis=1)


def alignment(image_features: np.ndarray, text_embeds: np.ndarray) -> dict[str, Any]:
    """[T, d] image features and [n, d] text embeddings -> mean cosine and per image token the best match."""
    a = image_features / np.linalg.norm(image_features, axis=-1, keepdims=True)
    b = text_embeds / np.linalg.norm(text_embeds, axis=-1, keepdims=True)
    cos = a.astype(np.float64) @ b.astype(np.float64).T
    return {"mean_cosine": float(cos.mean()), "best_text_cosine_per_image_token": cos.max(axis=1).tolist()}


def layer_stats(outputs: dict[str, np.ndarray], layers: list[tuple[str, str]]) -> list[dict[str, Any]]:
    rows = []
    for i, (probs_name, y_name) in enumerate(layers):
        sim = head_similarity(outputs[y_name])
        rows.append({"layer": i, "entropy": entropy(outputs[probs_name]).tolist(),
                     "redundancy": redundancy(sim).tolist(), "similarity": sim.tolist()})
    return rows


def feature_layer_index(vision: dict[str, Any], attention_layers: int) -> int:
    """The encoder layer token_prune reads by default (the feature layer's), among the graph's Attention nodes."""
    return min(deepest_feature_layer(vision) - 1, attention_layers - 1)


def saliency(outputs: dict[str, np.ndarray], probe: ProbeSession, vision: dict[str, Any]) -> dict[str, Any]:
    """Per patch: [CLS] attention (mean over heads) at token_prune's layer, and the feature norm. The patches are
    the encoder's, so a bundle that token_prune already thinned still shows every patch's attention; its
    projector input holds only the kept tokens, so it has no norm saliency."""
    cls = int(vision["select_strategy"] == "default")
    out: dict[str, Any] = {}
    if cls and probe.layers:
        layer = feature_layer_index(vision, len(probe.layers))
        probs = outputs[probe.layers[layer][0]]
        out.update(tokens=probs.shape[-1] - cls, cls_attention=probs[0, :, 0, cls:].mean(axis=0).tolist(),
                   cls_attention_layer=layer)
    if probe.projector_input is not None:
        feats = outputs[probe.projector_input][0].astype(np.float64)
        if len(feats) == out.get("tokens", len(feats)):
            out.update(tokens=len(feats), norm=np.linalg.norm(feats, axis=-1).tolist())
    return out


def kept_patches(scores: list[float], keep: float) -> list[int]:
    """The patches token_prune keeps at `keep`: the top round(keep * n), in spatial order."""
    count = max(1, round(keep * len(scores)))
    return sorted(np.argsort(-np.asarray(scores), kind="stable")[:count].tolist())


def analyse(pipe, pixels: np.ndarray, ids: np.ndarray, threads: int | None = 1) -> dict[str, Any]:
    """Heads of the vision tower and the LLM on one request, the alignment and the saliency."""
    vision_probe = ProbeSession(pipe.path, pipe.manifest["components"]["vision"]["artifact"], threads)
    vision_out = vision_probe.run({"pixel_values": pixels})
    features = vision_out["image_features"]
    embeds = pipe.embed(ids)
    text = embeds[0][ids[0] != pipe.model["image_token_id"]]
    merged = pipe.embed(ids, features)
    llm_probe = ProbeSession(pipe.path, pipe.manifest["components"]["llm"]["artifact"], threads)
    llm_out = llm_probe.run(pipe.hf.feeds(merged, pipe.empty_cache(1), None, 0, last_only=True))
    result = {
        "vision": layer_stats(vision_out, vision_probe.layers),
        "llm": layer_stats(llm_out, llm_probe.layers),
        "alignment": alignment(features[0], text),
        "saliency": saliency(vision_out, vision_probe, pipe.model["vision"]),
    }
    for name, probe in (("vision", vision_probe), ("llm", llm_probe)):
        if not probe.layers:
            result[f"{name}_note"] = "the graph has no ONNX Attention node, so no per-head numbers"
    return result
