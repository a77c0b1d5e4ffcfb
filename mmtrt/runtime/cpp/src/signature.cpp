// Which bundle a load may run (mmtrt/bundle/trust.py): the digest a caller pins, and the signature `mmtrt sign`
// writes (OpenSSF model-signing, elliptic-curve key): a Sigstore bundle whose DSSE envelope holds an in-toto
// statement of every file's sha256. The ECDSA signature over DSSE's pre-authentication encoding is checked with
// OpenSSL, then the statement must list exactly manifest.json (with its digest) and the manifest's artifacts (with
// theirs); the artifact check that follows at load covers their content.
#include "signature.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>

#include <openssl/evp.h>
#include <openssl/pem.h>

#include "manifest.hpp"
#include "mmtrt/bundle.hpp"

namespace mmtrt {
namespace {

const char* kPayloadType = "application/vnd.in-toto+json";
const char* kPredicate = "https://model_signing/signature/v1.0";

Error bad(const std::string& message) { return Error(ErrorKind::BadBundle, message); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool base64(const std::string& text, std::string& out) {
  if (text.size() % 4 != 0) return false;
  out.resize(text.size() / 4 * 3);
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) return false;
  size_t pad = 0;
  while (pad < 2 && pad < text.size() && text[text.size() - 1 - pad] == '=') ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return true;
}

std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)> public_key(const std::string& path) {
  std::unique_ptr<BIO, int (*)(BIO*)> bio(BIO_new_file(path.c_str(), "rb"), BIO_free);
  if (!bio)
    throw Error(ErrorKind::BadInput, "cannot read public key " + path + "; pass the PEM file of the signer's public key");
  std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)> key(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr),
                                                      EVP_PKEY_free);
  if (!key)
    throw Error(ErrorKind::BadInput, path + " is not a PEM public key; pass the signer's public key (openssl ec -pubout)");
  const int bits = EVP_PKEY_get_bits(key.get());
  if (EVP_PKEY_get_base_id(key.get()) != EVP_PKEY_EC || (bits != 256 && bits != 384 && bits != 521))
    throw Error(ErrorKind::BadInput, path + " is not an elliptic-curve key on P-256, P-384 or P-521, which "
                                            "model-signing uses");
  return key;
}

// DSSE's pre-authentication encoding: what the signature is over.
std::string pae(const std::string& type, const std::string& payload) {
  return "DSSEv1 " + std::to_string(type.size()) + " " + type + " " + std::to_string(payload.size()) + " " + payload;
}

void check_ecdsa(const std::string& bundle, const std::string& key_path, const std::string& message,
                 const std::string& signature) {
  auto key = public_key(key_path);
  const int bits = EVP_PKEY_get_bits(key.get());
  const EVP_MD* md = bits == 256 ? EVP_sha256() : bits == 384 ? EVP_sha384() : EVP_sha512();
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  const bool ok = ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, md, nullptr, key.get()) == 1 &&
                  EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                                   signature.size(), reinterpret_cast<const unsigned char*>(message.data()),
                                   message.size()) == 1;
  if (!ok)
    throw bad("the signature of bundle " + bundle + " does not verify with " + key_path + ": another key signed it, "
              "or it was changed; sign it again or pass the signer's public key");
}

std::map<std::string, std::string> signed_files(const std::string& bundle, const std::string& key_path) {
  const std::string path = bundle + "/model.sig";
  std::ifstream probe(path);
  if (!probe)
    throw bad("bundle " + bundle + " is not signed (no model.sig); sign it with `mmtrt sign " + bundle +
              " --key KEY`, or load it without a public key");
  std::string type, payload, signature;
  try {
    const json envelope = json::parse(read_file(path)).at("dsseEnvelope");
    type = envelope.at("payloadType").get<std::string>();
    if (!base64(envelope.at("payload").get<std::string>(), payload) ||
        !base64(envelope.at("signatures").at(0).at("sig").get<std::string>(), signature))
      throw std::invalid_argument("base64");
  } catch (const std::exception&) {
    throw bad(path + " is not a model-signing signature (a Sigstore bundle with a DSSE envelope); sign the bundle "
              "again");
  }
  if (type != kPayloadType)
    throw bad(path + " signs a '" + type + "' payload, not an in-toto statement; sign the bundle again with "
              "`mmtrt sign`");
  check_ecdsa(bundle, key_path, pae(type, payload), signature);
  const Error other = bad(path + " signs something other than a bundle's files (model-signing's `files` statement "
                                 "with sha256); sign the bundle with `mmtrt sign`");
  std::map<std::string, std::string> files;
  try {
    const json statement = json::parse(payload);
    const json& serialization = statement.at("predicate").at("serialization");
    if (statement.at("predicateType") != kPredicate || serialization.at("method") != "files" ||
        serialization.at("hash_type") != "sha256")
      throw other;
    for (const auto& ignored : serialization.value("ignore_paths", json::array()))
      if (ignored != "engines" && ignored != "model.sig" && ignored != "build_report.json") throw other;
    for (const auto& r : statement.at("predicate").at("resources")) {
      if (r.at("algorithm") != "sha256") throw other;
      files[r.at("name").get<std::string>()] = r.at("digest").get<std::string>();
    }
  } catch (const json::exception&) {
    throw other;
  }
  return files;
}

}  // namespace

std::string check_trust(const std::string& bundle, const std::string& expect_digest, const std::string& key_path) {
  const std::string manifest_path = bundle + "/manifest.json";
  std::ifstream probe(manifest_path);
  if (!probe)
    throw bad(bundle + " is not an mmtrt bundle (no manifest.json); pass the folder `mmtrt compile` wrote");
  const std::string digest = sha256_file(manifest_path);
  if (!expect_digest.empty()) {
    std::string expected;
    for (char c : expect_digest) expected += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (expected.rfind("sha256:", 0) == 0) expected = expected.substr(7);
    if (expected != digest)
      throw bad("bundle " + bundle + " has digest sha256:" + digest + ", not the expected sha256:" + expected +
                "; it is another bundle or was changed since (`mmtrt inspect` prints a bundle's digest)");
  }
  if (key_path.empty()) return digest;
  const auto files = signed_files(bundle, key_path);
  const auto manifest_entry = files.find("manifest.json");
  if (manifest_entry == files.end() || manifest_entry->second != digest)
    throw bad("bundle " + bundle + ": manifest.json differs from what its signature covers; it was changed after "
              "signing: restore it or sign it again");
  std::map<std::string, std::string> expected = {{"manifest.json", digest}};
  const json manifest = read_json_file(manifest_path);
  if (manifest.is_object() && manifest.contains("artifacts") && manifest.at("artifacts").is_object())
    for (const auto& [name, sha] : manifest.at("artifacts").items()) expected[name] = sha.dump();
  for (auto& [name, sha] : expected)
    if (name != "manifest.json" && sha.size() > 1 && sha.front() == '"') sha = sha.substr(1, sha.size() - 2);
  std::vector<std::string> differ;
  for (const auto& [name, sha] : files)
    if (!expected.count(name) || expected.at(name) != sha) differ.push_back(name);
  for (const auto& [name, sha] : expected)
    if (!files.count(name)) differ.push_back(name);
  if (!differ.empty()) {
    std::sort(differ.begin(), differ.end());
    differ.erase(std::unique(differ.begin(), differ.end()), differ.end());
    std::string names;
    for (size_t i = 0; i < differ.size() && i < 3; ++i) names += (i ? ", " : "") + differ[i];
    throw bad("bundle " + bundle + " differs from what its signature covers (" + names + "); it was changed after "
              "signing: restore it or sign it again");
  }
  return digest;
}

}  // namespace mmtrt
