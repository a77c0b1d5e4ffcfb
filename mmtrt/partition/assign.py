"""Assign each component the backend the bundle plans for its target, from the recipe alone.

The plan never looks at the compiling host: the same recipe gives the same manifest on a laptop and on a GPU
server, and a recipe that lists only `tensorrt` compiles anywhere. What a given host can run is the runtime's
decision at load time (`mmtrt.runtime.host`), which `mmtrt inspect` reports as "this host: ...".
"""

from __future__ import annotations

from mmtrt.errors import UserError
from mmtrt.recipe import PartitionPolicy

# Which backends can run which kind of component at all, whatever the host.
CAPABLE = {
    "preprocess": {"torchvision"},
    "vision": {"onnxruntime", "tensorrt"},
    "embed": {"onnxruntime", "tensorrt"},
    "llm": {"onnxruntime", "tensorrt", "tensorrt-llm"},
}


def assign_backends(policy: PartitionPolicy, components: list[str]) -> dict[str, dict]:
    """One partition per component: the candidates, the first that can run the component (planned), and why."""
    partitions = {}
    for comp in components:
        candidates = getattr(policy, comp)
        capable = [b for b in candidates if b in CAPABLE[comp]]
        if not capable:
            raise UserError(f"no backend in partition.{comp} ({', '.join(candidates)}) can run the {comp} component; "
                            f"use {' or '.join(sorted(CAPABLE[comp]))}")
        skipped = [f"{b}: cannot run the {comp} component" for b in candidates[:candidates.index(capable[0])]]
        reason = "; ".join([*skipped, f"planned {capable[0]}"]) if skipped else "first backend listed"
        partitions[comp] = {"component": comp, "candidates": list(candidates), "planned": capable[0],
                            "reason": reason}
    return partitions
