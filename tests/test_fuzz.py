"""Fuzz the recipe parser and the command line with hypothesis: whatever the input, the answer is a result or one
line with exit code 2, never a traceback. Bounded examples on the tiny bundle, so each test takes seconds."""

import contextlib
import io
import json
import shutil

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builders import random_image
from conftest import ROOT
from mmtrt.cli import build_parser, main
from mmtrt.pipeline.registry import registered_passes
from mmtrt.recipe import Recipe

FUZZ = settings(max_examples=30, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([0, 1, -1, 7, 4096]),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                    st.sampled_from(["tiny-llava", "zoo", "hf", "onnxruntime", "tensorrt", "fp16", "digits", "llm"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=8)


def one_line(message: str) -> bool:
    return len(message.strip().splitlines()) == 1 and "Traceback" not in message


def check_recipe_file(path):
    """The recipe through the CLI, as far as `compile --plan` goes: a plan, or one line and exit code 2."""
    code, err = run_main(["compile", str(path), "--plan"])
    assert code == 0 or (code == 2 and one_line(err)), err


@FUZZ
@given(text=st.text(alphabet=st.characters(codec="utf-8"), max_size=200) | st.binary(max_size=64).map(bytes.hex))
def test_recipe_parser_on_arbitrary_text(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    check_recipe_file(path)


@FUZZ
@given(data=st.binary(max_size=200))
def test_recipe_parser_on_arbitrary_bytes(tmp_path, data):
    path = tmp_path / "r.yaml"
    path.write_bytes(data)
    check_recipe_file(path)


def section(name, typed):
    """A value for one recipe section: mostly typed values, else its own keys with random values, or anything."""
    fields = list(Recipe.model_fields[name].annotation.model_fields)
    own = st.dictionaries(st.sampled_from(fields + ["typo"]), values, max_size=3)
    return st.integers(0, 5).flatmap(lambda i: typed if i < 4 else own if i == 4 else values)


def pass_entry(name, cls):
    fields = sorted(cls.Config.model_fields) + ["typo"]
    return st.fixed_dictionaries({name: st.dictionaries(st.sampled_from(fields), small | values, max_size=2)})


small = st.integers(-2, 600) | st.sampled_from([0.0, 0.5, 1.0, 1.5, "none", "digits", "fp16", "awq", "rtn", 64, 128])
ranges = st.fixed_dictionaries({"min": st.integers(-1, 400), "opt": st.integers(-1, 400), "max": st.integers(-1, 5000)})
backends = st.lists(st.sampled_from(["torchvision", "onnxruntime", "tensorrt", "tensorrt-llm", "cuda"]), max_size=3)
recipes = st.fixed_dictionaries({"model": section("model", st.just({"source": "zoo", "name": "tiny-llava"}))}, optional={
    "passes": st.lists(st.one_of([pass_entry(n, c) for n, c in registered_passes().items()]), max_size=3),
    "envelope": section("envelope", st.fixed_dictionaries({}, optional={
        "batch": ranges, "prompt_tokens": ranges, "max_new_tokens": st.integers(-1, 5000),
        "image": st.fixed_dictionaries({"min_side": st.integers(0, 5000), "max_side": st.integers(0, 5000)})})),
    "partition": section("partition", st.fixed_dictionaries({}, optional={
        "vision": backends, "llm": backends, "embed": backends, "min_segment_size": st.integers(-1, 50)})),
    "output": section("output", st.fixed_dictionaries({"external_data_threshold": st.integers(-1, 10**7)})),
    "budgets": section("budgets", st.fixed_dictionaries({}, optional={
        "digits_accuracy_drop": st.floats(-1, 10), "perplexity_increase_pct": st.floats(allow_nan=True)})),
    "evaluate": section("evaluate", st.fixed_dictionaries({}, optional={"digits_limit": st.integers(-1, 10)}))})


@FUZZ
@given(recipe=recipes)
def test_plan_on_structured_recipes(tmp_path, recipe):
    """Through the whole plan (schema, pass configs, the pass chain, shapes), mostly on the tiny zoo model."""
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True))
    check_recipe_file(path)


@pytest.fixture(scope="module")
def pool(tiny_bundle, tmp_path_factory):
    """Paths the CLI fuzz draws from: good and broken bundles, recipes, images, inputs files, other things."""
    root = tmp_path_factory.mktemp("fuzz")
    paths = {"bundle": tiny_bundle, "missing": root / "missing", "folder": root, "nowhere": root / "no" / "such.json"}
    for name, damage in {"no_data": lambda b: (b / "llm.onnx.data").unlink(),
                         "flipped": lambda b: (b / "embed.onnx").write_bytes((b / "embed.onnx").read_bytes()[:-1] + b"!"),
                         "bad_manifest": lambda b: (b / "manifest.json").write_text("{"),
                         "bad_index": lambda b: ((b / "engines").mkdir(), (b / "engines" / "index.json").write_text("[")),
                         }.items():
        paths[name] = shutil.copytree(tiny_bundle, root / name)
        damage(paths[name])
    files = {"text": b"hello", "empty": b"", "bad.png": b"\x89PNG\r\n\x1a\nbroken", "bad.yaml": b"model: [",
             "stray.yaml": b"model: {source: zoo, name: tiny-llava}\nenvlope: {}\n",
             "hf.yaml": b"model: {source: hf, path: missing}\n"}
    for name, content in files.items():
        (root / name).write_bytes(content)
        paths[name] = root / name
    paths["good.yaml"] = ROOT / "recipes" / "tiny-llava.yaml"
    rng = np.random.default_rng()
    random_image(rng, 30, 40).save(root / "img.png")
    random_image(rng, 8, 300).save(root / "thin.png")
    paths["img.png"], paths["thin.png"] = root / "img.png", root / "thin.png"
    np.savez(root / "x.npz", **{"llm/0/x": np.zeros(2)})
    paths["x.npz"] = root / "x.npz"
    return {k: str(v) for k, v in paths.items()}


NUMBERS = ["-1", "0", "1", "2", "3", "31", "99999", "nan", "inf", "1e400", "x", "", "0x10"]
TEXTS = ["hi", "", "<image> what?", "x" * 400, "\u00e9\u4e2d\U0001f600", "--json", "-"]


def subparsers():
    return build_parser()._subparsers._group_actions[0].choices


def argv_for(command, pool):
    """Arguments of one subcommand: its options in any order and number, with values drawn from the pools."""
    parser = subparsers()[command]
    options = [a for a in parser._actions if a.option_strings and "-h" not in a.option_strings]
    word = st.sampled_from(sorted(pool.values()) + NUMBERS + TEXTS)

    def option(action):
        flag = action.option_strings[-1]
        if action.nargs == 0:
            return st.just([flag])
        choice = st.sampled_from(list(action.choices)) if action.choices else word
        return choice.map(lambda value: [flag, value])

    required = {"run": ["--image", pool["img.png"], "--prompt", "hi"], "eval": ["--suite", "digits"]}.get(command, [])
    good = pool["good.yaml" if command == "compile" else "bundle"]
    path = st.one_of(st.just(good), st.sampled_from(sorted(pool.values())))  # half the time past "not a bundle"
    positional = st.tuples(*[path if a.nargs is None else st.lists(path, max_size=1).map(" ".join)
                             for a in parser._actions if not a.option_strings])
    stray = st.one_of(st.just([]), st.just([]), st.just([]), word.map(lambda w: [w]))  # a word no option takes
    flags = st.lists(st.one_of([option(a) for a in options]), max_size=6 if options else 0).map(
        lambda xs: [w for x in xs for w in x])
    return st.tuples(positional, stray, flags).map(  # a later option overrides `required`
        lambda t: [command, *[p for p in t[0] if p], *required, *t[1], *t[2]])


def bounded(argv):
    """Keep each example short: evaluation on a few samples, a valid recipe only planned."""
    if argv[0] == "eval":
        argv = [*argv, "--limit", "1"]
    if argv[0] == "compile":
        argv = [*argv, "--plan"]
    return argv


def run_main(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


# `serve` runs until it is signalled: tests/serve checks its bad arguments
@pytest.mark.parametrize("command", sorted(set(subparsers()) - {"serve"}))
def test_cli_arguments(pool, command):
    @settings(FUZZ, max_examples=15 if command in ("compile", "eval", "compare") else 25)
    @given(argv=argv_for(command, pool).map(bounded))
    def check(argv):
        code, err = run_main(argv)
        assert code in (0, 1, 2), (argv, code, err)
        if code == 2:
            assert one_line(err), (argv, err)

    check()


def test_cli_fuzz_reaches_past_argument_parsing(pool):
    """The pools are useful only if some examples get through argparse to the commands."""
    codes = [run_main(argv)[0] for argv in (["inspect", pool["bundle"], "--json"], ["verify", pool["flipped"]],
                                            ["run", pool["bundle"], "--image", pool["bad.png"], "--prompt", "hi"])]
    assert codes == [0, 2, 2]
    assert json.loads(json.dumps(pool))
