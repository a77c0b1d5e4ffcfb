"""`mmtrt inspect --placement`: segments per component and the reason for every fallback."""

import json
import re

from conftest import compile_to
from mmtrt.cli import main


def test_demo_bundle_placement(tiny_bundle, capsys):
    assert main(["inspect", str(tiny_bundle), "--placement"]) == 0
    out = capsys.readouterr().out
    for comp in ("vision", "llm"):
        m = re.search(rf"^{comp}: 1 segment\(s\), (\d+)/(\d+) nodes in TensorRT$", out, re.M)
        assert m and m.group(1) == m.group(2), out
    assert "embed.0      onnxruntime" in out
    assert "onnxruntime because partition.embed does not list tensorrt: node_embedding (Gather)" in out
    assert "in:  pixel_values float32[num_images,3,64,64]" in out
    assert "tensorrt-llm" not in out  # a plain recipe plans no TensorRT-LLM engine


def test_an_opted_in_bundle_shows_the_trtllm_build_command(tiny_trtllm_bundle, capsys):
    assert main(["inspect", str(tiny_trtllm_bundle), "--placement"]) == 0
    assert "tensorrt-llm (llm): trtllm-build --checkpoint_dir BUNDLE/trtllm/checkpoint" in capsys.readouterr().out


def test_placement_json(tiny_bundle, capsys):
    assert main(["inspect", str(tiny_bundle), "--placement", "--json"]) == 0
    sections = json.loads(capsys.readouterr().out)
    assert set(sections) == {"placement", "tensorrt", "tensorrt_llm"}
    assert [s["id"] for s in sections["tensorrt"]["segments"]] == ["vision.0", "llm.0"]


def test_a_tensorrt_island_too_small_is_explained(tmp_path, capsys):
    bundle = compile_to(tmp_path, "model: {source: zoo, name: tiny-llava}\n"
                                  "partition: {embed: [tensorrt, onnxruntime], min_segment_size: 2}\n")
    assert main(["inspect", str(bundle), "--placement"]) == 0
    out = capsys.readouterr().out
    assert ("onnxruntime because its TensorRT segment has 1 nodes, fewer than partition.min_segment_size 2: "
            "node_embedding (Gather)") in out
