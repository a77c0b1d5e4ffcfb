// transformers renders chat templates with Jinja's trim_blocks and lstrip_blocks; onnxruntime-genai's template
// engine has neither (and no `{%+`, and keeps carriage returns). The template is rewritten once, at load, into
// one whose plain rendering is Jinja's with those settings: the whitespace Jinja's lexer drops is dropped here.
#pragma once

#include <string>

namespace mmtrt {

// Jinja 3's lexer rules, applied to the text between tags: newlines normalised to \n and one trailing newline
// dropped; a block or comment tag's first newline after it dropped (trim_blocks, unless `+%}`); spaces from a
// line's start to a block or comment tag dropped (lstrip_blocks, unless `{%+`); `{%-`/`-%}` (and the variable
// and comment forms) strip all whitespace on their side. Comments are removed, tags keep their inner text
// without the signs. Throws mmtrt::Error (BadBundle) for a tag that is never closed.
std::string with_jinja_whitespace(const std::string& source);

}  // namespace mmtrt
