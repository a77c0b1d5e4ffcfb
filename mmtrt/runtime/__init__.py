"""The Python runtime: `mmtrt.runtime.load(path).generate(image, prompt, max_new_tokens)`."""

from mmtrt.runtime.pipeline import Generation, Pipeline, load

__all__ = ["Generation", "Pipeline", "load"]
