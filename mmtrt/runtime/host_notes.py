"""What a bundle loses on this host, said once per load: TensorRT segments that fall back to ONNX Runtime, and
int8 linears that run on ONNX Runtime's slower exact GEMM because this CPU has no VNNI (mmtrt/backends/int8_gemm.py)."""

from __future__ import annotations

import logging
from typing import Any

from mmtrt.backends.int8_gemm import uint8_note

log = logging.getLogger("mmtrt.runtime")


def log_host_notes(fallbacks: dict[str, str], manifest: dict[str, Any]) -> None:
    """A host without TensorRT is expected (info); a TensorRT host without a matching engine is worth a warning,
    since `mmtrt build-engines` fixes it; int8 linears on the slower exact GEMM are expected too (info)."""
    by_reason: dict[str, list[str]] = {}
    for segment, why in fallbacks.items():
        by_reason.setdefault(why, []).append(segment)
    for why, segments in by_reason.items():
        level = logging.INFO if why.startswith("tensorrt is not importable") else logging.WARNING
        log.log(level, "TensorRT segments %s run on ONNX Runtime: %s", ", ".join(segments), why)
    note = uint8_note(manifest)
    if note:
        log.info(note)
