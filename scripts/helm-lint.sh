#!/usr/bin/env bash
# Checks the Kubernetes deployment files without a cluster (none can be run here):
#   - the Helm chart deploy/helm/warren: `helm lint`, and `helm template` with the default
#     values and with the other branches (existing Secrets, AMQP TLS, 5 replicas, no TLS);
#   - the plain manifests deploy/kubernetes/*.yaml parse;
#   - both carry what docs/deploy.md promises (tests/deploy/check_manifests.py): Parallel pod
#     management, a headless Service publishing not-ready addresses, seeds and advertised
#     names by the pods' DNS names, a TCP readiness probe on AMQP, a startup probe, no liveness
#     probe, a preStop that awaits quorum-plus-one then drains, a PodDisruptionBudget, cluster
#     TLS from a Secret, a data volume claim.
# helm is built once from the Go module proxy into .tools/bin (version pinned below).
set -euo pipefail
cd "$(dirname "$0")/.."
HELM_VERSION=v3.19.0
helm=.tools/bin/helm
# A helm built by go install reports no patch version itself: its module's version says it.
if ! go version -m "$helm" 2>/dev/null | grep -qE "^\s+mod\s+helm.sh/helm/v3\s+$HELM_VERSION\s"; then
  echo "[helm-lint] building helm $HELM_VERSION (once; a few minutes)" >&2
  mkdir -p .tools/bin
  GOBIN="$PWD/.tools/bin" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi
python=python3
"$python" -c "import yaml" 2>/dev/null || {
  [ -x .venv/bin/python ] || python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check PyYAML
  python=.venv/bin/python
}

chart=deploy/helm/warren
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$helm" lint --strict "$chart"
"$helm" template demo "$chart" --namespace queues > "$out/default.yaml"
"$helm" template demo "$chart" --namespace queues --set replicas=5 \
  --set defaultUser.existingSecret=mq-login --set clusterTls.existingSecret=mq-cluster-tls \
  --set amqpTls.enabled=true --set amqpTls.existingSecret=mq-amqp-tls \
  --set resources.limits.memory=512Mi --set podAntiAffinity=required > "$out/existing.yaml"
"$helm" template demo "$chart" --namespace queues --set clusterTls.enabled=false \
  --set podAntiAffinity=none > "$out/plain-links.yaml"
# A quantity the chart cannot read is refused with a message, not rendered wrong.
if "$helm" template demo "$chart" --set resources.limits.memory=lots >/dev/null 2>"$out/err"; then
  echo "[helm-lint] a memory limit of 'lots' was accepted" >&2; exit 1
fi
grep -q "not a quantity" "$out/err"

"$python" tests/deploy/check_manifests.py \
  --plain deploy/kubernetes/services.yaml deploy/kubernetes/statefulset.yaml \
          deploy/kubernetes/poddisruptionbudget.yaml deploy/kubernetes/kustomization.yaml \
  --chart "$out/default.yaml" --chart-existing "$out/existing.yaml" \
  --chart-plain-links "$out/plain-links.yaml"
echo "[helm-lint] chart and manifests pass" >&2
