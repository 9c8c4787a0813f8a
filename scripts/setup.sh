#!/usr/bin/env bash
# Installs everything kiln's build and tests need on Debian 12. Idempotent and quiet when
# everything is already there. Debian packages via apt-get; npm test oracles via package-lock.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(
  build-essential cmake ninja-build pkg-config git xz-utils
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libfmt-dev libcli11-dev libpcre2-dev libboost-dev libutf8proc-dev
  clang libclang-rt-14-dev clang-format
  python3 python3-jinja2 python3-jsonschema
)
# node/npm: use the machine's if present (it may come from another apt source); else Debian's.
command -v node >/dev/null 2>&1 || pkgs+=(nodejs)
command -v npm >/dev/null 2>&1 || pkgs+=(npm)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# npm test oracles, pinned by package-lock.json. Reinstall only when the lock changed.
stamp=node_modules/.kiln-lock-stamp
if [ ! -f "$stamp" ] || ! cmp -s package-lock.json "$stamp"; then
  echo "setup: npm ci"
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
  cp package-lock.json "$stamp"
fi
