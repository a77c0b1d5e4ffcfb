"""Session fixtures: the tiny zoo bundle and a SigLIP checkpoint the tests save themselves, compiled once, and
each small source model exported once."""

import contextlib
import copy
import functools
import hashlib
import itertools
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from mmtrt.compiler import compile_recipe
from mmtrt.zoo.tiny_llava import build_tiny_llava

ROOT = Path(__file__).resolve().parents[1]
# Its projector reads two hidden states concatenated (a vision_feature_layer list), as LLaVA-OneVision-style
# configs may; the last encoder layer is still dead.
SIGLIP_SIZES = dict(tower="siglip", image_size=48, patch_size=8, vision_hidden=96, vision_layers=3,
                    hidden=96, layers=3, heads=6, kv_heads=2, seed=7, feature_layer=[1, -2])


def compile_to(tmp: Path, recipe_text: str, name: str = "bundle") -> Path:
    recipe = tmp / "recipe.yaml"
    recipe.write_text(recipe_text)
    return compile_recipe(recipe, tmp / name)


def compile_checkpoint(tmp: Path, model, processor, name: str = "bundle", passes: str = "") -> Path:
    """`model` and `processor` saved as a Hugging Face folder in `tmp` and compiled, with `passes` (recipe lines)."""
    model.save_pretrained(tmp / "checkpoint")
    processor.save_pretrained(tmp / "checkpoint")
    return compile_to(tmp, "model: {source: hf, path: checkpoint}\n" + passes, name)


@contextlib.contextmanager
def module_folder(request, tmp_path_factory, name: str):
    """A folder for a module's large fixture, removed when the module ends unless a test has failed: the suite's
    bundles would otherwise stay on disk until the run ends."""
    folder = tmp_path_factory.mktemp(name)
    yield folder
    if not request.session.testsfailed:
        shutil.rmtree(folder, ignore_errors=True)


# A source model above this many tensor bytes is exported by every compile: its lowered copies would crowd memory.
LOWER_ONCE_BYTES = 2**27


def source_digest(model, processor) -> str | None:
    """What lowering reads, hashed: the model's class, configs and tensors, its processor's files and the export
    device; None for a model above LOWER_ONCE_BYTES."""
    from mmtrt.ir import export

    tensors = list(itertools.chain(model.named_parameters(), model.named_buffers()))
    if sum(t.numel() * t.element_size() for _, t in tensors) > LOWER_ONCE_BYTES:
        return None
    digest = hashlib.sha256(f"{type(model).__name__} {export.device()} {export.trace_device()}".encode())
    digest.update(model.config.to_json_string().encode() + model.generation_config.to_json_string().encode())
    for name, t in tensors:
        digest.update(f"{name} {t.dtype} {tuple(t.shape)}".encode())
        digest.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    with tempfile.TemporaryDirectory() as folder:
        copy.deepcopy(processor).save_pretrained(folder)  # saving marks the processor's tokenizer config
        for file in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
            digest.update(file.relative_to(folder).as_posix().encode() + file.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="session", autouse=True)
def lower_once():
    """In-process compiles export each small source model once per worker: a later compile of the same model
    (weights, configs, processor, device) runs its passes on a copy of that lowering, which is deterministic
    (tests/bundle/test_bundle.py compiles twice to the same bytes). The copy holds its weights itself: the first
    compile's source model is gone when the next one runs. A test marked `exports` exports every compile it runs
    itself (its body and its function-scoped fixtures)."""
    import mmtrt.compiler

    lowered, real_lower = {}, mmtrt.compiler.lower

    def lower(model, processor):
        key = None if lower.fresh else source_digest(model, processor)
        if key is None:
            return real_lower(model, processor)
        if key not in lowered:
            lowered[key] = holding_weights(real_lower(model, processor))
        return copy.deepcopy(lowered[key])

    lower.fresh = False
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mmtrt.compiler, "lower", lower)
        yield lower


def holding_weights(ir):
    """`ir` with every component's weights taken into its graphs: it outlives the compile whose source model they
    are kept in."""
    from mmtrt.ir import source_weights

    for comp in ir.onnx_components():
        source_weights.materialize(comp.onnx)
    return ir


@pytest.fixture(autouse=True)
def fresh_exports(request, lower_once):
    """Under the `exports` mark, every compile of the test exports its model."""
    lower_once.fresh = request.node.get_closest_marker("exports") is not None
    yield
    lower_once.fresh = False


@pytest.fixture(scope="session", autouse=True)
def verify_cache(tmp_path_factory):
    """Bundle loads record what they verified; the tests keep those records out of the user's cache folder."""
    os.environ["MMTRT_CACHE"] = str(tmp_path_factory.mktemp("mmtrt-cache"))
    return Path(os.environ["MMTRT_CACHE"])


@pytest.fixture(scope="session")
def tiny():
    return build_tiny_llava()


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory):
    return compile_recipe(ROOT / "recipes" / "tiny-llava.yaml", tmp_path_factory.mktemp("tiny") / "tiny.bundle")


# The legacy TensorRT-LLM engine flow is opt-in: a recipe lists tensorrt-llm in partition.llm.
TRTLLM_OPT_IN = "partition: {llm: [tensorrt-llm, tensorrt, onnxruntime]}\n"


@pytest.fixture(scope="session")
def tiny_trtllm_bundle(tmp_path_factory):
    """The demo recipe opting in to TensorRT-LLM's checkpoint and trtllm-build command."""
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text() + TRTLLM_OPT_IN
    return compile_to(tmp_path_factory.mktemp("tiny-trtllm"), recipe, "trtllm.bundle")


@pytest.fixture(scope="session")
def tiny_paged_bundle(tmp_path_factory):
    """The tiny zoo model with the paged KV layout (blocks of 16 tokens)."""
    paged = "  - kv_layout: {layout: paged, block_tokens: 16}\n"
    recipe = (ROOT / "recipes" / "tiny-llava.yaml").read_text().replace("envelope:", paged + "envelope:")
    return compile_to(tmp_path_factory.mktemp("tiny-paged"), recipe, "paged.bundle")


PREFILL_RECIPE = """model: {{source: zoo, name: tiny-llava}}
passes:
  - awq_int4: {{method: rtn, group_size: 32, symmetric: false, zero_point: float}}
  - kv_layout: {{layout: static}}
{tail}envelope:
  batch: {{min: 1, opt: 1, max: 1}}
  prompt_tokens: {{min: 1, opt: 16, max: 64}}
  max_new_tokens: 8
"""


@pytest.fixture(scope="session")
def tiny_prefill_bundle(tmp_path_factory):
    """INT4 with the static layout and int8_prefill's prompt graph, run for calls of 4 tokens and more."""
    return compile_to(tmp_path_factory.mktemp("int8-prefill"),
                      PREFILL_RECIPE.format(
        tail="  - int8_prefill: {min_tokens: 4, calibration: {samples: 2, text_windows: 1}}\n"), "prefill.bundle")


@pytest.fixture(scope="session")
def siglip_checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("siglip") / "checkpoint"
    model, processor = build_tiny_llava(**SIGLIP_SIZES)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def siglip_bundle(siglip_checkpoint):
    tmp = siglip_checkpoint.parent
    return compile_to(tmp, "model: {source: hf, path: checkpoint}\npasses:\n  - dead_layer_elimination: {}\n")


@pytest.fixture
def rng():
    seed = int(os.environ.get("MMTRT_TEST_SEED") or np.random.SeedSequence().entropy)  # set it to replay a failure
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)


QWEN_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
ANYRES_BUILDERS = {"llava_next": "build_tiny_llava_next", "llava_onevision": "build_tiny_llava_onevision"}


def _save_checkpoints(tmp_path_factory, builders: dict) -> dict:
    """Each family's tiny model and processor saved with save_pretrained: family -> folder."""
    folders = {}
    for family, build in builders.items():
        folders[family] = tmp_path_factory.mktemp(family) / "checkpoint"
        model, processor = build()
        model.save_pretrained(folders[family])
        processor.save_pretrained(folders[family])
    return folders


def _compiler_lowering_once(checkpoints: dict, tmp_path_factory):
    """compile(family, recipe lines after `model:`, name) -> bundle. Each family's checkpoint is exported once per
    worker (`lower_once`); `compile.lowered` keeps each family's first lowering, for tests that run passes on it."""
    import mmtrt.compiler

    lowered = {}

    def compile_(family: str, recipe_tail: str, name: str) -> Path:
        folder = tmp_path_factory.mktemp(name)
        (folder / "checkpoint").symlink_to(checkpoints[family], target_is_directory=True)
        session_lower = mmtrt.compiler.lower

        def recording(model, processor):
            ir = session_lower(model, processor)
            if family not in lowered:
                lowered[family] = holding_weights(copy.deepcopy(ir))
            return ir

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(mmtrt.compiler, "lower", recording)
            return compile_to(folder, "model: {source: hf, path: checkpoint}\n" + recipe_tail, name)
    compile_.lowered = lowered  # family -> its lowered IR, once a compile has lowered it
    return compile_


@pytest.fixture(scope="session")
def anyres_checkpoints(tmp_path_factory):
    """The tiny LLaVA-NeXT and LLaVA-OneVision, saved with save_pretrained: family -> folder."""
    from mmtrt.zoo import tiny_anyres

    return _save_checkpoints(tmp_path_factory, {f: getattr(tiny_anyres, b) for f, b in ANYRES_BUILDERS.items()})


@pytest.fixture(scope="session")
def anyres_compile(anyres_checkpoints, tmp_path_factory):
    return _compiler_lowering_once(anyres_checkpoints, tmp_path_factory)


@pytest.fixture(scope="session")
def qwen_checkpoints(tmp_path_factory):
    """The tiny Qwen2-VL and Qwen2.5-VL, saved with save_pretrained: family -> folder."""
    from mmtrt.zoo.tiny_qwen2_vl import build_tiny_qwen2_vl

    return _save_checkpoints(tmp_path_factory, {f: lambda f=f: build_tiny_qwen2_vl(f) for f in QWEN_FAMILIES})


@pytest.fixture(scope="session")
def qwen_compile(qwen_checkpoints, tmp_path_factory):
    """As anyres_compile, for the Qwen2-VL families (each exported once per session); a recipe compiled before
    is not compiled again."""
    return functools.cache(_compiler_lowering_once(qwen_checkpoints, tmp_path_factory))


@pytest.fixture(scope="session")
def qwen_bundle(qwen_compile):
    """family -> its bundle of the default recipe, compiled once per session."""
    return functools.cache(lambda family: qwen_compile(family, "", f"{family}.bundle"))


@pytest.fixture(scope="session")
def next_bundle(anyres_compile):
    return anyres_compile("llava_next", "passes:\n  - dead_layer_elimination: {}\n", "next.bundle")


@pytest.fixture(scope="session")
def onevision_bundle(anyres_compile):
    """With the static KV layout: its Qwen2 LLM has biased projections and tied embeddings."""
    return anyres_compile("llava_onevision", "passes:\n  - kv_layout: {layout: static}\n", "onevision.bundle")
