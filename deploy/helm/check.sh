#!/usr/bin/env bash
# Offline checks for the Tern Helm chart (used by CI).
#
#   deploy/helm/check.sh [TOOLS_DIR]
#
# TOOLS_DIR holds the `helm` and `kubectl-validate` wrappers. A path given on
# the command line is taken relative to the current directory; the default is
# ../shared/tools relative to the repository root. The script changes to the
# repository root itself and exits non-zero on the first failure.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

if [[ $# -ge 1 ]]; then
  tools="$(cd "$1" && pwd)"
else
  tools="$(cd "$repo_root/../shared/tools" && pwd)"
fi

cd "$repo_root"

helm="$tools/helm"
validate="$tools/kubectl-validate"
chart=deploy/helm/tern
ci_values="$chart/ci/values-tls.yaml"
kube_version=1.30

for tool in "$helm" "$validate"; do
  if [[ ! -x "$tool" ]]; then
    echo "check.sh: $tool not found or not executable" >&2
    exit 2
  fi
done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

step() { printf '\n==> %s\n' "$*"; }

step "helm lint $chart"
"$helm" lint "$chart"

step "helm lint $chart -f $ci_values"
"$helm" lint "$chart" -f "$ci_values"

step "helm template tern $chart | kubectl-validate --version $kube_version"
"$helm" template tern "$chart" > "$work/rendered.yaml"
"$validate" "$work/rendered.yaml" --version "$kube_version"

step "helm template tern $chart -f $ci_values | kubectl-validate --version $kube_version"
"$helm" template tern "$chart" -f "$ci_values" > "$work/rendered-tls.yaml"
"$validate" "$work/rendered-tls.yaml" --version "$kube_version"

printf '\nAll chart checks passed.\n'
