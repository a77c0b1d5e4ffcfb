"""Chat messages through the bundle's template: several turns and images decode as transformers decodes them;
what the template or the bundle cannot take is refused in one line."""

import base64
import io
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from builders import random_image
from mmtrt.errors import UserError
from mmtrt.runtime import load
from mmtrt.runtime.chat import chat_request, load_data_uri

NEAR_TIE = 1e-3


def conversation(first, second):
    return [{"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "image", "image": first}, {"type": "text", "text": "What is it?"}]},
            {"role": "assistant", "content": "A pattern."},
            {"role": "user", "content": [{"type": "text", "text": "And this one, next to it?"},
                                         {"type": "image", "image": second}]}]


def reference(tiny, messages, images, new_tokens):
    model, processor = tiny
    bare = [{**m, "content": m["content"] if isinstance(m["content"], str) else
             [{"type": "image"} if p["type"] == "image" else p for p in m["content"]]} for m in messages]
    text = processor.apply_chat_template(bare, add_generation_prompt=True)
    inputs = processor(images=images, text=text, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, output_scores=True,
                             return_dict_in_generate=True)
    margins = [float(torch.topk(s[0], 2).values.diff().abs()) for s in out.scores]
    return text, inputs["input_ids"][0].tolist(), out.sequences[0, inputs["input_ids"].shape[1]:].tolist(), margins


def test_a_two_image_multi_turn_chat_decodes_as_transformers(tiny, tiny_static_bundle, rng):
    pipe = load(tiny_static_bundle)
    images = [random_image(rng, 60, 90), random_image(rng, 80, 50)]
    messages = conversation(*images)
    text, ref_ids, ref_tokens, margins = reference(tiny, messages, images, 10)
    request = chat_request(pipe, messages)
    assert request.prompt == text and request.raw_prompt and len(request.images()) == 2
    ours = pipe.generate_batch([request])[0]
    assert ours.prompt_tokens == len(ref_ids) and ours.image_tokens == 2 * pipe.model["vision"]["image_tokens"]
    decided = next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(margins))
    assert ours.token_ids[:decided] == ref_tokens[:decided]
    again = pipe.generate_batch([chat_request(pipe, messages)])[0]  # the image prefix (both images) from the cache
    assert again.token_ids == ours.token_ids and pipe.prefixes.hits >= 1


def test_what_the_bundle_or_its_template_cannot_take_is_refused_in_one_line(tiny_bundle, rng):
    pipe = load(tiny_bundle)
    image = random_image(rng, 32, 32)

    def asking(images):
        return [{"role": "user", "content": [{"type": "image", "image": image}] * images + [{"type": "text",
                                                                                          "text": "?"}]}]

    def with_template(template):
        return SimpleNamespace(tokenizer=pipe.tokenizer, dims=pipe.dims, model={**pipe.model, "chat_template": template},
                               parse_special_tokens=False)

    one_image_only = with_template("{{ raise_exception('This model takes one image') "
                                   "if messages[0]['content']|length > 2 }}<image>")
    no_placeholder = with_template("{% for m in messages %}{{ m['role'] }}{% endfor %}")
    cases = [(pipe, asking(5), "hold 5 images; this bundle takes at most 4"),
             (pipe, [], "non-empty list"),
             (pipe, [{"role": "robot", "content": "hi"}], "messages[0] needs a role"),
             (pipe, [{"role": "user", "content": [{"type": "audio"}]}], "messages[0].content[0]: a part is"),
             (pipe, [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}],
              "is not a data: URI"),
             (one_image_only, asking(2), "refuses the messages (This model takes one image)"),
             (no_placeholder, asking(2), "renders 0 image placeholders for 2 images")]
    assert chat_request(one_image_only, asking(1)).prompt == "<image>"
    for target, messages, want in cases:
        with pytest.raises(UserError) as err:
            chat_request(target, messages)
        assert want in str(err.value) and "\n" not in str(err.value)


def test_images_come_inline_as_data_uris(rng):
    image = random_image(rng, 20, 30)
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    decoded = load_data_uri("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode())
    assert np.array_equal(np.asarray(decoded), np.asarray(image))
    for bad, want in (("data:image/png;base64,@@@", "not valid base64"), ("data:image/png,abc", "must be base64"),
                      ("data:image/png;base64," + base64.b64encode(b"not an image").decode(), "cannot read image")):
        with pytest.raises(UserError, match=want):
            load_data_uri(bad)
