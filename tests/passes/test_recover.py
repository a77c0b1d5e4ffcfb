"""recover on zoo:tiny-llava after a crude lossy pass (every LLM weight rounded to 3 bits per tensor).

- The held-out distillation loss, measured independently here (ONNX Runtime's graphs against PyTorch's source
  logits, on train-split images neither slice of the pass saw), falls.
- Nothing but the projector's slots changes: every other initializer of every component, the graphs' nodes apart
  from those slots, and the source model's weights stay as they were.
- The written projector, loaded by parameter name into a copy of the source model, gives ONNX Runtime's vision
  output in PyTorch eager on fresh random pixels.
- The same seed gives byte-identical graphs and reports twice, after token_prune at a fixed budget (the bundle's
  content hash is a function of both; two full compiles would double this file's time).
"""

import copy
import json

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from mmtrt.errors import UserError
from mmtrt.eval import digits
from mmtrt.ir.export import VisionWithProjector
from mmtrt.ir.frontend import lower
from mmtrt.pipeline.source import source_model
from mmtrt.quant.calibration import Sequence, _llm_feeds
from mmtrt.quant.session import session
from mmtrt.recover import distill
from passes.recover.recover import Recover, RecoverConfig, find_site
from passes.vision.token_prune import TokenPrune, TokenPruneConfig

CONFIG = RecoverConfig(samples=12, heldout=6, epochs=3, batch=2, lr=3e-3)


def crude_lossy(ir) -> None:
    """Round every LLM MatMul weight to 3 bits with one scale per tensor."""
    llm = ir.components["llm"].onnx
    weights = {n.input[1] for n in llm.graph.node if n.op_type == "MatMul"}
    for t in llm.graph.initializer:
        if t.name in weights and len(t.dims) == 2:
            w = numpy_helper.to_array(t)
            scale = np.abs(w).max() / 3
            t.CopyFrom(numpy_helper.from_array((np.round(w / scale).clip(-4, 3) * scale).astype(np.float32), t.name))


@pytest.fixture(scope="module")
def lossy(tiny):
    model, processor = tiny
    ir = lower(model, processor)
    crude_lossy(ir)
    return ir


@pytest.fixture(scope="module")
def recovered(tiny, lossy):
    model, processor = tiny
    ir = copy.deepcopy(lossy)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    with source_model(model, processor):
        report = Recover(CONFIG).run(ir)
    return ir, report, weights


def _inits(model: onnx.ModelProto) -> dict[str, bytes]:
    return {t.name: t.SerializeToString() for t in model.graph.initializer}


def heldout_kl(ir, llava) -> float:
    """Mean KL(source || IR) at the prompt's last position (recover's default objective), on train-split images 40..47: the IR's whole vision,
    embed and LLM graphs in ONNX Runtime against the source's logits (from distill.samples, PyTorch eager)."""
    from mmtrt.preprocess.torchvision_transform import build_transform

    shown = digits.samples("train", 48)[40:]
    transform = build_transform(ir.components["preprocess"].spec)
    site = find_site(ir.components["vision"].onnx, llava.model.multi_modal_projector)
    teacher = distill.samples(ir, llava, site, [(img, digits.PROMPT) for img, _ in shown])
    vision, embed, llm = (session(ir.components[n].onnx) for n in ("vision", "embed", "llm"))
    token = ir.config["image_token_id"]
    values = []
    for (img, _), s in zip(shown, teacher):
        features = vision.run(None, {"pixel_values": transform(img.convert("RGB"))[None].numpy()})[0][0]
        e = embed.run(None, {"input_ids": s.ids[None]})[0][0]
        e[s.ids == token] = features
        logits = torch.from_numpy(llm.run(None, _llm_feeds(ir, [Sequence(e)]))[0][0])[-1:]
        values.append(torch.nn.functional.kl_div(logits.log_softmax(-1), s.teacher[-1:].log_softmax(-1),
                                                 log_target=True, reduction="batchmean").item())
    return float(np.mean(values))


def test_recover_reduces_the_heldout_loss(tiny, lossy, recovered):
    ir, report, _ = recovered
    before, after = heldout_kl(lossy, tiny[0]), heldout_kl(ir, tiny[0])
    print(f"held-out KL before {before:.4g}, after {after:.4g}; report {report['heldout_loss_per_epoch']}")
    assert after < 0.9 * before
    assert report["heldout_loss_after"] < report["heldout_loss_before"]
    assert report["samples"] == {"train": 12, "heldout": 6, "split": "digits train (disjoint slices)"}


def test_recover_changes_nothing_but_the_projector(tiny, lossy, recovered):
    ir, report, weights = recovered
    written = report["trained"]["projector"]
    assert len(written) == 4
    for name in ("preprocess", "embed", "llm"):
        if ir.components[name].onnx is not None:
            assert _inits(ir.components[name].onnx) == _inits(lossy.components[name].onnx)
    before, after = lossy.components["vision"].onnx.graph, ir.components["vision"].onnx.graph
    kept = _inits(ir.components["vision"].onnx)
    for name, data in _inits(lossy.components["vision"].onnx).items():
        if name in kept:
            assert kept[name] == data, name
    assert set(kept) - set(_inits(lossy.components["vision"].onnx)) == set(written)
    changed = [(a.name, list(a.input), list(b.input)) for a, b in zip(before.node, after.node) if a != b]
    assert len(before.node) == len(after.node) and len(changed) == 4
    assert all(set(new) - set(old) <= set(written) for _, old, new in changed)
    assert all(torch.equal(v, weights[k]) for k, v in tiny[0].state_dict().items())
    fitted = {n: numpy_helper.to_array(t) for n, t in zip(kept, ir.components["vision"].onnx.graph.initializer)
              if n in written}
    source = dict(tiny[0].model.multi_modal_projector.named_parameters())
    assert any(not np.allclose(fitted[f"recover.projector.{k}"], p.detach().numpy().T) for k, p in source.items())


def test_written_projector_matches_torch_eager(tiny, recovered, rng):
    ir, _, _ = recovered
    llava = copy.deepcopy(tiny[0])
    inits = {t.name: numpy_helper.to_array(t) for t in ir.components["vision"].onnx.graph.initializer}
    with torch.no_grad():
        for name, p in llava.model.multi_modal_projector.named_parameters():
            p.copy_(torch.from_numpy(inits[f"recover.projector.{name}"].T.copy()))
        v = ir.config["vision"]
        pixels = rng.standard_normal((2, *ir.components["preprocess"].outputs[0].shape[1:])).astype(np.float32)
        want = VisionWithProjector(llava, v["feature_layer"], v["select_strategy"])(torch.from_numpy(pixels)).numpy()
    got = session(ir.components["vision"].onnx).run(None, {"pixel_values": pixels})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_recover_needs_the_source_model(lossy):
    with pytest.raises(UserError, match="source model"):
        Recover(CONFIG).run(copy.deepcopy(lossy))


def test_same_seed_same_ir_and_report_after_token_prune(tiny, lossy):
    """Two runs of token_prune (fixed budget) then recover on copies of one IR: byte-identical graphs (what the
    bundle's content hash covers) and identical reports (what the manifest holds)."""
    model, processor = tiny
    config = RecoverConfig(samples=4, heldout=2, epochs=1, batch=2, lr=3e-3, seed=3)
    runs = []
    for _ in range(2):
        ir = copy.deepcopy(lossy)
        TokenPrune(TokenPruneConfig(keep=0.25)).run(ir)
        with source_model(model, processor):
            report = Recover(config).run(ir)
        runs.append(({n: c.onnx.SerializeToString() for n, c in ir.components.items() if c.onnx is not None},
                     json.dumps(report, sort_keys=True)))
    assert runs[0] == runs[1]
    assert json.loads(runs[0][1])["samples"]["train"] == 4


def test_recover_after_awq_int4_fits_through_the_matmulnbits_graph(tiny):
    """After awq_int4 (MatMulNBits LLM, int8 embedding) the student's forward pass runs the quantized graphs: the
    held-out KL, measured independently through them, falls, and the quantized graphs stay byte-identical."""
    from passes.quant.awq_int4 import AwqInt4, AwqInt4Config

    model, processor = tiny
    quantized = lower(model, processor)
    AwqInt4(AwqInt4Config(method="rtn", group_size=16, lowering="matmulnbits", embedding="int8",
                          calibration={"samples": 2, "text_windows": 1})).run(quantized)
    assert any(n.op_type == "MatMulNBits" for n in quantized.components["llm"].onnx.graph.node)
    ir = copy.deepcopy(quantized)
    with source_model(model, processor):
        report = Recover(RecoverConfig(samples=8, heldout=4, epochs=2, batch=2, lr=3e-4)).run(ir)
    before, after = heldout_kl(quantized, model), heldout_kl(ir, model)
    print(f"held-out KL before {before:.4g}, after {after:.4g}; report {report['heldout_loss_per_epoch']}")
    assert after < 0.9 * before
    for name in ("embed", "llm"):
        assert ir.components[name].onnx.SerializeToString() == quantized.components[name].onnx.SerializeToString()
