"""Writing a bundle hands each checkpoint tensor's pages back once it is widened: a mapped safetensors tensor's
pages leave the resident set and read back the same values; a tensor in the process's own memory is untouched."""

import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from mmtrt.ir import resident


def resident_mib() -> dict[str, int]:
    status = Path("/proc/self/status").read_text()
    return {k: int(re.search(rf"{k}:\s+(\d+)", status).group(1)) // 1024 for k in ("RssAnon", "RssFile")}


def test_a_mapped_tensor_leaves_the_resident_set_and_reads_back_the_same(tmp_path):
    path = tmp_path / "weights.safetensors"
    save_file({"table": torch.randn(4096, 8192, dtype=torch.bfloat16)}, path)  # 64 MiB
    table = load_file(path)["table"]
    total = table.float().sum()
    before = resident_mib()["RssFile"]
    resident.release(table)
    assert before - resident_mib()["RssFile"] >= 60
    assert table.float().sum() == total


def test_memory_of_the_process_own_is_left_alone():
    own = torch.randn(4096, 4096)  # 64 MiB, anonymous
    copy = own.clone()
    before = resident_mib()["RssAnon"]
    resident.release(own)
    assert resident_mib()["RssAnon"] >= before - 1
    assert torch.equal(own, copy)
