#!/usr/bin/env bash
# Checks the specs the project ships: in k8s/ the alerting rules with promtool (Debian's prometheus package), every
# manifest against the Kubernetes schemas (kubernetes-validate from PyPI), rendered through kustomize when kubectl is
# there; docs/openapi.json against the OpenAPI 3.1 schema (openapi-spec-validator from PyPI). The dashboard's and the
# rules' metric names are checked against engram's metrics, and docs/openapi.json against the served document, by
# `cargo test`.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v promtool >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
promtool check rules k8s/alerts.rules.yml
# The Python checkers live in a cache of their own (reused by a later run; no system site-packages touched).
py="${HOME}/.cache/engram/py"
export PYTHONPATH="${py}${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c 'import kubernetes_validate, openapi_spec_validator' 2>/dev/null; then
    python3 -m pip install -q --target "$py" kubernetes-validate openapi-spec-validator
fi
python3 -c 'import json, sys; json.load(open("k8s/dashboard.json"))'
manifests=(k8s/configmap.yaml k8s/secret.yaml k8s/services.yaml k8s/statefulset.yaml k8s/networkpolicy.yaml k8s/prometheus.yaml)
if command -v kubectl >/dev/null 2>&1 && kubectl kustomize k8s >/tmp/engram-k8s.yaml 2>/dev/null; then
    python3 -m kubernetes_validate --strict --quiet /tmp/engram-k8s.yaml
    echo "k8s: the kustomization renders $(grep -c '^kind:' /tmp/engram-k8s.yaml) objects, all valid"
else
    python3 -m kubernetes_validate --strict --quiet "${manifests[@]}"
    echo "k8s: ${#manifests[@]} manifests valid (no kubectl with kustomize here: not rendered)"
fi
python3 -c 'import json; from openapi_spec_validator import validate; validate(json.load(open("docs/openapi.json")))'
echo "docs/openapi.json: a valid OpenAPI 3.1 document"
