"""The `build-engines` command: the bundle's TensorRT segments built into engines."""

from __future__ import annotations

import json
from pathlib import Path

from mmtrt.cli.arguments import examples
from mmtrt.cli.exit_codes import EXIT_NOT_ALL_BUILT
from mmtrt.terminal import show


def _build_engines(args) -> int:
    from mmtrt.backends.tensorrt.build import build_engines
    from mmtrt.backends.tensorrt.plan_report import describe_plan, plan_report
    from mmtrt.handoff.trtllm_engines import build_llm_engine, plan_json

    bundle = Path(args.bundle)
    if args.plan:
        from mmtrt.bundle.manifest import read_manifest

        manifest = read_manifest(bundle)
        report = plan_report(bundle, manifest, args.target)
        if args.target == "tensorrt":
            report["tensorrt_llm"] = plan_json(bundle, manifest)
        show(json.dumps(report, indent=2) if args.json else describe_plan(report))
        return 0
    log = (lambda line: None) if args.json else show
    # --segment names TensorRT segments; TensorRT-RTX has no TensorRT-LLM
    llm = [] if args.segment or args.target == "rtx" else [build_llm_engine(bundle, args.force, log)]
    segments = build_engines(bundle, args.segment, force=args.force, target=args.target, log=log)
    counts = {s: sum(r["status"] == s for r in segments) for s in ("built", "up to date", "skipped", "failed")}
    show(json.dumps(llm + segments, indent=2) if args.json else ", ".join(f"{n} {s}" for s, n in counts.items()))
    # the TensorRT segments decide: a TensorRT-LLM engine this host cannot build is reported, not counted
    return 0 if counts["built"] + counts["up to date"] == len(segments) else EXIT_NOT_ALL_BUILT


def add_command(sub) -> None:
    p = sub.add_parser("build-engines", help="build the bundle's TensorRT engines: TensorRT 11 (and the TensorRT-LLM "
                       "engine) on this GPU host, or TensorRT-RTX on any host",
                       description="Build the bundle's TensorRT segments into BUNDLE/engines/: with TensorRT 11 (and "
                       "the TensorRT-LLM engine) on the GPU host that will run the bundle, or with TensorRT-RTX on any "
                       "host, no GPU needed (--target rtx). Each segment is reported as built, up to date, skipped or "
                       "failed; exit code 1 unless every one is built. Hosts without a matching engine run ONNX "
                       "Runtime (docs/tensorrt.md).",
                       epilog=examples("mmtrt build-engines out/dino-smollm.bundle --target rtx",
                                       "mmtrt build-engines out/dino-smollm.bundle --target rtx --plan",
                                       "mmtrt build-engines out/dino-smollm.bundle --plan",
                                       "mmtrt build-engines out/dino-smollm.bundle --segment vision.0"))
    p.add_argument("bundle", help="a bundle folder written by `mmtrt compile`")
    p.add_argument("--target", choices=["tensorrt", "rtx"], default="tensorrt",
                   help="tensorrt: TensorRT 11 for this host's GPU; rtx: TensorRT-RTX engines for compute "
                        "capability 8.0, 8.6, 8.9 and 12.0, built on any host, no GPU needed")
    p.add_argument("--segment", action="append", metavar="ID",
                   help="build only this segment (repeatable), e.g. vision.0 (default: all)")
    p.add_argument("--force", action="store_true", help="rebuild engines that are up to date")
    p.add_argument("--plan", action="store_true", help="print the build plan for --target (profiles, engine files, "
                   "commands that run as printed) and build nothing")
    p.add_argument("--json", action="store_true", help="print the plan or the build records as JSON")
    p.set_defaults(func=_build_engines)
