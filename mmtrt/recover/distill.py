"""Distillation of the IR's projector towards the source model, through the lossy LLM.

The teacher is the source PyTorch model (image features, then the LLM's logits at the prompt's positions after the
image, which is where the image's effect shows). The student is the IR as the earlier passes left it: its vision
graph up to the projector runs in ONNX Runtime (so a token-pruned graph hands the projector its kept tokens), the
projector is a PyTorch copy loaded from the graph's own weights, and the lossy LLM graph runs in ONNX Runtime for
the forward pass. ONNX Runtime gives no gradient, so the backward pass goes through the source LLM at the
student's inputs (a surrogate Jacobian: exact loss, approximate gradient). Held-out samples score the exact loss
with the lossy graph; the best projector over the epochs (including the untouched one) is what is kept.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from mmtrt.ir.export import VisionWithProjector
from mmtrt.ir.graph import ModelIR
from mmtrt.pipeline.source import frozen
from mmtrt.progress import track
from mmtrt.quant.calibration import Sequence, _llm_feeds, _tokenizer
from mmtrt.quant.session import run_with_outputs, session


@dataclass
class Site:
    """Where the projector lives in the vision graph: its input tensor, its float initializers in order (weight
    [K, N], bias, weight, bias), matched to the PyTorch projector's parameters, and the (node, input slot) that
    reads each (the exporter shares equal tensors between modules, so a slot, not a name, is the parameter)."""

    input: str
    initializers: list[str]
    slots: list[tuple[onnx.NodeProto, int]]


@dataclass
class Sample:
    x: np.ndarray               # projector input of the lossy vision graph, [1, tokens, K]
    ids: np.ndarray             # prompt ids with the IR's image-token count
    teacher: torch.Tensor       # source logits at the positions after the image, [P, V]


def load_projector(vision: onnx.ModelProto, site: Site, source_projector: torch.nn.Module) -> torch.nn.Module:
    """A PyTorch copy of the source projector holding the graph's current projector weights."""
    module = copy.deepcopy(source_projector).float()
    inits = {t.name: t for t in vision.graph.initializer}
    with torch.no_grad():
        for p, name in zip(module.parameters(), site.initializers):
            p.copy_(torch.from_numpy(numpy_helper.to_array(inits[name]).T.copy()))
    return module


def write_back(vision: onnx.ModelProto, site: Site, module: torch.nn.Module) -> list[str]:
    """The fitted weights as new initializers `recover.projector.<parameter>` read by the projector's slots; the
    old ones are dropped when nothing else reads them. Returns the new names."""
    graph, names = vision.graph, []
    for (node, k), (pname, p) in zip(site.slots, module.named_parameters()):
        names.append(f"recover.projector.{pname}")
        array = np.ascontiguousarray(p.detach().numpy().T.astype(np.float32))
        graph.initializer.append(numpy_helper.from_array(array, names[-1]))
        node.input[k] = names[-1]
    read = {i for node in graph.node for i in node.input} | {o.name for o in graph.output}
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    return names


def samples(ir: ModelIR, llava, site: Site, shown: list) -> list[Sample]:
    """For each (image, prompt): the lossy vision graph's projector input, the student's ids, the teacher's logits."""
    from mmtrt.preprocess.torchvision_transform import build_transform
    from mmtrt.runtime.image_file import open_image
    from mmtrt.runtime.prompt import format_prompt, tokenize

    facts, tokenizer = ir.config, _tokenizer(ir)
    transform = build_transform(ir.components["preprocess"].spec)
    teacher_vision = VisionWithProjector(llava, facts["vision"]["feature_layer"], facts["vision"]["select_strategy"])
    pixels = [transform(open_image(img).convert("RGB"))[None].numpy() for img, _ in shown]
    captured = run_with_outputs(ir.components["vision"].onnx, [site.input], [{"pixel_values": p} for p in pixels])
    out = []
    for (img, prompt), p, feeds in zip(shown, pixels, captured):
        text = format_prompt(tokenizer, facts["chat_template"], prompt, raw=False)
        with torch.no_grad():
            features = teacher_vision(torch.from_numpy(p))[0]
            ids = tokenize(tokenizer, text, facts["image_token"], features.shape[0])
            logits = teacher_logits(llava, torch.tensor(ids), features, facts["image_token_id"])
        student_ids = tokenize(tokenizer, text, facts["image_token"], facts["vision"]["image_tokens"])
        out.append(Sample(feeds[site.input], np.array(student_ids, np.int64), logits))
    return out


def after_image(ids: np.ndarray | torch.Tensor, image_token_id: int) -> slice:
    last = int(np.nonzero(np.asarray(ids) == image_token_id)[0].max())
    return slice(last + 1, len(ids))


def teacher_logits(llava, ids: torch.Tensor, features: torch.Tensor, image_token_id: int) -> torch.Tensor:
    embeds = llava.model.language_model.embed_tokens(ids).clone()
    embeds[ids == image_token_id] = features
    return _source_logits(llava, embeds)[after_image(ids, image_token_id)]


def _source_logits(llava, embeds: torch.Tensor) -> torch.Tensor:
    hidden = llava.model.language_model(inputs_embeds=embeds[None], use_cache=False).last_hidden_state
    return llava.lm_head(hidden)[0]


class Student:
    """The lossy IR's LLM (ONNX Runtime) fed by a PyTorch projector."""

    def __init__(self, ir: ModelIR, llava, projector: torch.nn.Module, loss: str, positions: str):
        self.ir, self.llava, self.projector, self.loss, self.positions = ir, llava, projector, loss, positions
        self.llm, self.embed = session(ir.components["llm"].onnx), session(ir.components["embed"].onnx)
        self.image_token_id = ir.config["image_token_id"]

    def _embeds(self, s: Sample) -> torch.Tensor:
        features = self.projector(torch.from_numpy(s.x))[0]
        base = torch.from_numpy(self.embed.run(None, {"input_ids": s.ids[None]})[0][0])
        mask = torch.from_numpy(s.ids == self.image_token_id)
        return base.masked_scatter(mask[:, None], features)

    def _lossy_logits(self, embeds: torch.Tensor, s: Sample) -> torch.Tensor:
        feeds = _llm_feeds(self.ir, [Sequence(embeds.detach().numpy())])
        return self._pick(torch.from_numpy(self.llm.run(None, feeds)[0][0])[after_image(s.ids, self.image_token_id)])

    def _pick(self, after: torch.Tensor) -> torch.Tensor:
        """The compared positions among those after the image: the last (where the answer is predicted) or all."""
        return after[-1:] if self.positions == "last" else after

    def loss_and_grad(self, s: Sample, lossy: torch.Tensor) -> tuple[float, torch.Tensor]:
        """The distillation loss at the lossy logits, and its gradient with respect to them."""
        lossy, teacher = lossy.detach().clone().requires_grad_(True), self._pick(s.teacher)
        with torch.enable_grad():
            if self.loss == "kl":
                value = torch.nn.functional.kl_div(lossy.log_softmax(-1), teacher.log_softmax(-1),
                                                   log_target=True, reduction="batchmean")
            else:
                value = torch.nn.functional.mse_loss(lossy, teacher)
            value.backward()
        return value.item(), lossy.grad

    def heldout_loss(self, held: list[Sample]) -> float:
        with torch.no_grad():
            return float(np.mean([self.loss_and_grad(s, self._lossy_logits(self._embeds(s), s))[0] for s in held]))

    def step(self, s: Sample) -> float:
        """Accumulate the projector's gradient for one sample through the source LLM's Jacobian."""
        embeds = self._embeds(s)
        value, grad = self.loss_and_grad(s, self._lossy_logits(embeds, s))
        with frozen(self.llava):
            surrogate = self._pick(_source_logits(self.llava, embeds)[after_image(s.ids, self.image_token_id)])
            (surrogate * grad).sum().backward()
        return value


def train(student: Student, fit: list[Sample], held: list[Sample], epochs: int, batch: int, lr: float,
          seed: int) -> dict:
    """Adam on the projector; returns the held-out loss per epoch and leaves the best epoch's weights loaded."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(student.projector.parameters(), lr=lr)
    curve = [student.heldout_loss(held)]
    best = copy.deepcopy(student.projector.state_dict())
    for _ in track(range(epochs), "recover epochs", total=epochs):
        order = torch.randperm(len(fit), generator=generator).tolist()
        for start in range(0, len(order), batch):
            optimizer.zero_grad()
            for i in order[start:start + batch]:
                student.step(fit[i])
            for p in student.projector.parameters():
                p.grad /= len(order[start:start + batch])
            optimizer.step()
        curve.append(student.heldout_loss(held))
        if curve[-1] < min(curve[:-1]):
            best = copy.deepcopy(student.projector.state_dict())
    student.projector.load_state_dict(best)
    return {"heldout_loss_per_epoch": [float(f"{c:.6g}") for c in curve], "best_epoch": int(np.argmin(curve))}
