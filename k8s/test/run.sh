#!/usr/bin/env bash
# tiervm's DRA driver against a real Kubernetes control plane (issue 33;
# docs/scale-out.md). Builds the control plane (kube-apiserver,
# kube-scheduler, kube-controller-manager and etcd) from the Go module proxy
# into a cache reused across runs (k8s/controlplane/build.sh), checks the
# driver module's format, vets and tests it, and runs the
# end-to-end test: etcd, kube-apiserver, kube-scheduler and
# kube-controller-manager on loopback, three nodes each with its own
# `tiervm serve`, the kubelet's DRA calls made by the test.
#
#   TIERVM_BIN        the tiervm binary (default target/release/tiervm)
#   TIERVM_K8S_REQUIRE=1  a missing prerequisite fails instead of skipping
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH="/usr/local/go/bin:$PATH"
fi
if ! command -v go >/dev/null 2>&1; then
  echo "go not found: the DRA driver and the control plane are Go (go 1.26)" >&2
  exit 1
fi
echo "== $(go version)"

t0=$(date +%s)
bin=$(nice -n 10 k8s/controlplane/build.sh | tail -1)
echo "== control plane binaries: $bin ($(( $(date +%s) - t0 )) s)"

export TIERVM_BIN=${TIERVM_BIN:-$root/target/release/tiervm}
export TIERVM_K8S_BIN=$bin
export TIERVM_K8S_REPORT=${TIERVM_K8S_REPORT:-$root/target/k8s-e2e-report.txt}
mkdir -p "$(dirname "$TIERVM_K8S_REPORT")"
rm -f "$TIERVM_K8S_REPORT"
cd k8s/dra-driver
gofmt_out=$(gofmt -l .)
if [ -n "$gofmt_out" ]; then
  echo "gofmt: not formatted: $gofmt_out" >&2
  exit 1
fi
go vet ./...
rc=0
go test -count=1 -timeout 20m -v ./... || rc=$?
[ -f "$TIERVM_K8S_REPORT" ] && { echo "== what the end-to-end run showed"; cat "$TIERVM_K8S_REPORT"; }
exit "$rc"
