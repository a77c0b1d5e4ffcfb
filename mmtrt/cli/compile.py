"""The `compile` command: a recipe into a bundle, or with --plan what would be built."""

from __future__ import annotations

import json
from pathlib import Path

from mmtrt.cli.arguments import examples
from mmtrt.progress import stage
from mmtrt.terminal import show


def _compile(args) -> int:
    from mmtrt.recipe import load_recipe

    recipe, _ = load_recipe(args.recipe)  # every problem the schema can see, before torch loads
    with stage("loading torch, transformers and the passes"):
        from mmtrt.compiler import compile_recipe, make_plan
    out = args.output or Path(args.recipe).with_suffix("").name + ".bundle"
    if args.plan:
        from mmtrt.plan_text import describe_plan

        plan = make_plan(args.recipe)
        show(json.dumps(plan.to_json(), indent=2) if args.json else describe_plan(plan, args.recipe, str(out)))
        return 0
    if args.dump_ir:
        from mmtrt.pipeline.instruments import dump_folder

        dump_folder(args.dump_ir)
    from mmtrt.bundle.trust import manifest_digest

    bundle = compile_recipe(args.recipe, out, force=args.force, dump_dir=args.dump_ir, device=args.device)
    show(f"wrote {bundle}")
    show(f"digest sha256:{manifest_digest(bundle)}")
    show(f"next: {_first_run(bundle, recipe)}")
    return 0


def _first_run(bundle: Path, recipe) -> str:
    """The command that tries the new bundle: on a shipped digit for the zoo's digit models."""
    if recipe.model.source == "zoo" and recipe.model.name.startswith("dino-smollm"):
        return f'mmtrt run {bundle} --image examples/digit-5.png --prompt "Which digit is shown?"'
    return f'mmtrt run {bundle} --image examples/sample.png --prompt "What is in the picture?"'


def add_command(sub) -> None:
    p = sub.add_parser("compile", help="compile a recipe into a bundle",
                       description="Lower the recipe's model into ONNX components, run its passes, plan backends "
                       "and shapes, and write a content-hashed bundle. The recipe is checked first, every problem "
                       "at once, before anything heavy loads.",
                       epilog=examples("mmtrt compile recipes/tiny-llava.yaml -o out/tiny-llava.bundle",
                                       "mmtrt compile recipes/dino-smollm.yaml --plan       # what would be built",
                                       "mmtrt compile recipes/dino-smollm.yaml --plan --json"))
    p.add_argument("recipe", help="the recipe, a YAML file (docs/RECIPES.md)")
    p.add_argument("-o", "--output", help="bundle folder to write (default: RECIPE_NAME.bundle here)")
    p.add_argument("--plan", action="store_true", help="check the recipe and the model, print what would be built; "
                   "build nothing")
    p.add_argument("--json", action="store_true", help="with --plan: print the whole plan as JSON")
    p.add_argument("--force", action="store_true", help="replace an existing bundle folder")
    p.add_argument("--dump-ir", type=Path, metavar="DIR", help="write every ONNX graph after every pass into DIR")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where calibration runs (default auto: CUDA when a GPU is visible); the export traces on the CPU")
    p.set_defaults(func=_compile)
