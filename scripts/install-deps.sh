#!/usr/bin/env bash
# Installs every Debian package zerodp's build, tests, benchmarks and demo need.
# Idempotent: packages already present are skipped, and apt-get update runs at most once.
#   scripts/install-deps.sh          build + tests + demo (chromium: cli.report renders the page)
#   scripts/install-deps.sh --peer   also the PyTorch peer for bench/vs_torch
set -euo pipefail

packages=(
  cmake ninja-build g++ make pkg-config
  libfmt-dev nlohmann-json3-dev libcli11-dev zlib1g-dev libsentencepiece-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libdnnl-dev libopenblas-dev
  libopenmpi-dev openmpi-bin
  clang clang-format
  bible-kjv dataset-fashion-mnist
  python3
  chromium
  iproute2 util-linux
)
# cli.report_script parses the report page's script with node: any node on PATH will do.
if ! command -v node >/dev/null; then packages+=(nodejs); fi
if [[ "${1:-}" == "--peer" ]]; then
  packages+=(python3-torch python3-numpy)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
