"""What the vLLM test modules share: the skip where `make vllm-env` has made no vLLM environment, one vLLM process
per module, and a bundle served with vLLM as its LLM."""

from __future__ import annotations

import pytest

from mmtrt.errors import UserError
from mmtrt.handoff.hf_export import export_hf
from mmtrt.handoff.vllm_env import vllm_python
from mmtrt.handoff.vllm_pipeline import load as load_vllm
from mmtrt.handoff.vllm_process import VllmProcess


def require_vllm() -> None:
    """Skip the calling module where there is no vLLM environment."""
    try:
        vllm_python()
    except UserError as exc:
        pytest.skip(f"no vLLM environment: {exc}", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def worker():
    """vLLM's process, started before the module's other fixtures: it imports vLLM while the bundle compiles."""
    process = VllmProcess()
    yield process
    process.close()


def split_pipeline(worker: VllmProcess, bundle, folder):
    """`bundle` exported to `folder` and loaded with vLLM, in `worker`, as its LLM."""
    export_hf(bundle, folder)
    return load_vllm(bundle, folder, engine=worker)
