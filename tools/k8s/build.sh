#!/usr/bin/env bash
# Builds the Kubernetes control plane the k8s tests run against, from Go modules, into
# a cache outside the repository; does nothing when every binary is already there.
#
#   kube-apiserver, kube-controller-manager (garbage collection of owned pods, the
#   default ServiceAccount), kube-scheduler   k8s.io/kubernetes   v1.37.2
#   etcd                                      go.etcd.io/etcd     v3.7.3
#   kwok (nodes that report as a kubelet)     sigs.k8s.io/kwok    v0.8.0
#
# About 30 minutes on 2 cores the first time (the Go module cache grows by ~1.2 GB).
# Prints the cache folder on its last line.
set -euo pipefail
K8S=v1.37.2
STAGING=v0.37.2
ETCD=v3.7.3
KWOK=v0.8.0
CACHE=${MONARCH_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/monarch-kernel/k8s}/$K8S
BINS=(kube-apiserver kube-controller-manager kube-scheduler etcd kwok)

missing=()
for b in "${BINS[@]}"; do [ -x "$CACHE/bin/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then echo "$CACHE"; exit 0; fi
command -v go >/dev/null || { echo "the k8s test bed needs Go (1.26 or newer) to build ${missing[*]}" >&2; exit 1; }
mkdir -p "$CACHE/bin" "$CACHE/stages"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export GOFLAGS=-buildvcs=false CGO_ENABLED=0

need() { [[ " ${missing[*]} " == *" $1 "* ]]; }

if need kube-apiserver || need kube-controller-manager || need kube-scheduler; then
  echo "building kube-apiserver, kube-controller-manager, kube-scheduler $K8S (about 25 minutes)" >&2
  mkdir -p "$work/k8s" && cd "$work/k8s"
  go mod init monarch-kernel/k8s-bed >/dev/null 2>&1
  # k8s.io/kubernetes replaces its staging modules with ./staging/...: pin each to
  # its published version instead (the one that release tagged).
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "require k8s.io/kubernetes $K8S"
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*#replace \1 => \1 '"$STAGING"'#p' "$gomod"
  } >>go.mod
  printf 'package tools\n\nimport (\n\t_ "k8s.io/kubernetes/cmd/kube-apiserver"\n\t_ "k8s.io/kubernetes/cmd/kube-controller-manager"\n\t_ "k8s.io/kubernetes/cmd/kube-scheduler"\n)\n' >tools.go
  go mod tidy >&2
  go build -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S" -o "$work/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler
  mv "$work/bin/"kube-* "$CACHE/bin/"
fi

if need etcd; then
  echo "building etcd $ETCD" >&2
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init monarch-kernel/etcd-bed >/dev/null 2>&1
  {
    echo "require go.etcd.io/etcd/server/v3 $ETCD"
    for m in api/v3 client/pkg/v3 client/v3 pkg/v3; do echo "replace go.etcd.io/etcd/$m => go.etcd.io/etcd/$m $ETCD"; done
  } >>go.mod
  printf 'package main\n\nimport (\n\t"os"\n\n\t"go.etcd.io/etcd/server/v3/etcdmain"\n)\n\nfunc main() { etcdmain.Main(os.Args) }\n' >main.go
  go mod tidy >&2
  go build -ldflags "-s -w" -o "$work/etcd-bin" .
  mv "$work/etcd-bin" "$CACHE/bin/etcd"
fi

if need kwok; then
  echo "building kwok $KWOK" >&2
  GOBIN="$work/gobin" go install -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK"
  mod=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK
  cp "$mod/kustomize/stage/node/fast/node-initialize.yaml" "$mod/kustomize/stage/node/heartbeat/node-heartbeat.yaml" \
    "$CACHE/stages/"
  for s in ready complete delete; do cp "$mod/kustomize/stage/pod/fast/pod-$s.yaml" "$CACHE/stages/"; done
  chmod u+w "$CACHE/stages/"*
  mv "$work/gobin/kwok" "$CACHE/bin/kwok"
fi
echo "$CACHE"
