"""`compile --plan` reads configs and the processor only (a zoo model's weights are never built for it), it
sees the same model facts a build gives, and a compile builds the model once."""

import mmtrt.zoo
from conftest import compile_to
from mmtrt.compiler import make_plan
from mmtrt.ir.frontend import model_facts
from mmtrt.ir.preprocess import spec_from_image_processor
from mmtrt.zoo.tiny_llava import build_tiny_llava, describe_tiny_llava

RECIPE = ("model: {source: zoo, name: tiny-llava}\n"
          "envelope: {prompt_tokens: {min: 1, opt: 8, max: 32}, max_new_tokens: 4}\n")


def facts(config, generation, processor):
    return model_facts(config, generation, processor, spec_from_image_processor(processor.image_processor))


def test_described_facts_are_the_built_models(tiny):
    model, processor = tiny
    assert facts(*describe_tiny_llava()) == facts(model.config, model.generation_config, processor)
    gemma, gemma_processor = build_tiny_llava(llm="gemma", head_dim=48)
    assert facts(*describe_tiny_llava(llm="gemma", head_dim=48)) == facts(
        gemma.config, gemma.generation_config, gemma_processor)


def test_plan_builds_no_weights_and_compile_builds_once(tmp_path, monkeypatch):
    built = []
    real = mmtrt.zoo.build_zoo_model
    monkeypatch.setattr(mmtrt.zoo, "build_zoo_model", lambda name: built.append(name) or real(name))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE)
    plan = make_plan(recipe)
    assert built == [] and plan.facts["vision"]["image_tokens"] == 64
    compile_to(tmp_path, RECIPE)
    assert built == ["tiny-llava"]
