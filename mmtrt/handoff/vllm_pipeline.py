"""A bundle's vision side with vLLM as its LLM: mmtrt preprocesses, runs the vision encoder (with its passes: token
pruning, quantization), the projector and the prompt's chat template; vLLM runs the LLM of the bundle's exported
Hugging Face folder (`mmtrt export hf`) in its own environment and process, fed with the image embeddings.

`load(bundle, folder).generate(image, prompt)` gives a `Generation` as `mmtrt.runtime.load(bundle).generate` does;
`serving_loop` gives mmtrt's ServingLoop driven by vLLM, which `mmtrt serve --llm vllm` puts behind both front doors.
A token-pruned bundle hands vLLM only the kept tokens: vLLM expands the image placeholder to the embeddings' count,
and a Generation's `image_tokens` and `prompt_tokens` are the counts vLLM itself saw.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from mmtrt.bundle.manifest import read_manifest
from mmtrt.bundle.trust import Trust
from mmtrt.errors import UserError
from mmtrt.handoff.vllm_process import VllmProcess
from mmtrt.handoff.vllm_scheduler import VllmScheduler, run_to_end
from mmtrt.runtime.batch import Prepared, Request, Sequence
from mmtrt.runtime.pipeline import Generation, Pipeline, Refused
from mmtrt.runtime.sampling import SamplingParams
from mmtrt.runtime.streaming import Delta

# those whose vLLM model takes image_embeds (Qwen2-VL's with the image's grid, from which vLLM sets M-RoPE positions)
FAMILIES = ("llava", "llava_next", "llava_onevision", "qwen2_vl", "qwen2_5_vl")
DTYPES = ("float32", "bfloat16", "float16")


class VllmPipeline(Pipeline):
    llm_components = ()  # vLLM embeds the text and runs the LLM: the bundle's LLM sessions are never loaded

    def __init__(self, bundle: str | Path, folder: str | Path, dtype: str = "float32", max_batch: int | None = None,
                 python: str | None = None, threads: int | None = None, spin: bool = True, trust: Trust = Trust(),
                 engine: VllmProcess | None = None):
        check(bundle, folder, dtype)
        self.owns_engine = engine is None
        self.engine = engine or VllmProcess(python)  # started first: vLLM imports while the bundle loads
        try:
            super().__init__(bundle, threads, spin, 0, trust)
            self.folder, self.max_batch = Path(folder), max_batch or self.dims["batch"]["max"]
            if self.engine.version is None:
                self.engine.load(self.folder, self.model["image_token_id"], dtype, self.dims["total"]["max"],
                                 self.max_batch, kv_pool_bytes(self.model["llm"], self.max_batch,
                                                               self.dims["total"]["max"]))
        except BaseException:
            self.close()
            raise
        self.backends["llm"] = f"vllm {self.engine.version} ({dtype}, {self.folder})"

    def embed_request(self, prep: Prepared, seen: dict[str, np.ndarray] | None = None,
                      between: Callable[[], None] | None = None) -> Prepared:
        """The image's vLLM inputs in `prep.embeds`: its features (the LLM's image rows, after the bundle's vision
        passes) as `image_embeds`, and a Qwen2-VL image's grid as `image_grid_thw`, from which vLLM sets the M-RoPE
        positions the bundle's runtime sets; the ids with the image's run cut to its own count: vLLM embeds the
        text itself. `between`: as RequestInputs.embed_request's (vLLM's step between an any-resolution image's
        tiles)."""
        import time

        t1 = time.perf_counter()
        features = self._all_features(prep, seen, between)
        if len(features) > 1:
            raise UserError(f"the request holds {len(features)} images; vLLM is started with one image per prompt")
        if features and self.variable_tokens:
            prep.ids = self.fit_image_tokens(prep.ids, features[0].shape[1])
        prep.embeds = {"image_embeds": features[0]} if features else None
        if features and self.family:
            prep.embeds["image_grid_thw"] = np.asarray([prep.pixels[0].grid], np.int64)
        prep.timings["vision_ms"], prep.pixels = 1e3 * (time.perf_counter() - t1), []
        return prep

    def scheduler(self, max_batch: int | None = None, owns_pipeline: bool = False) -> VllmScheduler:
        if max_batch and max_batch > self.max_batch:
            raise UserError(f"max_batch {max_batch} is more than the {self.max_batch} sequences vLLM was started "
                            "with; pass at most that")
        return VllmScheduler(self, max_batch or self.max_batch, owns_pipeline)

    def generate(self, image, prompt: str, max_new_tokens: int | None = None, raw_prompt: bool = False,
                 sampling: SamplingParams | None = None, on_delta: Callable[[Delta], None] | None = None) -> Generation:
        if on_delta is not None:
            for delta in self.stream(image, prompt, max_new_tokens, raw_prompt, sampling):
                on_delta(delta)
            return self.last
        result = self.generate_batch([Request(image, prompt, max_new_tokens, raw_prompt, sampling)])[0]
        if isinstance(result, Refused):
            raise UserError(result.reason)
        return result

    def stream(self, image, prompt: str, max_new_tokens: int | None = None, raw_prompt: bool = False,
               sampling: SamplingParams | None = None) -> Iterator[Delta]:
        """The request's deltas as vLLM makes its tokens; the finished Generation is `self.last` afterwards."""
        prep = self.prepare(0, Request(image, prompt, max_new_tokens, raw_prompt, sampling))
        for seq, delta in run_to_end(self.scheduler(), [prep]):
            if delta.token_ids or delta.text or delta.finish_reason:
                if delta.finish_reason == "error":
                    raise UserError(f"vLLM: {delta.error}")
                if delta.finish_reason:
                    self.last = self.generation(seq)
                yield delta

    def generate_batch(self, requests: list[Request]) -> list[Generation | Refused]:
        """Every request in input order, decoded together by vLLM (up to max_batch at once)."""
        results, prepared = self.prepare_all(requests)
        for seq, delta in run_to_end(self.scheduler(), prepared):
            if delta.finish_reason == "error":
                results[seq.prep.index] = Refused(seq.prep.index, f"vLLM: {delta.error}")
            elif delta.finish_reason:
                results[seq.prep.index] = self.generation(seq)
        return results

    def generation(self, seq: Sequence) -> Generation:
        """As the bundle's runtime reports it, with the prompt and image-token counts vLLM saw."""
        timings = seq.prep.timings
        prompt_tokens = timings.pop("engine_prompt_tokens", None)
        image_tokens = timings.pop("engine_image_tokens", None)
        result = super().generation(seq)
        if prompt_tokens is not None:
            result.prompt_tokens, result.image_tokens = int(prompt_tokens), int(image_tokens)
        return result

    def close(self) -> None:
        if self.owns_engine:
            self.engine.close()

    def __enter__(self) -> VllmPipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check(bundle, folder, dtype: str) -> None:
    """What refuses the pair before any process starts: the family, the dtype, the folder."""
    family = read_manifest(Path(bundle))["model"]["architecture"]
    if family not in FAMILIES:
        raise UserError(f"{bundle}: --llm vllm takes the {', '.join(FAMILIES)} families, not {family}; serve "
                        "this bundle with its own LLM (--llm bundle)")
    if dtype not in DTYPES:
        raise UserError(f"vLLM dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if not (Path(folder) / "config.json").is_file():
        raise UserError(f"{folder} holds no config.json; pass the folder `mmtrt export hf {bundle} FOLDER` wrote")
    refuse_layer_list(folder)


def kv_pool_bytes(llm: dict, sequences: int, tokens: int) -> int:
    """vLLM's KV pool: twice the float32 KV of `sequences` of `tokens` each (vLLM reserves a fraction of the host's
    memory otherwise, more than a shared host has free)."""
    return max(2 * sequences * tokens * 2 * llm["num_layers"] * llm["num_kv_heads"] * llm["head_dim"] * 4, 1 << 26)


def refuse_layer_list(folder: str | Path) -> None:
    """vLLM 0.32's LLaVA-OneVision builds its projector for one vision layer's width, so a checkpoint whose
    projector reads several layers concatenated (a vision_feature_layer list) fails in its weight loader."""
    config = json.loads((Path(folder) / "config.json").read_text())
    layers = config.get("vision_feature_layer")
    if config.get("model_type") == "llava_onevision" and isinstance(layers, list) and len(layers) > 1:
        raise UserError(f"{folder}: this LLaVA-OneVision's projector reads {len(layers)} vision layers "
                        f"(vision_feature_layer {layers}); vLLM's LLaVA-OneVision takes one; serve the bundle with its "
                        "own LLM (--llm bundle)")


def load(bundle: str | Path, folder: str | Path, dtype: str = "float32", max_batch: int | None = None, *,
         python: str | None = None, threads: int | None = None, spin: bool = True,
         expect_digest: str | None = None, public_key: str | Path | None = None,
         engine: VllmProcess | None = None) -> VllmPipeline:
    """The bundle's vision side and vLLM on `folder` (its `mmtrt export hf`); `python`: vLLM's interpreter
    (default MMTRT_VLLM_PYTHON, else the managed environment); `engine`: another pipeline's vLLM on the same
    folder, shared (bundles that differ only on the vision side), or a VllmProcess started earlier and not loaded
    yet (this pipeline loads it; its starter closes it). Close the pipeline (or use `with`) to stop its own vLLM."""
    return VllmPipeline(bundle, folder, dtype, max_batch, python, threads, spin, Trust(expect_digest, public_key),
                        engine)


def serving_loop(pipe: VllmPipeline, max_batch: int | None = None, max_queue: int = 64):
    """mmtrt's ServingLoop over the pipeline, vLLM batching; closing the loop stops vLLM."""
    from mmtrt.runtime.serving_loop import ServingLoop

    return ServingLoop(pipe, max_batch, max_queue, scheduler=pipe.scheduler(max_batch, owns_pipeline=True))
