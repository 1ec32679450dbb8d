#!/usr/bin/env bash
# Installs every system dependency Glossa uses on Debian 12. Idempotent: packages already present are
# not reinstalled and `apt-get update` runs at most once per invocation, only when something is missing.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev python3-torch libopenblas-dev
  libprotobuf-dev protobuf-compiler libonnx-dev
  libgtest-dev libgmock-dev
  libssl-dev zlib1g-dev
  nlohmann-json3-dev libcli11-dev libgoogle-glog-dev
  libsentencepiece-dev sentencepiece libgloo-dev
  libcpp-httplib-dev curl python3-sentencepiece
  sword-text-kjv sword-text-sparv libsword-utils
  chromium-headless-shell bsdutils
  pybind11-dev python3-dev python3-pytest
  libpng-dev dataset-fashion-mnist
  espeak-ng sox pocketsphinx-testdata
  iproute2
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

# Node.js and npm run ONNX Runtime (bench/onnx): Debian's packages, unless a node and an npm are
# already on PATH (a NodeSource nodejs ships its own npm and conflicts with Debian's).
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)

# ONNX Runtime's CPU build from the npm registry, pinned by bench/onnx/package-lock.json. Its
# install script only downloads GPU providers, so it is skipped (--ignore-scripts).
install_onnxruntime() {
  local dir want have
  dir="$(cd "$(dirname "$0")/.." && pwd)/bench/onnx"
  want="$(sed -n 's/.*"onnxruntime-node": "\(.*\)".*/\1/p' "$dir/package.json")"
  have="$(sed -n 's/^  "version": "\(.*\)",$/\1/p' "$dir/node_modules/onnxruntime-node/package.json" 2>/dev/null || true)"
  if [ "$have" = "$want" ]; then return 0; fi
  echo "setup.sh: installing onnxruntime-node $want into bench/onnx (npm ci --ignore-scripts)"
  if ! (cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund >/dev/null); then
    echo "setup.sh: ERROR: npm could not install onnxruntime-node $want into $dir" >&2
    exit 1
  fi
}

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup.sh: all ${#PACKAGES[@]} packages already installed"
  install_onnxruntime
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

echo "setup.sh: installing ${missing[*]}"
$SUDO apt-get update -q
if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  # Name the package that failed, not just "apt-get failed".
  for p in "${missing[@]}"; do
    if ! $SUDO apt-get install -y -q --no-install-recommends "$p" >/dev/null 2>&1; then
      echo "setup.sh: ERROR: could not install Debian package '$p'" >&2
    fi
  done
  exit 1
fi
install_onnxruntime
echo "setup.sh: done"
