"""`mmtrt serve BUNDLE --llm vllm`: the bundle's vision side and vLLM on its exported folder behind mmtrt's serving
loop, so both front doors (Triton and the OpenAI endpoint) stay mmtrt's. The folder is `--llm-folder`, else the
bundle exported once into the cache folder (`mmtrt export hf`, keyed by the bundle's digest)."""

from __future__ import annotations

import sys
from pathlib import Path

from mmtrt.bundle.verify import cache_folder
from mmtrt.errors import UserError


def exported_folder(bundle: Path) -> Path:
    """The bundle's Hugging Face export in the cache folder, written on first use."""
    from mmtrt.bundle.manifest import bundle_hash

    folder = cache_folder() / "hf-export" / bundle_hash(bundle)
    if (folder / "config.json").is_file():
        return folder
    try:
        from mmtrt.handoff.hf_export import export_hf
    except ImportError:
        raise UserError("this mmtrt cannot export a bundle for vLLM; pass --llm-folder with the bundle's "
                        "Hugging Face folder") from None
    print(f"mmtrt: exporting {bundle} for vLLM into {folder} (once)", file=sys.stderr, flush=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    for line in export_hf(bundle, folder)["not_expressed"]:
        print(f"mmtrt: {line}", file=sys.stderr)
    return folder


def open_serving(options):
    """The pipeline and the serving loop for ServeOptions with llm "vllm"; closing the loop stops vLLM."""
    from mmtrt.handoff.vllm_pipeline import load, serving_loop

    folder = options.llm_folder or exported_folder(options.bundle)
    pipe = load(options.bundle, folder, options.vllm_dtype, options.max_batch, threads=options.threads,
                spin=options.spin, expect_digest=options.expect_digest, public_key=options.public_key)
    try:
        return pipe, serving_loop(pipe, options.max_batch, options.max_queue)
    except BaseException:
        pipe.close()
        raise
