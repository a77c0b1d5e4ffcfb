"""The C++ runtime rewrites a chat template so its engine, which has no trim_blocks or lstrip_blocks, renders what
transformers' Jinja renders. The rewrite (mmtrt-jinja-whitespace) is checked against jinja2 itself: the original
under transformers' settings and the rewrite under the engine's (no trimming, one trailing newline dropped)
render the same text, on generated templates and on whitespace every real template uses."""

import subprocess

import jinja2
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from cpp_harness import BUILD

TOOL = BUILD / "mmtrt-jinja-whitespace"
pytestmark = pytest.mark.skipif(not TOOL.is_file(), reason=f"{TOOL} is not built; run `make cpp`")
CONTEXT = dict(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
               add_generation_prompt=True)
HF = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)  # transformers' chat_template_utils
ENGINE = jinja2.Environment()  # what onnxruntime-genai's engine does with whitespace

# Tags with every whitespace sign, and text with every kind of whitespace Jinja strips (Unicode included).
OPENERS = ["{% if true %}", "{%- if true %}", "{%+ if true %}", "{% if true -%}", "{% if true +%}",
           "{% for m in messages %}", "{%- for m in messages -%}", "{% if false %}x{% else %}"]
CLOSERS = {"{% if": ["{% endif %}", "{%- endif %}", "{% endif -%}", "{%+ endif +%}"],
           "{% for": ["{% endfor %}", "{%- endfor -%}", "{% endfor +%}"]}
LEAVES = ["{{ m.role if m is defined else 'r' }}", "{{- 'a' }}", "{{ 'b' -}}", "{{+ 'c' }}", "{# note #}",
          "{#- note -#}", "{#+ note +#}", "{% set x = {'k': '%}'} %}{{ x.k }}", "{{ '}}' ~ \"{%\" }}",
          "\n", "\n\n", "  ", "\t", " \u00a0", "\u3000", "\r\n", "\r", "text", "{", "}", "%", "#", "'q'"]


def rewrite(template: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(TOOL)], input=template.encode(), capture_output=True, timeout=30)


def closer_for(opener: str) -> list[str]:
    return CLOSERS["{% for" if "for" in opener else "{% if"]


@st.composite
def templates(draw, depth=0):
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        if depth < 2 and draw(st.booleans()):
            opener = draw(st.sampled_from(OPENERS))
            parts += [opener, draw(templates(depth + 1)), draw(st.sampled_from(closer_for(opener)))]
        else:
            parts.append(draw(st.sampled_from(LEAVES)))
    return "".join(parts)


def check(template: str):
    try:
        expected = HF.from_string(template).render(**CONTEXT)
    except jinja2.TemplateSyntaxError:
        assume(False)
    proc = rewrite(template)
    assert proc.returncode == 0, proc.stderr
    assert ENGINE.from_string(proc.stdout.decode()).render(**CONTEXT) == expected, proc.stdout


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(templates())
@example("{#")  # a comment opened at the template's very end: Jinja renders it empty
@example("a\n  {#-")
@example("{{ 'x' }}{#+")
def test_rewrite_renders_as_transformers(template):
    check(template)


@pytest.mark.parametrize("template", [
    "{% for m in messages %}{{ m.role }}: {{ m.content }}{% endfor %}\n{% if add_generation_prompt %}A:{% endif %}\n",
    "{% for m in messages %}\n    {% if m.role == 'user' %}\n        U: {{ m.content }}\n    {% endif %}\n{% endfor %}",
    "{{ 'x' }}\n{# a comment on its own line #}\n  {% if true %}y{% endif %}\n\n",
    "a\r\n{% if true %}\r\nb{% endif %}\r\n",
    "{% if true %}a{% endif %}\n\n\n",
])
def test_newlines_after_block_tags(template):
    assert HF.from_string(template).render(**CONTEXT) != ENGINE.from_string(template).render(**CONTEXT)
    check(template)


@pytest.mark.parametrize("template, problem", [
    ("{% if true %}a", None), ("a {% if true", "never closed"), ("a {# note", "never closed"),
    ("{{ 'a }}", "string that is never closed"), ("{{ (1 }}", "unexpected '}'"), ("{{ ) }}", "unexpected ')'"),
])
def test_unclosed_tags_are_refused(template, problem):
    proc = rewrite(template)
    if problem is None:  # an unclosed block is the engine's to report, as Jinja's parser does
        assert proc.returncode == 0
        return
    assert proc.returncode == 2 and problem in proc.stderr.decode() and proc.stderr.count(b"\n") == 1
    with pytest.raises(jinja2.TemplateSyntaxError):
        HF.from_string(template)
