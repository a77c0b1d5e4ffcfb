// Reads a chat template on stdin and writes what the runtime hands its template engine, so the tests can check
// the rewrite against jinja2 itself (tests/runtime/cpp/test_cpp_chat_templates.py).
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "../src/jinja_whitespace.hpp"
#include "mmtrt/bundle.hpp"

int main() {
  const std::string source((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  try {
    std::cout << mmtrt::with_jinja_whitespace(source);
  } catch (const mmtrt::Error& exc) {
    std::fprintf(stderr, "%s\n", exc.what());
    return 2;
  }
  return 0;
}
