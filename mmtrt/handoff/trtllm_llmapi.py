"""A bundle's vision side with TensorRT-LLM's LLM API as its LLM: mmtrt preprocesses, runs the vision encoder
(with its passes), the projector and the chat template; `tensorrt_llm.LLM` runs the LLM of the folder that
`mmtrt export hf BUNDLE FOLDER --format modelopt` wrote, in its own environment (trtllm_llmapi_worker.py).

A request goes as TensorRT-LLM takes precomputed embeddings (the worker's docstring names its sources): the prompt
as text with one image token per image (TensorRT-LLM tokenizes it with the folder's tokenizer and expands each to
its image's embedding rows), and each image's embeddings [tokens, hidden], the kept ones for a token-pruned
bundle. The text is checked to tokenize back to the bundle's ids, so TensorRT-LLM sees the prompt mmtrt would run.
NOT RUN against TensorRT-LLM (it does not install where this was written)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mmtrt.errors import UserError
from mmtrt.handoff.trtllm_process import TrtllmProcess, WorkerUnavailable
from mmtrt.runtime.batch import Request

WORKER = Path(__file__).with_name("trtllm_llmapi_worker.py")


def collapse_image_runs(ids: list[int], token: int) -> list[int]:
    """The ids with each run of image tokens (one image's expanded placeholder) cut to one token."""
    return [t for i, t in enumerate(ids) if t != token or i == 0 or ids[i - 1] != token]


def prompt_text(tokenizer, ids: list[int]) -> str:
    """Text that the folder's tokenizer, as TensorRT-LLM calls it (special tokens added), turns back into `ids`."""
    bos = tokenizer.bos_token_id
    for candidate in (ids[1:] if bos is not None and ids[:1] == [bos] else None, ids):
        if candidate is None:
            continue
        text = tokenizer.decode(candidate, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if tokenizer(text).input_ids == ids:
            return text
    raise UserError("the prompt does not tokenize back to the bundle's ids with the folder's tokenizer, so "
                    "TensorRT-LLM would run another prompt; pass a plain-text prompt")


def build_request(pipe, tokenizer, image, prompt: str, max_new_tokens: int | None = None) -> tuple[dict, dict]:
    """The worker's `generate` request for one bundle request: (header, arrays)."""
    prep = pipe.check(0, Request(image, prompt, max_new_tokens))
    features = pipe._all_features(prep, None)  # [1, tokens, hidden] per image, after the bundle's vision passes
    ids = pipe.fit_image_tokens(prep.ids, [f.shape[1] for f in features]) if features else prep.ids
    token = pipe.model["image_token_id"]
    collapsed = collapse_image_runs(ids, token)
    if collapsed.count(token) != len(features):
        raise UserError(f"the prompt holds {collapsed.count(token)} image placeholders for {len(features)} images")
    arrays = {f"image_{i}": np.ascontiguousarray(f[0], np.float32) for i, f in enumerate(features)}
    return {"prompt": prompt_text(tokenizer, collapsed), "max_new_tokens": prep.limit}, arrays


class LlmApiRunner:
    """The bundle's vision side in this process, TensorRT-LLM's LLM in the worker's."""

    def __init__(self, bundle: str | Path, folder: str | Path, dtype: str = "auto", python: str | None = None):
        from transformers import AutoTokenizer

        from mmtrt.runtime import load

        folder = Path(folder)
        if not (folder / "config.json").is_file():
            raise UserError(f"{folder} holds no config.json; pass the folder `mmtrt export hf {bundle} FOLDER "
                            "--format modelopt` wrote")
        self.pipe, self.tokenizer = load(bundle), AutoTokenizer.from_pretrained(folder)
        try:
            self.worker = TrtllmProcess(python, WORKER)
        except WorkerUnavailable as exc:
            raise UserError(str(exc)) from None
        try:
            self.worker.call("load", folder=str(folder.resolve()), dtype=dtype)
        except WorkerUnavailable as exc:
            self.worker.close()
            raise UserError(str(exc)) from None

    def generate(self, image, prompt: str, max_new_tokens: int | None = None) -> list[int]:
        header, arrays = build_request(self.pipe, self.tokenizer, image, prompt, max_new_tokens)
        try:
            answer, _ = self.worker.call("generate", arrays, **header)
        except WorkerUnavailable as exc:
            raise UserError(str(exc)) from None
        return answer["token_ids"]

    def close(self) -> None:
        self.worker.close()
