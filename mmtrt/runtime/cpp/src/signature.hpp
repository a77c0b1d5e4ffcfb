// The bundle a load may run: a pinned digest and a required signature (src/signature.cpp).
#pragma once

#include <string>

namespace mmtrt {

// The sha256 of BUNDLE/manifest.json (the bundle's identity), after checking it equals `expect_digest` (when
// given, with or without "sha256:") and that the bundle carries a valid signature by `public_key` (a PEM file,
// when given). One-line errors of kind BadBundle (or BadInput for an unreadable key).
std::string check_trust(const std::string& bundle, const std::string& expect_digest, const std::string& public_key);

}  // namespace mmtrt
