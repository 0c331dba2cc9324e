#!/usr/bin/env bash
# Builds the real kube-apiserver, kube-scheduler and kube-controller-manager
# of the k8s.io/kubernetes version pinned in go.mod, and etcd's server at the
# version that k8s.io/kubernetes pins (cmd/etcd: go.etcd.io/etcd/server/v3's
# etcdmain) (from the Go module
# proxy: go.mod maps every staging module k8s.io/X to its published
# v0.MINOR.PATCH, go.sum pins them all) into a cache reused across runs, and
# prints the directory holding them (last line of stdout).
#
#   TIERVM_K8S_CACHE  cache directory (default ~/.cache/tiervm-k8s)
#
# The cache key is the version and a hash of go.mod and go.sum, so a version
# bump builds anew. Go's own build cache (GOCACHE) makes a rebuild after a key
# change cheaper; the module cache (GOMODCACHE) keeps the downloads.
set -euo pipefail
cd "$(dirname "$0")"
ver=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
[ -n "$ver" ] || { echo "build.sh: no k8s.io/kubernetes version in go.mod" >&2; exit 1; }
key=$(cat go.mod go.sum build.sh | sha256sum | cut -c1-12)
cache=${TIERVM_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tiervm-k8s}
out="$cache/$ver-$key/bin"
bins=(kube-apiserver kube-scheduler kube-controller-manager etcd)
have=1
for b in "${bins[@]}"; do [ -x "$out/$b" ] || have=0; done
if [ "$have" = 1 ]; then
  echo "== control plane $ver: cached in $out" >&2
  echo "$out"
  exit 0
fi
command -v go >/dev/null || { echo "build.sh: go not found" >&2; exit 1; }
echo "== building kube-apiserver, kube-scheduler, kube-controller-manager $ver and etcd (cold: about 9 CPU-minutes, docs/scale-out.md)" >&2
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
major=${ver#v}; major=${major%%.*}
minor=${ver#v*.}; minor=${minor%%.*}
pkg=k8s.io/component-base/version
ldflags="-s -w -X $pkg.gitVersion=$ver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
start=$(date +%s)
# -mod=readonly: go.sum must already pin everything (no silent upgrade).
go build -mod=readonly -ldflags "$ldflags" -o "$tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-controller-manager \
  ./cmd/etcd >&2
mkdir -p "$(dirname "$out")"
rm -rf "$out"
mv "$tmp" "$out"
trap - EXIT
# Builds of other versions or keys are not used again: drop them.
for d in "$cache"/v*-*; do
  [ "$d" = "$(dirname "$out")" ] || rm -rf "$d"
done
echo "== built in $(( $(date +%s) - start )) s: $out" >&2
"$out/kube-apiserver" --version >&2
etcd_version=$("$out/etcd" --version)
echo "${etcd_version%%$'\n'*}" >&2
echo "$out"
