"""The Python runtime: `mmtrt.runtime.load(path).generate(image, prompt, max_new_tokens, sampling=...)`, `stream`,
`chat_request` for chat messages, and `ServingLoop` for continuous batching of served traffic."""

from mmtrt.runtime.batch import Request
from mmtrt.runtime.chat import chat_request
from mmtrt.runtime.pipeline import Generation, Pipeline, load
from mmtrt.runtime.sampling import SamplingParams
from mmtrt.runtime.serving_loop import Handle, Metrics, QueueFull, ServingLoop, Unavailable
from mmtrt.runtime.streaming import Delta

__all__ = ["Delta", "Generation", "Handle", "Metrics", "Pipeline", "QueueFull", "Request", "SamplingParams",
           "ServingLoop", "Unavailable", "chat_request", "load"]
