"""The generated pages of docs/ (recipe, CLI and nightly references, each pass's options) match the code."""

from mmtrt.docgen import ROOT, expected
from mmtrt.pipeline.registry import registered_passes


def test_generated_docs_are_current():
    stale = [str(path.relative_to(ROOT)) for path, text in expected().items()
             if not path.exists() or path.read_text() != text]
    assert not stale, f"stale: {', '.join(stale)}; run: make docs"


def test_every_pass_has_a_page_that_says_what_it_does():
    for name in registered_passes():
        text = (ROOT / "docs" / "passes" / f"{name}.md").read_text()
        assert text.startswith(f"# `{name}`\n\n") and len(text.split("<!-- BEGIN")[0].split()) > 20, name
