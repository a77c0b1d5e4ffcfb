"""The speculative pass at plan time: its options are strict, a misplaced or impossible draft is one line at
`compile --plan`, and the plan says which draft, what it takes and what the bundle gains."""

import pytest

from mmtrt.cli import main

BASE = "model: {source: zoo, name: tiny-llava}\npasses:\n"


def plan(capsys, tmp_path, passes: str) -> tuple[int, str, str]:
    (tmp_path / "r.yaml").write_text(BASE + passes)
    code = main(["compile", str(tmp_path / "r.yaml"), "--plan"])
    out = capsys.readouterr()
    return code, out.out, out.err.strip()


def test_the_plan_names_the_draft_and_the_bundles_growth(capsys, tmp_path):
    code, out, _ = plan(capsys, tmp_path, "  - speculative: {draft: prompt_lookup, k: 6}\n")
    assert code == 0
    line = next(l for l in out.splitlines() if l.startswith("speculative "))
    assert "prompt_lookup" in line and "up to 6 tokens" in line and "grows by 0 bytes" in line
    code, out, _ = plan(capsys, tmp_path, "  - speculative: {draft: early_exit, layers: 3}\n")
    line = next(l for l in out.splitlines() if l.startswith("speculative "))
    assert code == 0 and "first 3 of 4 decoder layers (75%" in line and "graph file only" in line
    code, out, _ = plan(capsys, tmp_path, "  - speculative: {draft: early_exit, layers: 1, adapter: {steps: 5}}\n")
    line = next(l for l in out.splitlines() if l.startswith("speculative "))
    hidden = 128  # the tiny LLaVA's: the adapter is hidden x hidden and a bias, in float32
    assert code == 0 and f"exit adapter of {hidden * hidden + hidden:,} parameters" in line
    assert f"({4 * (hidden * hidden + hidden):,} bytes" in line and "5 steps" in line


@pytest.mark.parametrize("passes, words", [
    ("  - speculative: {draft: early_exit}\n", ["needs layers"]),
    ("  - speculative: {draft: prompt_lookup, layers: 2}\n", ["layers applies to draft: early_exit"]),
    ("  - speculative: {draft: prompt_lookup, adapter: {}}\n", ["adapter applies to draft: early_exit"]),
    ("  - speculative: {draft: early_exit, layers: 2, adapter: {step: 5}}\n", ["step"]),
    ("  - speculative: {draft: lookahead}\n", ["draft"]),
    ("  - speculative: {draft: prompt_lookup, k: 0}\n", ["k"]),
    ("  - speculative: {draft: early_exit, layers: 4}\n", ["fewer than the LLM's 4"]),
    ("  - kv_layout: {layout: static}\n  - speculative: {draft: early_exit, layers: 2}\n",
     ["put speculative before kv_layout"]),
])
def test_a_draft_that_cannot_be_built_is_one_line_with_the_fix(capsys, tmp_path, passes, words):
    code, _, err = plan(capsys, tmp_path, passes)
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "speculative" in err and all(w in err for w in words), err
