#!/usr/bin/env bash
# Regenerate testdata/formats-numpy2 with the real current numpy 2.x (from
# the Python package registry, in a venv outside the tree):
#   bash testdata/formats/gen_numpy2.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
V="$(mktemp -d)/venv"
python3 -m venv "$V"
"$V/bin/pip" install --quiet --disable-pip-version-check 'numpy>=2,<3'
rm -rf testdata/formats-numpy2
"$V/bin/python" testdata/formats/gen.py testdata/formats-numpy2
rm -rf "$(dirname "$V")"
