"""The `compare` command: two bundles, or a bundle and its PyTorch source, output by output."""

from __future__ import annotations

import json
from pathlib import Path

from mmtrt.cli.arguments import examples, natural_int, output_file, tolerance
from mmtrt.cli.exit_codes import EXIT_COMPARE_FAILED
from mmtrt.terminal import show


def _compare(args) -> int:
    from mmtrt.compare.report import compare, format_report

    report = compare(args.a, args.b, reference=args.reference, atol=args.atol, rtol=args.rtol,
                     components=args.partition, inputs_file=args.inputs, save_inputs=args.save_inputs,
                     seed=args.seed, source_model=args.source_model)
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    show(format_report(report))
    return 0 if report["passed"] else EXIT_COMPARE_FAILED


def add_command(sub) -> None:
    p = sub.add_parser("compare", help="compare two bundles, or a bundle and its PyTorch source, partition by partition",
                       description="Run both sides on the same inputs through Polygraphy and compare every output; "
                       "exit code 1 when one fails the tolerances.",
                       epilog=examples("mmtrt compare out/dino-smollm.bundle --reference torch",
                                       "mmtrt compare out/a.bundle out/b.bundle --atol 1e-3 --partition llm"))
    p.add_argument("a", type=Path, help="a bundle folder")
    p.add_argument("b", type=Path, nargs="?", help="a second bundle folder (or --reference torch)")
    p.add_argument("--reference", choices=["torch"], help="compare A with the PyTorch model it was compiled from")
    p.add_argument("--source-model", type=Path, metavar="CHECKPOINT",
                   help="with --reference torch: the checkpoint folder of an hf-sourced bundle")
    p.add_argument("--atol", type=tolerance, default=1e-5, help="absolute tolerance")
    p.add_argument("--rtol", type=tolerance, default=1e-5, help="relative tolerance, relative to B")
    p.add_argument("--partition", action="append", choices=["vision", "embed", "llm"],
                   help="compare only these (repeatable; default: all)")
    p.add_argument("--inputs", type=Path, metavar="FILE.npz",
                   help="inputs saved by --save-inputs, instead of generated ones")
    p.add_argument("--save-inputs", type=output_file, metavar="FILE.npz", help="save the inputs used")
    p.add_argument("--seed", type=natural_int, help="seed for generated inputs (default: fresh, recorded in the report)")
    p.add_argument("--json-out", type=output_file, metavar="FILE", help="write the full report as JSON")
    p.set_defaults(func=_compare)
