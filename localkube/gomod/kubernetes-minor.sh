#!/bin/sh
# Write the wrapper module of one more Kubernetes minor for the compatibility suite:
#   localkube/gomod/kubernetes-minor.sh 1.38.1
# creates localkube/gomod/kubernetes-1.38 (kube-apiserver and kubectl of k8s.io/kubernetes v1.38.1,
# each staging module mapped to its v0.38.1 tag, as k8s.io/kubernetes's own go.mod maps them to
# ./staging). Then add "1.38" to COMPAT_MINORS in localkube/build.py and a row to
# docs/compatibility.md, and run: make compat COMPAT=1.38
set -eu
version=${1:?usage: $0 1.MINOR.PATCH}
minor=$(echo "$version" | cut -d. -f1-2)
staging=0.${version#1.}
dir=$(cd "$(dirname "$0")" && pwd)/kubernetes-$minor
gomod=$(go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
mkdir -p "$dir"
{
  echo "// Wrapper module: kube-apiserver and kubectl of Kubernetes $minor, for the compatibility suite (make compat)."
  echo "// k8s.io/kubernetes pins its staging modules at v0.0.0 with local replaces; map each to its release tag."
  echo "module localkube/kubernetes-$minor"
  echo
  echo "go 1.26.0"
  echo
  grep -E '^godebug' "$gomod" && echo
  echo "tool ("
  echo "	k8s.io/kubernetes/cmd/kube-apiserver"
  echo "	k8s.io/kubernetes/cmd/kubectl"
  echo ")"
  echo
  echo "require k8s.io/kubernetes v$version"
  echo
  echo "replace ("
  grep -oE 'k8s.io/[a-z0-9-]+ => ./staging' "$gomod" | cut -d' ' -f1 | while read -r module; do
    echo "	$module => $module v$staging"
  done
  echo ")"
} > "$dir/go.mod"
cd "$dir" && go mod tidy
echo "wrote $dir/go.mod ($(wc -l < go.mod) lines) and go.sum ($(wc -l < go.sum) lines)"
