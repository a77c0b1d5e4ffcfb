"""What every pass declares: a name, a typed config, the components it accepts, what it requires and provides."""

from __future__ import annotations

from typing import Any, ClassVar

from mmtrt.ir.graph import ModelIR
from mmtrt.pipeline.pass_config import PassConfig


# a component's report (what `run` returns for it) may give wall times of the pass's phases under this key: the
# compiler moves them to build_report.json, since the manifest is the bundle's identity and must not vary by run
TIMES = "times_s"


class Pass:
    """A graph pass. `run` changes the IR in place and returns what it changed, for the pass report."""

    name: ClassVar[str]
    Config: ClassVar[type[PassConfig]] = PassConfig
    components: ClassVar[tuple[str, ...]]
    requires: ClassVar[frozenset[str]] = frozenset()
    provides: ClassVar[frozenset[str]] = frozenset()
    removes: ClassVar[frozenset[str]] = frozenset()
    seals: ClassVar[frozenset[str]] = frozenset()  # components no later pass may rewrite (this one copied them)
    lossy: ClassVar[bool] = False
    # True: the pass reads its components' weights where they still refer to the source model
    # (mmtrt/ir/source_weights.py), or rewrites only the graph around them, so the runner does not take them into
    # memory first (a 7B LLM's float32 weights are 28 GB)
    reads_source_weights: ClassVar[bool] = False

    def __init__(self, config: PassConfig):
        self.config = config

    def plan_facts(self, facts: dict[str, Any]) -> dict[str, Any]:
        """The model facts after this pass, known before any export, so that shape planning and `compile --plan`
        see them (a pass that changes a fact, such as the image tokens, says so here); raises UserError when the
        pass cannot apply to this model."""
        return facts

    def run(self, ir: ModelIR) -> dict[str, Any]:
        raise NotImplementedError
