// Mirrors jinja2/lexer.py (Lexer.tokeniter and its rules) for an environment with trim_blocks=True,
// lstrip_blocks=True and keep_trailing_newline=False, as transformers' chat_template_utils builds it.
#include "jinja_whitespace.hpp"

#include <vector>

#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

// Python's str.isspace, which both `\s` in Jinja's patterns and str.rstrip use.
bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// The code point of the UTF-8 sequence s[at, at + length).
char32_t decode(const std::string& s, size_t at, size_t length) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  if (length == 1) return byte(at) < 0x80 ? byte(at) : 0xfffd;  // a stray continuation byte is no space
  char32_t c = byte(at) & (0x7f >> length);
  for (size_t i = 1; i < length; ++i) c = (c << 6) | (byte(at + i) & 0x3f);
  return c;
}

size_t sequence_length(unsigned char lead) { return lead < 0xc0 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4; }

// The bytes of the whitespace code point starting at `at` (0 if there is none).
size_t space_at(const std::string& s, size_t at) {
  if (at >= s.size()) return 0;
  const size_t length = sequence_length(static_cast<unsigned char>(s[at]));
  return at + length <= s.size() && is_space(decode(s, at, length)) ? length : 0;
}

// The bytes of the whitespace code point ending at `end` (0 if there is none).
size_t space_before(const std::string& s, size_t end) {
  size_t start = end;
  while (start > 0 && (static_cast<unsigned char>(s[start - 1]) & 0xc0) == 0x80 && end - start < 3) --start;
  if (start == 0) return 0;
  --start;
  return start + sequence_length(static_cast<unsigned char>(s[start])) == end && is_space(decode(s, start, end - start))
             ? end - start
             : 0;
}

size_t skip_spaces(const std::string& s, size_t at) {
  while (const size_t n = space_at(s, at)) at += n;
  return at;
}

std::string normalized_newlines(const std::string& source) {
  std::string out;
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] != '\r') {
      out += source[i];
      continue;
    }
    out += '\n';
    if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Rewriter {
 public:
  explicit Rewriter(std::string source) : s_(std::move(source)) {}

  std::string run() {
    size_t pos = 0;
    while (true) {
      const size_t start = next_tag(pos);
      if (start == std::string::npos) break;
      std::string text = s_.substr(pos, start - pos);
      const char kind = s_[start + 1];
      size_t inner = start + 2;
      const char sign = inner < s_.size() && (s_[inner] == '-' || s_[inner] == '+') ? s_[inner++] : '\0';
      if (sign == '-') {
        text = rstripped(text);
      } else if (sign != '+' && kind != '{') {
        lstrip_line(text);
      }
      pending_ += text;
      pos = kind == '#' ? comment_end(inner) : tag_end(kind, inner);
    }
    pending_ += s_.substr(pos);
    flush(true);
    return out_;
  }

 private:
  const std::string s_;
  std::string out_, pending_;  // pending_: data not yet written, so text around a dropped comment joins
  bool line_starting_ = true;  // the last tag's match ended with a newline (Jinja's line_starting)

  bool at(size_t i, const char* what) const { return s_.compare(i, std::char_traits<char>::length(what), what) == 0; }

  size_t next_tag(size_t from) const {
    for (size_t i = s_.find('{', from); i != std::string::npos; i = s_.find('{', i + 1))
      if (i + 1 < s_.size() && (s_[i + 1] == '%' || s_[i + 1] == '{' || s_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  static std::string rstripped(std::string text) {
    while (const size_t n = space_before(text, text.size())) text.resize(text.size() - n);
    return text;
  }

  // Whitespace alone between the line's start and a block or comment tag goes.
  void lstrip_line(std::string& text) const {
    const size_t newline = text.rfind('\n');
    const size_t line = newline == std::string::npos ? 0 : newline + 1;
    if ((line > 0 || line_starting_) && line < text.size() && skip_spaces(text, line) == text.size())
      text.resize(line);
  }

  size_t finish(size_t end) {
    line_starting_ = end > 0 && s_[end - 1] == '\n';
    return end;
  }

  // A comment opened at the template's very end is empty: Jinja's lexer stops there without an error.
  size_t comment_end(size_t from) {
    if (from == s_.size()) return from;
    for (size_t p = from; p < s_.size(); ++p) {
      if (at(p, "+#}")) return finish(p + 3);
      if (at(p, "-#}")) return finish(skip_spaces(s_, p + 3));
      if (at(p, "#}")) return finish(p + 2 + (at(p + 2, "\n") ? 1 : 0));
    }
    throw Error(ErrorKind::BadBundle, "the chat template has a {# comment that is never closed");
  }

  // The end of the tag's match, its inner text (brackets and strings skipped, as Jinja's balancing) written out.
  size_t tag_end(char kind, size_t inner) {
    std::vector<char> closing;
    for (size_t p = inner; p < s_.size();) {
      if (closing.empty()) {
        const size_t end = kind == '%' ? block_end(p) : variable_end(p);
        if (end != std::string::npos) {
          write_tag(kind, s_.substr(inner, p - inner));
          return finish(end);
        }
      }
      const char c = s_[p];
      if (c == '\'' || c == '"') {
        p = string_end(p);
        continue;
      }
      if (c == '(' || c == '[' || c == '{') closing.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      if (c == ')' || c == ']' || c == '}') {
        if (closing.empty() || closing.back() != c)
          throw Error(ErrorKind::BadBundle, std::string("the chat template has an unexpected '") + c + "' in a tag");
        closing.pop_back();
      }
      ++p;
    }
    throw Error(ErrorKind::BadBundle, std::string("the chat template has a {") + kind + " tag that is never closed");
  }

  size_t block_end(size_t p) const {
    if (at(p, "+%}")) return p + 3;
    if (at(p, "-%}")) return skip_spaces(s_, p + 3);
    if (at(p, "%}")) return p + 2 + (at(p + 2, "\n") ? 1 : 0);
    return std::string::npos;
  }

  size_t variable_end(size_t p) const {
    if (at(p, "-}}")) return skip_spaces(s_, p + 3);
    if (at(p, "}}")) return p + 2;
    return std::string::npos;
  }

  size_t string_end(size_t p) const {
    const char quote = s_[p];
    for (++p; p < s_.size(); ++p) {
      if (s_[p] == '\\') {
        ++p;
      } else if (s_[p] == quote) {
        return p + 1;
      }
    }
    throw Error(ErrorKind::BadBundle, "the chat template has a string that is never closed");
  }

  void write_tag(char kind, const std::string& inner) {
    flush(false);
    out_ += kind == '%' ? "{% " + inner + " %}" : "{{ " + inner + " }}";
  }

  // Data the engine would read as a tag's start, or whose last newline it would drop, goes as a string literal.
  void flush(bool last) {
    if (pending_.empty()) return;
    const bool literal = pending_.find("{{") != std::string::npos || pending_.find("{%") != std::string::npos ||
                         pending_.find("{#") != std::string::npos || pending_.back() == '{' ||
                         (last && pending_.back() == '\n');
    if (!literal) {
      out_ += pending_;
    } else {
      out_ += "{{ '";
      for (const char c : pending_) out_ += c == '\\' ? "\\\\" : c == '\'' ? "\\'" : c == '\n' ? "\\n" : std::string(1, c);
      out_ += "' }}";
    }
    pending_.clear();
  }
};

}  // namespace

std::string with_jinja_whitespace(const std::string& source) { return Rewriter(normalized_newlines(source)).run(); }

}  // namespace mmtrt
