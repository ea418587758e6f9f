#!/usr/bin/env bash
# Install Helmhive with Helm, apply a directory of Helmhive manifests, and wait until each object
# is Ready. On failure, print each object that is not, with its reason and message (the messages
# name the field path, e.g. `spec.filesystem: FilesystemWiderThanEnvelope: ...`), and exit 1.
#
#   examples/ci/kind-e2e.sh MANIFESTS_DIR
#
# kubectl and helm come from PATH and talk to the cluster in $KUBECONFIG (kind in CI). Settings,
# from the environment:
#   HELMHIVE_CHART          required: the chart, e.g. oci://ghcr.io/<owner>/charts/helmhive as the
#                           release workflow (examples/ci/release-images.yaml) pushes it, or a path
#   HELMHIVE_CHART_VERSION  the pinned chart version; required for a chart from a registry
#   HELMHIVE_NAMESPACE      the release's namespace     (default: helmhive-system)
#   HELMHIVE_HELM_ARGS      extra helm arguments, e.g. image overrides (word-split)
#   HELMHIVE_WAIT           how long each object may take to become Ready (default: 300s)
#
# .github/workflows/kind-e2e.yaml (examples/ci/kind-e2e.yaml) calls it; Helmhive's own CI runs it
# against its kind cluster (tests/e2e/test_6_ci_script.py), so the example cannot rot.
set -euo pipefail

dir=${1:?usage: kind-e2e.sh MANIFESTS_DIR}
chart=${HELMHIVE_CHART:?set HELMHIVE_CHART to the chart (oci://ghcr.io/<owner>/charts/helmhive, or a path)}
version=${HELMHIVE_CHART_VERSION:-}
if [ -z "$version" ] && [ ! -d "$chart" ]; then
  echo "HELMHIVE_CHART_VERSION must pin the version of a chart from a registry" >&2
  exit 2
fi
ns=${HELMHIVE_NAMESPACE:-helmhive-system}
wait_for=${HELMHIVE_WAIT:-300s}
read -r -a helm_args <<< "${HELMHIVE_HELM_ARGS:-}"

say() { printf '==> %s\n' "$*"; }

say "helm upgrade --install helmhive ${chart}${version:+ --version $version} -n $ns"
helm upgrade --install helmhive "$chart" ${version:+--version "$version"} -n "$ns" --create-namespace \
  --wait --timeout 5m "${helm_args[@]}"

# The operator publishes the envelopes before it admits profiles against them.
say "waiting for the operator and its envelopes"
kubectl -n "$ns" rollout status deployment -l app.kubernetes.io/instance=helmhive --timeout=5m
for _ in $(seq 1 60); do
  published=$(kubectl get envelopes -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}' 2>/dev/null | grep -c . || true)
  [ "$published" -ge 7 ] && break
  sleep 2
done

# The condition that says an object of each kind is usable.
condition_for() {
  case "$1" in
    Profile) echo Valid ;;
    MemoryRecord) echo Active ;;
    AgentJob) echo Succeeded ;;
    *) echo Ready ;;
  esac
}

say "kubectl apply -f $dir (all at once; order does not matter)"
# One line per object; kubectl prints a List for several objects and the object itself for one.
fields='{.apiVersion} {.kind} {.metadata.namespace} {.metadata.name}{"\n"}'
applied=$(kubectl apply -f "$dir" -R -o jsonpath="{range .items[*]}$fields{end}$fields")

conditions_path='jsonpath={range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}'
failed=0
while read -r api kind namespace name; do
  [ -n "$kind" ] || continue
  case "$api" in helmhive.dev/*) ;; *) continue ;; esac
  ref="${kind,,}.helmhive.dev/$name"
  scope=(); [ -n "$namespace" ] && scope=(-n "$namespace")
  cond=$(condition_for "$kind")
  if kubectl wait "${scope[@]}" --for=condition="$cond" --timeout="$wait_for" "$ref" > /dev/null 2>&1; then
    say "$kind ${namespace:+$namespace/}$name: $cond"
  else
    failed=1
    # Every condition, with its reason and message (the message names the field path).
    conditions=$(kubectl get "${scope[@]}" "$ref" -o "$conditions_path")
    echo "::error title=$kind ${namespace:+$namespace/}$name not $cond::${conditions//$'\n'/; }"
    printf '%s\n' "$conditions" | sed 's/^/  /'
  fi
done <<< "$applied"

if [ "$failed" -ne 0 ]; then
  say "some objects did not become ready (reasons above)"
  exit 1
fi
say "every Helmhive object in $dir is ready"
