"""The `mmtrt serve` and `mmtrt export` (triton, hf) commands: their arguments and what they call."""

from __future__ import annotations

from pathlib import Path

from mmtrt.errors import UserError
from mmtrt.serve import limits
from mmtrt.terminal import show


def add_commands(sub, positive_int, natural_int, examples) -> None:
    p = sub.add_parser("serve", help="serve a bundle: Triton Inference Server (PyTriton) and an OpenAI-compatible "
                       "endpoint on one continuous-batching loop",
                       description="Serve a bundle over HTTP: an OpenAI-compatible endpoint (/v1/chat/completions, "
                       "streaming or not) and Triton Inference Server through PyTriton (HTTP, gRPC, metrics), both fed "
                       "by one continuous-batching loop. A full queue is refused with HTTP 429; SIGTERM drains the "
                       "requests in flight (docs/SERVING.md).",
                       epilog=examples("mmtrt serve out/dino-smollm.bundle",
                                       "mmtrt serve out/dino-smollm.bundle --no-triton --port 8080 --max-batch 4",
                                       "mmtrt serve out/dino-smollm.bundle --host 0.0.0.0 --allow-images examples"))
    p.add_argument("bundle", type=Path, help="a bundle folder written by `mmtrt compile`")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all)")
    p.add_argument("--port", type=natural_int, default=8080, help="the OpenAI endpoint's port (0: a free one)")
    p.add_argument("--max-batch", type=positive_int, metavar="N",
                   help="sequences decoded together (default: the bundle's batch max)")
    p.add_argument("--max-queue", type=positive_int, default=64, metavar="N", help="requests waiting to be admitted "
                   "beyond the batch places free now; beyond it new ones are refused with HTTP 429")
    p.add_argument("--triton-http-port", type=natural_int, default=8000, metavar="PORT",
                   help="Triton's HTTP port (0: a free one)")
    p.add_argument("--triton-grpc-port", type=natural_int, default=8001, metavar="PORT",
                   help="Triton's gRPC port (0: a free one)")
    p.add_argument("--triton-metrics-port", type=natural_int, default=8002, metavar="PORT",
                   help="Triton's metrics port (0: a free one)")
    p.add_argument("--no-triton", action="store_true", help="serve the OpenAI endpoint only")
    p.add_argument("--allow-images", type=Path, metavar="DIR", help="image files under DIR may be named by path "
                   "(default: images come as data: URIs only)")
    p.add_argument("--threads", type=positive_int, metavar="N",
                   help="ONNX Runtime intra-op threads (default: ONNX Runtime's choice)")
    p.add_argument("--no-spin", action="store_true", help="ONNX Runtime's threads sleep when idle instead of "
                   "spinning (hosts shared with other work)")
    p.add_argument("--expect-digest", metavar="SHA256", help="refuse the bundle unless its digest (`mmtrt inspect`) "
                   "is this sha256")
    p.add_argument("--encoder-cache-mb", type=natural_int, default=256, metavar="MIB", help="image features kept by "
                   "the image's content for later requests, least recently used evicted beyond this (0: none)")
    p.add_argument("--public-key", type=Path, metavar="PEM", help="refuse the bundle unless it carries a valid "
                   "signature (`mmtrt sign`) by this PEM public key")
    p.add_argument("--parse-special-tokens", action="store_true", help="special tokens typed in the messages act as "
                   "special tokens (default: they are text, so a client cannot forge a turn)")
    limits.add_arguments(p, positive_int)
    p.add_argument("--llm", choices=["bundle", "vllm"], default="bundle", help="what runs the LLM: the bundle's "
                   "own (default), or vLLM on the bundle's Hugging Face export, fed with the bundle's image features "
                   "(vLLM's environment: python -m mmtrt.handoff.vllm_env, or MMTRT_VLLM_PYTHON)")
    p.add_argument("--llm-folder", type=Path, metavar="DIR", help="with --llm vllm: the folder `mmtrt export hf` "
                   "wrote for this bundle (default: the bundle exported once into the cache folder)")
    p.add_argument("--vllm-dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="with --llm vllm: the dtype vLLM runs the LLM in")
    p.set_defaults(func=_serve)

    p = sub.add_parser("export", help="write a deployable form of a bundle: `export triton BUNDLE REPO`, a Triton "
                       "model repository; `export hf BUNDLE OUT`, a Hugging Face folder",
                       description="triton: a Triton model repository that a stock tritonserver serves: the model runs "
                       "the serving loop in an mmtrt worker process, so the server's Python needs only numpy "
                       "(docs/SERVING.md). hf: the model as compiled, as a Hugging Face folder in the Hub's key layout "
                       "(the LLM's weights after the bundle's passes; the vision tower, projector, config and "
                       "processor of the source checkpoint) that transformers and vLLM load; what the folder cannot "
                       "express is named in one line each (docs/tensorrt.md).",
                       epilog=examples("mmtrt export triton out/dino-smollm.bundle model_repository",
                                       "mmtrt export hf out/dino-smollm.bundle out/dino-smollm-hf",
                                       "mmtrt export hf out/awq.bundle out/awq-modelopt --format modelopt",
                                       "mmtrt export triton out/dino-smollm.bundle model_repository --max-batch 4 "
                                       "--force"))
    p.add_argument("format", choices=["triton", "hf"], help="the form to write: triton (a Triton model repository), "
                   "hf (a Hugging Face folder in the Hub's key layout that transformers and vLLM load)")
    p.add_argument("bundle", type=Path, help="a bundle folder written by `mmtrt compile`")
    p.add_argument("repository", type=Path, help="triton: model repository folder (created, or added to); hf: the "
                   "folder to write (must not exist)")
    p.add_argument("--source", type=Path, metavar="CHECKPOINT", help="hf: the source checkpoint folder (default: "
                   "the recipe's model.path, read against the bundle's folder)")
    p.add_argument("--format", dest="hf_format", choices=["auto", "modelopt"], default="auto", help="hf: how "
                   "awq_int4 weights are written: auto (AutoAWQ GEMM, which vLLM and transformers read), modelopt "
                   "(NVIDIA ModelOpt's W4A16_AWQ with hf_quant_config.json, which TensorRT-LLM's LLM API reads)")
    p.add_argument("--max-batch", type=positive_int, metavar="N",
                   help="sequences decoded together (default: the bundle's batch max)")
    p.add_argument("--max-queue", type=positive_int, default=64, metavar="N",
                   help="waiting requests, beyond the batch places free now, before new ones are refused")
    p.add_argument("--allow-images", type=Path, metavar="DIR", help="image files under DIR may be named by path "
                   "(default: images come as data: URIs only)")
    p.add_argument("--force", action="store_true", help="replace the model's folder if the repository has it")
    p.set_defaults(func=_export)


def require(*modules: str) -> None:
    """A missing serving dependency is a one-line error that says how to install it."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UserError(f"mmtrt serve needs {', '.join(missing)}: pip install 'mmtrt[serve]' and "
                        "pip install --no-deps nvidia-pytriton==0.7.0 (as the Makefile does)")


def _serve(args) -> int:
    from mmtrt.serve.server import ServeOptions, serve

    require("fastapi", "uvicorn", *([] if args.no_triton else ["pytriton"]))

    return serve(ServeOptions(args.bundle, args.host, args.port, args.max_batch, args.max_queue,
                              args.triton_http_port, args.triton_grpc_port, args.triton_metrics_port,
                              args.allow_images, args.threads, not args.no_spin, not args.no_triton,
                              args.expect_digest, args.public_key, limits.from_arguments(args),
                              args.parse_special_tokens, args.encoder_cache_mb, args.llm, args.llm_folder,
                              args.vllm_dtype))


def _export(args) -> int:
    if args.format == "hf":
        from mmtrt.handoff.hf_export import export_hf

        report = export_hf(args.bundle, args.repository, source=args.source, format=args.hf_format)
        for line in report["not_expressed"]:
            show(f"not expressed: {line}")
        show(f"wrote {report['out']}")
        return 0
    if args.hf_format != "auto":
        raise UserError("--format is for `mmtrt export hf`; a Triton repository has one form")
    from mmtrt.serve.export import export_triton

    folder = export_triton(args.bundle, args.repository, args.max_batch, args.max_queue, args.allow_images, args.force)
    show(f"wrote {folder}")
    return 0
