#!/usr/bin/env bash
# Puts what the C++ runtime builds against into DEPS (default build/cpp/deps); quick when already done.
#   - Debian packages (as root): g++, nlohmann-json3-dev, libstb-dev, libssl-dev, libjpeg62-turbo-dev, cmake, ninja-build
#   - ONNX Runtime headers from Debian trixie's libonnxruntime-dev, unpacked (never installed: bookworm has none)
#   - the onnxruntime-genai wheel's libonnxruntime-genai.so (tokenizer C API), installed --no-deps into DEPS
#   - links to the ONNX Runtime library of PYTHON's onnxruntime wheel (the one the Python runtime uses)
set -euo pipefail
PYTHON=${1:?usage: fetch_deps.sh PYTHON [DEPS]}
DEPS=$(mkdir -p "${2:-build/cpp/deps}" && cd "${2:-build/cpp/deps}" && pwd)
GENAI_VERSION=0.18.0
PACKAGES="g++ nlohmann-json3-dev libstb-dev libssl-dev libjpeg62-turbo-dev cmake ninja-build"

missing=$(dpkg-query -W -f='${Package} ${db:Status-Status}\n' $PACKAGES 2>/dev/null | awk '$2 != "installed" {print $1}' || true)
if [ -n "$missing" ] || [ "$(dpkg-query -W $PACKAGES 2>/dev/null | wc -l)" -ne "$(echo $PACKAGES | wc -w)" ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "fetch_deps.sh: installing Debian packages needs root; run as root or: apt-get install $PACKAGES" >&2
    exit 2
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $PACKAGES >/dev/null
fi

if [ ! -f "$DEPS/ort/include/onnxruntime_cxx_api.h" ]; then
  apt_dir="$DEPS/apt-trixie"
  mkdir -p "$apt_dir/lists/partial"
  cat > "$apt_dir/trixie.sources" <<SRC
Types: deb
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  opts=(-o "Dir::Etc::sourcelist=$apt_dir/trixie.sources" -o "Dir::Etc::sourceparts=-" -o "Dir::State::Lists=$apt_dir/lists")
  apt-get -qq "${opts[@]}" update
  (cd "$apt_dir" && apt-get -qq "${opts[@]}" download libonnxruntime-dev 2>/dev/null)
  dpkg -x "$apt_dir"/libonnxruntime-dev_*.deb "$apt_dir/root"
  mkdir -p "$DEPS/ort"
  rm -rf "$DEPS/ort/include" && cp -r "$apt_dir/root/usr/include/onnxruntime" "$DEPS/ort/include"
fi

capi=$("$PYTHON" -c 'import os, onnxruntime; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi"))')
lib=$(ls "$capi"/libonnxruntime.so.1.* | head -n1)
mkdir -p "$DEPS/ort/lib"
ln -sfn "$lib" "$DEPS/ort/lib/libonnxruntime.so.1"
ln -sfn "$lib" "$DEPS/ort/lib/libonnxruntime.so"

if [ ! -f "$DEPS/genai/onnxruntime_genai/libonnxruntime-genai.so" ]; then
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps --target "$DEPS/genai" \
    "onnxruntime-genai==$GENAI_VERSION"
fi
