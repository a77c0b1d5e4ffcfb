"""The pass machinery: registry, typed configs, requires/provides at plan time, the verifier after every pass."""

import copy

import numpy as np
import onnx
import pytest

from mmtrt.errors import UserError
from mmtrt.ir import source_weights, spill
from mmtrt.ir.frontend import COMPONENTS, FRONTEND_PROPERTIES, lower
from mmtrt.pipeline.instruments import Timer, Verify, VerificationError, verify_ir
from mmtrt.pipeline.pass_base import Pass, PassConfig
from mmtrt.pipeline.registry import get_pass, registered_passes
from mmtrt.pipeline.runner import plan_passes, run_passes
from mmtrt.recipe import Recipe


def recipe(*passes):
    return Recipe.model_validate({"model": {"source": "zoo", "name": "tiny-llava"}, "passes": list(passes)})


def test_registry_finds_the_shipped_passes_by_entry_point():
    assert {"graph_cleanup", "dead_layer_elimination"} <= set(registered_passes())
    with pytest.raises(UserError, match="available passes: .*graph_cleanup"):
        get_pass("graph_clean")


def test_plan_tracks_properties_through_the_list():
    plan = plan_passes(recipe({"dead_layer_elimination": {}}, {"graph_cleanup": {}}), set(FRONTEND_PROPERTIES), set(COMPONENTS))
    assert [p.name for p in plan.passes] == ["dead_layer_elimination", "graph_cleanup"]
    assert "vision.hidden_state_stack" not in plan.properties_after
    with pytest.raises(UserError, match="requires vision.hidden_state_stack"):
        plan_passes(recipe({"dead_layer_elimination": {}}), set(), set(COMPONENTS))
    with pytest.raises(UserError, match="lacks"):
        plan_passes(recipe({"dead_layer_elimination": {}}), set(FRONTEND_PROPERTIES), {"llm"})


def test_pass_config_is_typed_and_strict():
    with pytest.raises(UserError, match="fold_constants"):
        plan_passes(recipe({"graph_cleanup": {"fold_constant": False}}), set(), set(COMPONENTS))
    with pytest.raises(UserError, match="passes\\[0\\]"):
        plan_passes(recipe({"graph_cleanup": {"fold_constants": "maybe"}}), set(), set(COMPONENTS))


@pytest.fixture(scope="module")
def tiny_ir(tiny):
    return lower(*tiny)


class BreaksTheContract(Pass):
    """Renames the vision output in a still valid graph: the verifier must stop the pipeline."""

    name = "breaks_the_contract"
    components = ("vision",)

    def run(self, ir):
        graph = ir.components["vision"].onnx.graph
        graph.node.append(onnx.helper.make_node("Identity", [graph.output[0].name], ["renamed"]))
        graph.output[0].name = "renamed"
        return {}


def test_verifier_stops_a_pass_that_breaks_the_contract(tiny_ir):
    ir = copy.deepcopy(tiny_ir)
    verify_ir(ir)
    with pytest.raises(VerificationError, match="differ from the contract"):
        run_passes([BreaksTheContract(PassConfig())], ir, [Timer(), Verify()])


def test_verifier_catches_an_invalid_graph(tiny_ir):
    ir = copy.deepcopy(tiny_ir)
    ir.components["llm"].onnx.graph.node[0].input[0] = "no_such_tensor"
    with pytest.raises(VerificationError, match="llm"):
        verify_ir(ir)


def test_reports_count_nodes_and_params_and_time(tiny_ir):
    ir = copy.deepcopy(tiny_ir)
    reports = run_passes([get_pass("dead_layer_elimination")(PassConfig())], ir, [Timer(), Verify()])
    vision = reports[0]["components"]["vision"]
    assert vision["nodes_after"] < vision["nodes_before"] and vision["params_after"] < vision["params_before"]
    assert reports[0]["time_ms"] >= 0 and reports[0]["lossy"] is False
    assert isinstance(onnx.checker.check_model(ir.components["vision"].onnx), type(None))


class MakesAWeight(Pass):
    """Makes a vision weight as a rounding pass does, through `spill.made`; records whether it joined as a reference."""

    name = "makes_a_weight"
    components = ("vision",)
    joined: list[bool] = []

    def run(self, ir):
        model = ir.components["vision"].onnx
        tensor = onnx.numpy_helper.from_array(np.arange(1 << 18, dtype=np.float32), "made_weight")
        spill.made(model, tensor)
        model.graph.initializer.append(tensor)
        MakesAWeight.joined.append(source_weights.is_reference(tensor))
        return {}


class ListsVision(Pass):
    name = "lists_vision"
    components = ("vision",)

    def run(self, ir):
        return {}


def test_a_weight_made_by_the_last_pass_on_its_component_joins_the_graph_in_the_scratch_file(tiny_ir, tmp_path):
    """The runner lets a pass move the weights it makes to the scratch file only where no later pass lists their
    component (a later pass may edit them in place); either way the graph holds the same values."""
    MakesAWeight.joined.clear()
    for later in ([ListsVision(PassConfig())], []):
        ir = copy.deepcopy(tiny_ir)
        with source_weights.kept(), spill.scratch(tmp_path):
            run_passes([MakesAWeight(PassConfig()), *later], ir, [])
            made = next(t for t in ir.components["vision"].onnx.graph.initializer if t.name == "made_weight")
            assert np.array_equal(source_weights.array(made), np.arange(1 << 18, dtype=np.float32))
    assert MakesAWeight.joined == [False, True]
