#!/usr/bin/env bash
# Builds the pinned control-plane and developer tools into a cache outside the
# checkout and links them into bin/. A fresh clone on the same machine reuses
# the cache, so only the first build pays for compiling Kubernetes.
#
#   hack/tools/build.sh [BIN_DIR]
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
bin=${1:-$root/bin}
k8s_version=v1.37.2

key=$( (go version; cat "$here/build.sh" "$here"/go.mod "$here"/go.sum "$here"/*/go.mod "$here"/*/go.sum "$here"/*/*.go) | sha256sum | cut -c1-16)
cache=${KAIRON_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kairon/tools}/$key
mkdir -p "$cache" "$bin"

ldflags_version() {
  local major=${k8s_version#v}; major=${major%%.*}
  local minor=${k8s_version#v*.}; minor=${minor%%.*}
  local flags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}

# build NAME MODULE_DIR PACKAGE [LDFLAGS]
build() {
  local name=$1 dir=$2 pkg=$3 ldflags=${4:--s -w}
  if [ -x "$cache/$name" ]; then return; fi
  echo "hack/tools: building $name (cached afterwards in $cache)" >&2
  local start=$SECONDS
  (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$cache/$name.tmp" "$pkg")
  mv "$cache/$name.tmp" "$cache/$name"
  echo "hack/tools: built $name in $((SECONDS - start))s" >&2
}

build controller-gen "$here/controller-gen" sigs.k8s.io/controller-tools/cmd/controller-gen
build etcd "$here" ./etcd
build kubectl "$here" k8s.io/kubernetes/cmd/kubectl "$(ldflags_version)"
build kube-apiserver "$here" k8s.io/kubernetes/cmd/kube-apiserver "$(ldflags_version)"
build kube-controller-manager "$here" k8s.io/kubernetes/cmd/kube-controller-manager "$(ldflags_version)"
build helm "$here/helm" helm.sh/helm/v3/cmd/helm

for tool in controller-gen etcd kubectl kube-apiserver kube-controller-manager helm; do
  ln -sfn "$cache/$tool" "$bin/$tool"
done
