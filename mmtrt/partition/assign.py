"""Assign each component a backend from the recipe's policy and what this host can run, with the reason."""

from __future__ import annotations

from mmtrt.backends import unavailable_reason
from mmtrt.errors import UserError
from mmtrt.recipe import PartitionPolicy

# Which backends can run which kind of component at all, whatever the host.
CAPABLE = {
    "preprocess": {"torchvision"},
    "vision": {"onnxruntime", "tensorrt"},
    "embed": {"onnxruntime", "tensorrt"},
    "llm": {"onnxruntime", "tensorrt", "tensorrt-llm"},
}


def assign_backends(policy: PartitionPolicy, components: list[str], probe=unavailable_reason) -> dict[str, dict]:
    """One partition per component: the preferred backend, the chosen one, and why."""
    partitions = {}
    for comp in components:
        candidates = getattr(policy, comp)
        skipped = []
        for backend in candidates:
            if backend not in CAPABLE[comp]:
                skipped.append(f"{backend}: cannot run the {comp} component")
                continue
            why_not = probe(backend)
            if why_not is None:
                break
            skipped.append(f"{backend}: {why_not}")
        else:
            raise UserError(f"no backend in partition.{comp} ({', '.join(candidates)}) can run on this host: "
                            f"{'; '.join(skipped)}; add onnxruntime to partition.{comp}")
        reason = "preferred backend, available" if not skipped else "; ".join(skipped) + f"; fell back to {backend}"
        partitions[comp] = {"component": comp, "preferred": candidates[0], "chosen": backend,
                            "candidates": list(candidates), "reason": reason}
    return partitions
