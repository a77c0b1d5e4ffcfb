"""int8_prefill on zoo:tiny-llava's INT4 LLM: the weights it reads back are the ones ONNX Runtime's MatMulNBits
applies, its int8 products are the per-token int8 product of the smoothed weights (a numpy reference), and the
runtime (Python and C++) runs long calls on the prompt graph and short ones on the INT4 graph over one KV buffer."""

import json

import numpy as np
import onnx
import pytest

from builders import StaticCacheForm, random_image, tiny_llm_feeds
from conftest import PREFILL_RECIPE, compile_to
from cpp_harness import generate_cpp, needs_build
from mmtrt.bundle.trust import manifest_digest
from mmtrt.errors import UserError
from mmtrt.ir import spill
from mmtrt.ir.graph import Component
from mmtrt.pipeline import runner
from mmtrt.ir.rewrite import attr
from mmtrt.quant.channel_maxima import channel_maxima, layer_chunks, maxima_nodes
from mmtrt.quant.int4 import Grid
from mmtrt.quant.prefill_int8 import SEARCH_ALPHAS, effective_weight, int4_units, prefill_graph
from mmtrt.quant.quantize import Settings, quantize_component
from mmtrt.quant.session import run_with_outputs
from passes.quant.int8_prefill import search_smoothing, static_feeds

GRIDS = [(Grid(32), "symmetric"), (Grid(32, False), "int4-zero-points"), (Grid(64, False, True), "float-zero-points")]


def _quantized(bundle, grid, rng):
    """The tiny LLM with float activations in MatMulNBits (accuracy level 0), so its products are exact in fp32."""
    model = onnx.load(bundle / "llm.onnx")
    quantize_component(model, "llm", [tiny_llm_feeds(rng)], Settings("rtn", grid, False, "matmulnbits", 0, 64,
                                                                        lambda name: True))
    return model


def _captured(model, names, rng):
    return next(run_with_outputs(model, names, [tiny_llm_feeds(rng)]))


@pytest.mark.parametrize("grid", [g for g, _ in GRIDS], ids=[i for _, i in GRIDS])
def test_effective_weights_are_what_matmulnbits_applies(tiny_bundle, rng, grid):
    model = _quantized(tiny_bundle, grid, rng)
    units = int4_units(model)
    inits = {t.name: t for t in model.graph.initializer}
    assert len(units) == 7 * 4 + 1 and all((u.offsets is not None) == grid.float_zero_point for u in units)
    seen = _captured(model, [n for u in units for n in (u.input, u.output)], rng)
    for unit in units:
        x, y = seen[unit.input], seen[unit.output]
        np.testing.assert_allclose(x @ effective_weight(unit, inits), y, rtol=1e-4, atol=1e-4 * np.abs(y).max())


def _int8_reference(x, w, x_max, keep=()):
    """The per-token int8 product of x / s and s * W (SmoothQuant's s at a = 0.5, int8 per column) over the channels
    not in `keep`, each step in float32 as the ONNX operators define it, so that every code rounds as the graph's
    does; the integer sum exact, as mmtrt's sessions compute it on every host."""
    s = (np.maximum(x_max, 1e-5) ** 0.5 / np.maximum(np.abs(w).max(1), 1e-5) ** 0.5).astype(np.float32)
    inverse = (1 / s).astype(np.float32)
    inverse[list(keep)] = 0
    x = x * inverse
    rows = np.maximum(np.abs(x).max(-1, keepdims=True), np.float32(1e-30)) / np.float32(127)
    codes = np.clip(np.rint(x / rows) + 128, 0, 255).astype(np.int64) - 128
    w = w * s[:, None]
    w[list(keep)] = 0
    cols = np.where(np.abs(w).max(0) > 0, np.abs(w).max(0) / np.float32(127), np.float32(1))
    q = np.clip(np.rint(w / cols), -127, 127).astype(np.int64)
    return (codes @ q).astype(np.float32) * rows * cols


def test_prompt_graph_runs_the_smoothed_int8_product(tiny_bundle, rng):
    model = _quantized(tiny_bundle, Grid(64, False, True), rng)
    inits = {t.name: t for t in model.graph.initializer}
    units = {u.name: u for u in int4_units(model)}
    x_max = {u.input: rng.uniform(0.1, 3, size=attr(u.node, "K")).astype(np.float32) for u in units.values()}
    graph, report = prefill_graph(model, lambda name: name != "llm.lm_head", x_max, 0.5)
    ops = [n.op_type for n in graph.graph.node]
    assert report["linears"] == [name for name in units if name != "llm.lm_head"]
    assert ops.count("MatMulNBits") == 1 and ops.count("MatMulIntegerToFloat") == 7 * 4
    assert [n.name for n in graph.graph.node if n.name.endswith(".offsets")] == ["llm.lm_head.offsets"]
    names = [n for name in report["linears"] for n in (units[name].input, units[name].output)]
    seen = _captured(graph, names, rng)
    for name in report["linears"]:
        unit = units[name]
        w = effective_weight(unit, inits)
        ref = _int8_reference(seen[unit.input].reshape(-1, w.shape[0]), w, x_max[unit.input])
        ours = seen[unit.output].reshape(ref.shape)
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-7 * np.abs(ref).max())


def test_kept_channels_are_a_float_product_beside_the_int8_one(tiny_bundle, rng):
    model = _quantized(tiny_bundle, Grid(64, False, True), rng)
    inits = {t.name: t for t in model.graph.initializer}
    units = {u.name: u for u in int4_units(model)}
    x_max = {u.input: rng.uniform(0.1, 3, size=attr(u.node, "K")).astype(np.float32) for u in units.values()}
    down = [name for name in units if name.endswith("down_proj")]
    graph, report = prefill_graph(model, lambda name: name != "llm.lm_head", x_max, 0.5,
                                  lambda name: 5 if name in down else 0)
    assert report["float_channels"] == {name: 5 for name in down}
    seen = _captured(graph, [n for name in down for n in (units[name].input, units[name].output)], rng)
    for name in down:
        unit = units[name]
        w, x = effective_weight(unit, inits), seen[unit.input].reshape(-1, attr(unit.node, "K"))
        keep = np.sort(np.argsort(-x_max[unit.input])[:5])
        ref = _int8_reference(x, w, x_max[unit.input], keep) + x[:, keep] @ w[keep]
        ours = seen[unit.output].reshape(ref.shape)
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6 * np.abs(ref).max())


OUTLIERS = [5, 40, 97]  # channels of the embeddings 20x the others, as LLM activations have a few


def _outlier_feeds(rng, tokens):
    """A prompt of `tokens` random embeddings with outlier channels, every position's logits."""
    feeds = {"inputs_embeds": rng.normal(size=(1, tokens, 128)).astype(np.float32),
             "attention_mask": np.ones((1, tokens), np.int64), "position_ids": np.arange(tokens)[None],
             "logits_from": np.zeros(1, np.int64)}
    feeds["inputs_embeds"][..., OUTLIERS] *= 20
    feeds.update({f"past.{i}.{kind}": np.zeros((1, 2, 0, 32), np.float32)
                  for i in range(4) for kind in ("key", "value")})
    return feeds


def test_the_searched_smoothing_gets_most_of_the_grids_gain_on_held_out_prompts(tiny_bundle, rng):
    """The a searched on calibration prompts (hidden states against the INT4 graph's, scored on prompts its channel
    maxima did not come from) closes at least two thirds of the gap between the grid's worst and best a in the
    logits' error on fresh prompts; and the choice matters. (Near the best a the error is flat, so the searched a
    and the held-out best are often a step apart, and were two steps apart in 1 run of 80: the gap is the measure.)"""
    model = _quantized(tiny_bundle, Grid(32), rng)
    select = lambda name: name != "llm.lm_head"  # noqa: E731
    inputs = sorted({u.input for u in int4_units(model) if select(u.name)})
    calibration = [_outlier_feeds(rng, 128) for _ in range(8)]
    x_max, alpha, errors = search_smoothing(model, select, inputs, calibration)
    assert sorted(errors) == list(SEARCH_ALPHAS) and errors[alpha] == min(errors.values())
    whole = channel_maxima(model, inputs, calibration)
    assert all(np.array_equal(x_max[name], whole[name]) for name in inputs)  # the graph's maxima are all prompts'

    held_out = [_outlier_feeds(rng, 96) for _ in range(4)]
    want = [out["logits"] for out in run_with_outputs(model, ["logits"], held_out)]
    held = {}
    for a in SEARCH_ALPHAS:
        graph, report = prefill_graph(model, select, x_max, a)
        assert report["smoothing"] == a
        got = run_with_outputs(graph, ["logits"], held_out)
        held[a] = sum(float(np.square(out["logits"] - w).sum()) for out, w in zip(got, want))
    best, worst = min(held.values()), max(held.values())
    assert worst - held[alpha] >= 2 / 3 * (worst - best), (alpha, held)
    assert worst > 1.2 * best, held


def test_channel_maxima_are_the_captured_inputs_maxima_and_leave_the_graph_as_it_was(tiny_bundle, rng):
    model = _quantized(tiny_bundle, Grid(32), rng)
    inputs = sorted({u.input for u in int4_units(model)})
    feeds = [_outlier_feeds(rng, 40), _outlier_feeds(rng, 24)]
    before = model.SerializeToString()
    maxima = channel_maxima(model, inputs, feeds)
    assert model.SerializeToString() == before
    seen = list(run_with_outputs(model, inputs, feeds))
    for name in inputs:
        want = np.max([np.abs(out[name]).reshape(-1, out[name].shape[-1]).max(0) for out in seen], axis=0)
        np.testing.assert_array_equal(maxima[name], want)


def test_channel_maxima_run_a_decoder_layer_at_a_time(tiny_bundle, rng):
    """The inputs are reduced in stages cut after narrowing linears (down projections, and the tiny LLM's GQA k and
    v projections), so no stage reads two layers' inputs and a stage holds about one layer's weights."""
    model = _quantized(tiny_bundle, Grid(32), rng)
    units = int4_units(model)
    _, reduced = maxima_nodes(sorted({u.input for u in units}))
    chunks = layer_chunks(model, reduced)
    layer = {u.input: u.name.split(".")[2] for u in units if u.name.startswith("llm.layers.")}
    owners = [{layer.get(name, "lm_head") for name, m in reduced.items() if m in chunk} for chunk in chunks]
    assert all(len(o) == 1 for o in owners), owners
    assert len(chunks) >= len({*layer.values()}) + 1 and sorted(m for c in chunks for m in c) == sorted(reduced.values())


def test_calibration_prompts_share_one_empty_cache_that_no_stage_writes(tiny_prefill_bundle, rng):
    """The static graph's feeds hold one read-only zero buffer per shape, whatever the layers and prompts; the
    maxima through them are those through a writable buffer per input, and the buffers stay zeros."""
    llm = Component("llm", [], [])
    llm.set_graph(onnx.load(tiny_prefill_bundle / "llm.onnx"))
    units = int4_units(llm.onnx)
    inputs = sorted({u.input for u in units})
    batches = [{"inputs_embeds": rng.normal(size=(1, n, 128)).astype(np.float32),
                "position_ids": np.arange(n, dtype=np.int64)[None]} for n in (9, 13, 9)]
    empty = {}
    shared = [static_feeds(llm, b, empty) for b in batches]
    own = [{k: v.copy() for k, v in f.items()} for f in shared]
    pasts = [v for f in shared for k, v in f.items() if k.startswith("past.")]
    assert len(pasts) == 3 * 8 and len({id(v) for v in pasts}) == len(empty) == 2
    got, want = channel_maxima(llm.onnx, inputs, shared), channel_maxima(llm.onnx, inputs, own)
    assert sorted(got) == inputs and all(np.array_equal(got[n], want[n]) for n in inputs)
    assert all(not v.flags.writeable and not v.any() for v in empty.values())


def test_outlier_channels_kept_in_float_cut_the_error_on_held_out_prompts(tiny_bundle, rng):
    """Unsmoothed, a row's int8 step follows its outlier channels; the three channels of the largest calibration
    maxima multiplied in float32 take the logits' error on fresh prompts well below the int8 product's alone."""
    model = _quantized(tiny_bundle, Grid(32), rng)
    select = lambda name: name != "llm.lm_head"  # noqa: E731
    inputs = sorted({u.input for u in int4_units(model) if select(u.name)})
    x_max = channel_maxima(model, inputs, [_outlier_feeds(rng, 128) for _ in range(4)])
    held_out = [_outlier_feeds(rng, 96) for _ in range(4)]
    want = [out["logits"] for out in run_with_outputs(model, ["logits"], held_out)]
    error = {}
    for kept in (0, 3):
        graph, _ = prefill_graph(model, select, x_max, None, lambda name: kept)
        got = run_with_outputs(graph, ["logits"], held_out)
        error[kept] = sum(float(np.square(out["logits"] - w).sum()) for out, w in zip(got, want))
    assert error[3] < error[0] / 2, error


def test_a_search_on_one_prompt_names_the_data_it_needs(tiny_bundle, rng):
    model = _quantized(tiny_bundle, Grid(32), rng)
    inputs = sorted({u.input for u in int4_units(model)})
    with pytest.raises(UserError, match="at least 2 calibration prompts.*calibration.samples"):
        search_smoothing(model, lambda name: True, inputs, [_outlier_feeds(rng, 16)])


def test_long_calls_run_the_prompt_graph_and_short_ones_the_int4_graph(tiny_prefill_bundle, rng):
    from mmtrt.runtime import load

    manifest = json.loads((tiny_prefill_bundle / "manifest.json").read_text())
    assert manifest["model"]["prefill"] == {"component": "llm_prefill", "min_tokens": 4}
    llm, capacity = manifest["model"]["llm"], manifest["dims"]["capacity"]["max"]
    stepper = load(tiny_prefill_bundle).stepper
    forms = {"prompt": StaticCacheForm(tiny_prefill_bundle / "llm_prefill.onnx", llm, capacity),
             "int4": StaticCacheForm(tiny_prefill_bundle / "llm.onnx", llm, capacity)}
    stepper.reset(1)
    for seq, graph in ((9, "prompt"), (1, "int4"), (3, "int4"), (4, "prompt")):
        embeds = rng.normal(size=(1, seq, llm["hidden_size"])).astype(np.float32)
        ours = stepper.run(embeds, 0, 1, last_only=False)
        expected = {name: form.step(embeds) for name, form in forms.items()}
        np.testing.assert_allclose(ours, expected[graph], rtol=1e-5, atol=1e-5)
        assert not np.allclose(expected["prompt"], expected["int4"], rtol=1e-5, atol=1e-5)
        for name, form in forms.items():  # both references follow the cache the bundle's step wrote
            for past, buffer in form.cache.items():
                buffer[...] = forms[graph].cache[past]


def test_int8_weights_join_the_prompt_graph_in_the_scratch_file_as_they_are_made(tiny_bundle, rng, tmp_path,
                                                                                   monkeypatch):
    """Where no pass after int8_prefill lists the LLM (`spill.as_made`), each int8 weight of the prompt graph goes
    to the scratch file as its linear is made, not with the whole graph at the end of the pass: a 7B LLM's int8
    copy is 6.5 GB. The graph and its report are the same bytes."""
    from mmtrt.ir import source_weights

    monkeypatch.setattr(spill, "MIN_BYTES", 1024)
    model = _quantized(tiny_bundle, Grid(32), rng)
    x_max = {u.input: rng.uniform(0.1, 3, size=attr(u.node, "K")).astype(np.float32) for u in int4_units(model)}

    def prompt_graph(as_made: bool):
        with source_weights.kept(), spill.scratch(tmp_path), spill.as_made([model] if as_made else []):
            graph, report = prefill_graph(model, lambda name: name != "llm.lm_head", x_max, 0.5,
                                          made=lambda tensor: spill.made(model, tensor))
            moved = sorted(t.name for t in graph.graph.initializer if source_weights.is_reference(t))
            source_weights.materialize(graph)
        return moved, graph.SerializeToString(), report

    (moved, made, report), (kept, whole, whole_report) = prompt_graph(True), prompt_graph(False)
    assert kept == [] and made == whole and report == whole_report
    assert moved == sorted(f"{name}.prefill_int8" for name in report["linears"]) and len(moved) == 7 * 4


def test_a_second_compile_spilling_every_weight_writes_the_same_bundle(tiny_prefill_bundle, tmp_path, monkeypatch):
    """Recompiled with every weight, however small, moved to the scratch file once no later pass lists its
    component (the vision tower's after awq_int4, read back by int8_prefill's calibration sessions; both LLM graphs'
    by the writer), the bundle is the same: the manifest is the bundle's identity, and the calibrated passes' wall
    times go to the build report instead."""
    moved = []
    monkeypatch.setattr(spill, "MIN_BYTES", 1)
    monkeypatch.setattr(runner, "spill", lambda comp: moved.append(spill.spill(comp)))
    again = compile_to(tmp_path, PREFILL_RECIPE.format(
        tail="  - int8_prefill: {min_tokens: 4, calibration: {samples: 2, text_windows: 1}}\n"), "again.bundle")
    assert manifest_digest(again) == manifest_digest(tiny_prefill_bundle)
    assert moved[0] > 0 and moved[-1] > 0 and set(tmp_path.iterdir()) == {tmp_path / "recipe.yaml", again}
    phases = json.loads((again / "build_report.json").read_text())["pass_phase_times_s"]
    assert set(phases) == {"0:awq_int4"} and set(phases["0:awq_int4"]["llm"]) == {"calibration", "search_and_rewrite"}


@needs_build
def test_the_cpp_runtime_gives_the_python_runtime_tokens(tiny_prefill_bundle, rng, tmp_path):
    from mmtrt.runtime import load

    image = tmp_path / "image.png"
    random_image(rng, int(rng.integers(24, 140)), int(rng.integers(24, 140))).save(image)
    prompt = "What is in the picture?"
    ours = generate_cpp(tiny_prefill_bundle, image, prompt)
    theirs = load(tiny_prefill_bundle, threads=1).generate(image, prompt).to_json()
    assert ours["token_ids"] == theirs["token_ids"] and ours["text"] == theirs["text"]
    assert ours["backends"] == {**theirs["backends"], "preprocess": "cpp"} and "llm_prefill" in ours["backends"]


@pytest.mark.parametrize("tail,problem", [
    ("  - int8_prefill: {}\n  - fuse_projections: {}\n", "after int8_prefill copied it"),
])
def test_a_pass_after_it_on_the_llm_is_refused(tmp_path, tail, problem):
    with pytest.raises(UserError, match=problem):
        compile_to(tmp_path, PREFILL_RECIPE.format(tail=tail))


def test_it_needs_the_static_layout(tmp_path):
    recipe = PREFILL_RECIPE.format(tail="  - int8_prefill: {}\n").replace("{layout: static}", "{layout: paged}")
    with pytest.raises(UserError, match="static KV buffer"):
        compile_to(tmp_path, recipe)
