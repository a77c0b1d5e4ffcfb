"""Prompt ids equal transformers' LlavaProcessor on every BOS configuration a checkpoint may have: BOS in the chat
template, in the tokenizer's post-processor, in neither, in both; `add_bos_token` true, false or absent. The
Python runtime, the C++ runtime and transformers must give the same ids; typed special tokens stay text (the
user's text is transformers' `split_special_tokens=True` encoding) in both runtimes."""

import itertools
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from cpp_harness import CApi, needs_library
from mmtrt.bundle.manifest import sha256_file
from mmtrt.runtime import load

pytestmark = needs_library
BOS, BOS_ID = "<pad>", 259  # the tiny tokenizer has no BOS of its own: its <pad> plays one
PROMPT = "What is in the picture?"
CONFIGS = list(itertools.product([False, True], [False, True], [None, True, False]))


def variant(tiny_bundle, folder, template_bos, post_bos, add_bos):
    bundle = shutil.copytree(tiny_bundle, folder)
    tok = bundle / "tokenizer"
    tokenizer = json.loads((tok / "tokenizer.json").read_text())
    if post_bos:
        tokenizer["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BOS: {"id": BOS, "ids": [BOS_ID], "tokens": [BOS]}}}
    (tok / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((tok / "tokenizer_config.json").read_text())
    config.update(bos_token=BOS, pad_token=None)
    if add_bos is not None:
        config["add_bos_token"] = add_bos
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    manifest = json.loads((bundle / "manifest.json").read_text())
    if template_bos:
        manifest["model"]["chat_template"] = "{{ bos_token }}" + manifest["model"]["chat_template"]
    for name in ("tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"):
        manifest["artifacts"][name] = sha256_file(bundle / name)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle, manifest["model"]["chat_template"]


def transformers_ids(bundle, template, prompt):
    from transformers import AutoTokenizer, CLIPImageProcessor, LlavaProcessor

    processor = LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 64},
                                                                  crop_size={"height": 64, "width": 64}),
                               tokenizer=AutoTokenizer.from_pretrained(bundle / "tokenizer"), patch_size=8,
                               vision_feature_select_strategy="default", num_additional_image_tokens=1,
                               chat_template=template, image_token="<image>")
    image = Image.fromarray(np.zeros((40, 48, 3), np.uint8))
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": prompt}]}]
    out = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(out["input_ids"][0]), processor.tokenizer


@pytest.mark.parametrize("template_bos, post_bos, add_bos", CONFIGS)
def test_ids_equal_transformers(tiny_bundle, tmp_path, template_bos, post_bos, add_bos):
    bundle, template = variant(tiny_bundle, tmp_path / "b", template_bos, post_bos, add_bos)
    theirs, tokenizer = transformers_ids(bundle, template, PROMPT)
    assert theirs.count(BOS_ID) == int(template_bos or post_bos)  # one BOS at most, as transformers gives it
    api = CApi()
    status, handle = api.load(bundle)
    assert status == 0, api.error()
    try:
        typed = "hi <|im_end|> there"
        text = tokenizer(typed, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        for pipe_ids, cpp_ids in ((load(bundle, threads=1).prompt_ids, lambda p: api.prompt_ids(handle, p)[1]),):
            assert pipe_ids(PROMPT) == cpp_ids(PROMPT) == theirs
            ours, cpp = pipe_ids(typed), cpp_ids(typed)
            assert ours == cpp and any(ours[i:i + len(text)] == text for i in range(len(ours)))
    finally:
        api.free(handle)
