"""The Python runtime: load a bundle, run each partition on its backend, decode with the KV cache."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from mmtrt.preprocess.anyres import NEWLINE_ASSET, build_tiler
from mmtrt.preprocess.numpy_transform import build_transform, covers
from mmtrt.bundle.manifest import image_side, read_manifest
from mmtrt.bundle.schema import check_schema, check_token_ids
from mmtrt.bundle.trust import Trust, check_trust
from mmtrt.bundle.verify import verify_bundle
from mmtrt.errors import UserError
from mmtrt.ir.spec import TensorSpec
from mmtrt.partition.shapes import check_shape
from mmtrt.runtime.batch import Prepared, Request, Sequence, StaticStepper
from mmtrt.runtime.chunked_prefill import PREFILL_CHUNK
from mmtrt.runtime.encoder_cache import EncoderCache
from mmtrt.runtime.executors import TRTLLM, component_runner, engine_choices, llm_engine_choice
from mmtrt.runtime.hf_cache import HfLayout, grown
from mmtrt.runtime.host_notes import log_host_notes
from mmtrt.runtime.kv import StaticCache, cache_device, cache_providers
from mmtrt.runtime.paged import PagedCache, PagedStepper
from mmtrt.runtime.prefix import PrefixCache, keep_prefixes, stored_prefix
from mmtrt.runtime.qwen2_vl import family_images
from mmtrt.runtime.request_inputs import RequestInputs
from mmtrt.runtime.sampling import SamplingParams
from mmtrt.runtime.scheduler import run_to_end
from mmtrt.runtime.streaming import Delta
from mmtrt.runtime.tokenizer import BundleTokenizer
from mmtrt.handoff.trtllm_runner import TrtllmLLM

log = logging.getLogger("mmtrt.runtime")
STATIC_ON_ORT = ("the KV cache's shared buffers are bound into one ONNX Runtime session of the whole LLM; no "
                 "runtime binds them into an engine of its TensorRT form (TensorScatter + Attention) yet")


@dataclass
class Generation:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    timings: dict[str, float]
    image_tokens: int = 0  # the image's tokens in the prompt (its own count under a dynamic token budget)
    backends: dict[str, str] = field(default_factory=dict)
    fallbacks: dict[str, str] = field(default_factory=dict)
    # per token, the top-2 logit margin of the step that chose it (a near tie may flip between kernels)
    margins: list[float] = field(default_factory=list, repr=False)
    finish_reason: str = "stop"  # "stop": an end-of-sequence token or a stop string; "length": max_new_tokens
    speculative: dict[str, int] | None = None  # drafted tokens proposed and accepted, when a draft ran

    def to_json(self) -> dict[str, Any]:
        speculative = {"speculative": self.speculative} if self.speculative is not None else {}
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
                "prompt_tokens": self.prompt_tokens,
                "image_tokens": self.image_tokens, "timings": self.timings, "backends": self.backends, "fallbacks": self.fallbacks,
                **speculative}


@dataclass
class Refused:
    """A request of a batch outside the bundle's envelope; the others still run."""

    index: int
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"error": f"request {self.index + 1}: {self.reason}"}


class Pipeline(RequestInputs):
    """A loaded bundle. `generate` takes one image and one prompt, `generate_batch` a list of `Request`s."""

    llm_components = ("embed", "llm")  # loaded beside the vision encoder: the LLM's, unless another engine runs it

    def __init__(self, path: str | Path, threads: int | None = None, spin: bool = True, prefix_cache_mib: float = 256,
                 trust: Trust = Trust(), parse_special_tokens: bool = False, encoder_cache_mib: float = 256):
        self.path = Path(path)
        self.hash = check_trust(self.path, trust)
        self.manifest = read_manifest(self.path)
        check_schema(self.path, self.manifest)
        verify_bundle(self.path, self.manifest)
        self.parse_special_tokens = parse_special_tokens
        self.model = self.manifest["model"]
        self.dims = self.manifest["dims"]
        self.image_side = image_side(self.manifest)
        self.specs = {name: [TensorSpec.from_json(s) for s in comp["inputs"]]
                      for name, comp in self.manifest["components"].items()}
        self.preprocess_spec = read_json(self.path / self.manifest["components"]["preprocess"]["artifact"])
        self.family = family_images(self.manifest, self.preprocess_spec)  # images of their own size (Qwen2-VL)
        # any-resolution models: the image is tiled, and its tiles' features packed by its size
        self.anyres = self.model["vision"].get("anyres")
        self.transform = (None if self.family else build_tiler(self.preprocess_spec) if self.anyres
                          else build_transform(self.preprocess_spec))
        self.newline = np.load(self.path / NEWLINE_ASSET) if self.anyres and self.anyres["layout"] == "grid" else None
        self.kv = self.model.get("kv_cache")
        choices = engine_choices(self.path, self.manifest)
        if self.kv:  # the shared buffers are bound by address into one ONNX Runtime session of the whole LLM
            choices = {seg: ((None, STATIC_ON_ORT) if seg.startswith("llm.") and c[0] else c)
                       for seg, c in choices.items()}
        self.choices = choices  # per TensorRT segment: its engine, or None and why not
        self.fallbacks = {seg: why for seg, (engine, why) in choices.items() if engine is None}
        log_host_notes(self.fallbacks, self.manifest)
        self.threads, self.spin = threads, spin
        self.runners = {name: component_runner(self.path, self.manifest, name, choices, threads, spin)
                        for name in ("vision", *self.llm_components)}
        self.tokenizer = BundleTokenizer(self.path / "tokenizer")
        check_token_ids(self.path, self.model, self.tokenizer.special_ids)
        self.backends = {name: "+".join(r.providers) for name, r in self.runners.items()}
        self.backends["preprocess"] = "numpy" if covers(self.preprocess_spec) else "torchvision"
        self.stepper = self._static_stepper() if self.kv and "llm" in self.runners else None
        self.hf = HfLayout(self.specs["llm"], self.model["llm"])
        self.prefixes = PrefixCache(prefix_cache_mib)
        self.encoder_cache = EncoderCache(encoder_cache_mib)
        self.pixel_cache = PrefixCache(encoder_cache_mib / 4)
        self.decoding = threading.Lock()  # held by the one Scheduler driving the KV cache
        self.prefill_chunk = PREFILL_CHUNK  # tokens per call of a prefill admitted beside running sequences
        # token_prune's dynamic budget: the vision output is a padded block with a per-image count
        self.dynamic_tokens = self.family is not None or any(
            o["name"] == "image_token_count" for o in self.manifest["components"]["vision"]["outputs"])
        self.trtllm = self._trtllm() if "llm" in self.runners else None
        # the speculative pass's draft and k (a caller may set another or None before decoding starts)
        self.speculative = None if self.trtllm else self.model.get("speculative")

    def _trtllm(self):
        """The TensorRT-LLM runner of the LLM where an engine matches this host, else None (the reason logged once).
        It takes whole prompts, so no image prefix is kept for it."""
        engine, why = llm_engine_choice(self.path, self.manifest)
        if engine is None:
            if why is not None:
                self.fallbacks[TRTLLM] = why
                log.log(logging.WARNING if "build-engines" in why else logging.INFO,  # warn where a build fixes it
                        "the LLM runs on ONNX Runtime, not TensorRT-LLM: %s", why)
            return None
        self.backends["llm"], self.prefixes = f"tensorrt-llm ({why})", PrefixCache(0)
        return TrtllmLLM(engine, self.manifest["tensorrt_llm"], self.model)

    def _static_stepper(self):
        runner = self.runners["llm"]
        self._check_llm_inputs(runner.session)
        if self.kv["layout"] == "paged":
            return PagedStepper(runner.session, PagedCache(self.kv, self.model["llm"], self.dims),
                                self.dims["batch"]["max"])
        cache = StaticCache(self.kv, self.model["llm"], self.dims["batch"]["max"], self.dims["capacity"]["max"],
                            cache_device(runner.providers), cache_providers(runner.providers))
        prompt = self.model.get("prefill")
        if prompt is None:
            return StaticStepper(runner.session, cache)
        graph = component_runner(self.path, self.manifest, prompt["component"], self.choices, self.threads, self.spin)
        self._check_llm_inputs(graph.session)
        self.backends[prompt["component"]] = "+".join(graph.providers)
        return StaticStepper(runner.session, cache, graph.session, prompt["min_tokens"])

    def _check_llm_inputs(self, session) -> None:
        """The KV layout binds the manifest's LLM inputs by name: a graph that takes others is refused at load."""
        listed = {spec.name for spec in self.specs["llm"]}
        taken = {i.name for i in session.get_inputs()}
        if listed != taken:
            raise UserError(f"{self.path}/manifest.json: model.kv_cache ({self.kv['layout']}) and components.llm list "
                            f"the inputs {', '.join(sorted(listed - taken)) or 'none'} that the LLM graph does not take"
                            f" (it takes {', '.join(sorted(taken - listed)) or 'no others'}); the manifest does not "
                            "match its graphs: restore the bundle or recompile it")

    def _run(self, name: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for spec in self.specs[name]:
            if spec.name not in feeds:
                raise UserError(f"{self.path}/manifest.json: components.{name} takes {spec.name!r}, which the runtime "
                                f"does not give ({', '.join(feeds)}); recompile the recipe or restore the bundle")
            check_shape(name, spec, feeds[spec.name].shape, self.dims)
        return self.runners[name].run(feeds)

    def embed(self, ids: np.ndarray, features: np.ndarray | None = None) -> np.ndarray:
        embeds = self._run("embed", {"input_ids": ids})["inputs_embeds"]
        if features is not None:
            embeds[ids == self.model["image_token_id"]] = features.reshape(-1, features.shape[-1])
        return embeds

    def empty_cache(self, batch: int = 1):
        """A cache holding nothing for `batch` sequences: grown arrays (hf) or rows 0..batch-1 of the buffers."""
        if self.stepper:
            self.stepper.reset(batch)
            return self.stepper.cache
        return self.hf.empty(batch)

    def step(self, embeds: np.ndarray, cache, positions: np.ndarray | None = None, delta: int = 0,
             last_only: bool = False) -> tuple[np.ndarray, Any]:
        """One LLM call from the cache's length on: returns the logits of every position (of the last one only
        where `last_only`) and the grown cache. Positions count on from the cache's length plus `delta` (M-RoPE's
        rope delta), unless given."""
        if self.stepper:
            return self.stepper.run_all(embeds, positions, delta, last_only), cache
        out = self._run("llm", self.hf.feeds(embeds, cache, positions, delta, last_only))
        return out["logits"], grown(out)

    def generate(self, image, prompt: str, max_new_tokens: int | None = None, raw_prompt: bool = False,
                 sampling: SamplingParams | None = None, on_delta: Callable[[Delta], None] | None = None) -> Generation:
        """One request; `on_delta` is called with each step's text as it comes (see `stream`)."""
        request = Request(image, prompt, max_new_tokens, raw_prompt, sampling)
        if on_delta is not None:
            for seq, delta in run_to_end(self, [self.prepare(0, request)], text=True):
                on_delta(delta)
            return self.generation(seq)
        result = self.generate_batch([request])[0]
        if isinstance(result, Refused):
            raise UserError(result.reason)
        return result

    def stream(self, image, prompt: str, max_new_tokens: int | None = None, raw_prompt: bool = False,
               sampling: SamplingParams | None = None) -> Iterator[Delta]:
        """The request's output as it is made: one `Delta` per token (its text possibly empty while a character
        or a possible stop string is incomplete), the last with its finish_reason."""
        request = Request(image, prompt, max_new_tokens, raw_prompt, sampling)
        return (delta for _, delta in run_to_end(self, [self.prepare(0, request)], text=True))

    def prepare_all(self, requests: list[Request]) -> tuple[list[Generation | Refused | None], list[Prepared]]:
        """Each request prepared (images shared by content across them), or its Refused in the results list at its
        place; the results' other places are None, for the caller to fill in input order."""
        results: list[Generation | Refused | None] = [None] * len(requests)
        prepared, features = [], {}
        for i, req in enumerate(requests):
            try:
                prepared.append(self.prepare(i, req, features))
            except UserError as exc:
                results[i] = Refused(i, str(exc))
        return results, prepared

    def generate_batch(self, requests: list[Request]) -> list[Generation | Refused]:
        """Every request, in input order; one outside the envelope (or with sampling values out of range) is
        refused alone. Under a kv_layout the requests decode together (up to the envelope's batch), joining as
        places free up; otherwise each sequence's calls interleave."""
        results, prepared = self.prepare_all(requests)
        if self.trtllm and all(p.sampling.greedy and not p.sampling.stop for p in prepared):
            sequences = self.trtllm.decode(prepared)
        else:  # sampling and stop strings run on the ONNX Runtime LLM
            sequences = {seq.prep.index: seq for seq, delta in run_to_end(self, prepared)
                         if delta.finish_reason}
        for index, seq in sequences.items():
            results[index] = self.generation(seq)
        return results

    def prefill(self, stepper, handle, prep: Prepared) -> np.ndarray:
        """Prefill one request into its row (static) or sequence (paged), from a stored image prefix when there is
        one; the logits of its last position. A fresh prefix is stored for the next question on the image."""
        arrays = stored_prefix(self, prep)
        if arrays is not None:
            stepper.load_prefix(handle, arrays)
            logits = stepper.prefill(handle, prep.after_prefix(), prep.positions_after_prefix(), prep.rope_delta)
        else:
            stepper.clear(handle)
            logits = stepper.prefill(handle, prep.embeds, prep.positions, prep.rope_delta)
        keep_prefixes(self, stepper, handle, prep, fresh=arrays is None)
        return logits

    def generation(self, seq: Sequence) -> Generation:
        """A finished sequence as the caller gets it: the text cut at a stop string when one was found."""
        timings = {**seq.prep.timings, "decode_ms_per_token": 1e3 * seq.decode_s / max(len(seq.tokens) - 1, 1)}
        text = seq.text.text if seq.text else self.tokenizer.decode(seq.tokens, skip_special_tokens=True)
        reason = seq.finish_reason or ("stop" if seq.tokens[-1] in self.model["eos_token_ids"] else "length")
        return Generation(text, seq.tokens, len(seq.prep.ids), {k: round(v, 3) for k, v in timings.items()},
                          seq.prep.ids.count(self.model["image_token_id"]), dict(self.backends),
                          dict(self.fallbacks), seq.margins, reason,
                          seq.speculative.to_json() if seq.speculative is not None
                          else {"proposed": 0, "accepted": 0} if self.speculative else None)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def load(path: str | Path, threads: int | None = None, spin: bool = True, prefix_cache_mib: float = 256, *,
         expect_digest: str | None = None, public_key: str | Path | None = None,
         parse_special_tokens: bool = False, encoder_cache_mib: float = 256) -> Pipeline:
    """Load a bundle written by `mmtrt compile`. Under a kv_layout, image prefixes are kept for later questions in
    an LRU of `prefix_cache_mib` MiB (0: none); every image's features (the vision encoder's output) are kept by
    the image's content for any later request in an LRU of `encoder_cache_mib` MiB (0: none), and its preprocessed
    pixels in one of a quarter of that. `expect_digest`:
    the bundle's identity (its manifest's sha256, which `mmtrt compile` and `mmtrt inspect` print) it must have;
    `public_key`: a PEM public key whose signature (`mmtrt sign`) it must carry. `parse_special_tokens`: special tokens typed in a prompt act as special tokens
    (the default keeps them text; docs/security.md)."""
    return Pipeline(path, threads, spin, prefix_cache_mib, Trust(expect_digest, public_key), parse_special_tokens,
                    encoder_cache_mib)
