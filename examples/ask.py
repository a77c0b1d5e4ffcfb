"""Ask a bundle about an image from Python: `python examples/ask.py BUNDLE IMAGE PROMPT`."""

import sys

import mmtrt.runtime

bundle, image, prompt = sys.argv[1:4]
pipe = mmtrt.runtime.load(bundle)
result = pipe.generate(image, prompt, max_new_tokens=8)
print(result.text)
print("token ids:", result.token_ids)
print("timings:", ", ".join(f"{name} {ms:.0f}" for name, ms in result.timings.items()))
