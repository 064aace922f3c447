#!/bin/sh
# Write the wrapper module of one more Kubernetes minor for the compatibility suite:
#   localkube/gomod/kubernetes-minor.sh 1.38.1
# creates localkube/gomod/kubernetes-1.38 (kube-apiserver and kubectl of k8s.io/kubernetes v1.38.1,
# each staging module mapped to its v0.38.1 tag, as k8s.io/kubernetes's own go.mod maps them to
# ./staging). Then add "1.38" to COMPAT_MINORS in localkube/build.py and a row to
# docs/compatibility.md, and run: make compat COMPAT=1.38
# A release whose go.mod asks for a newer Go than the one on PATH (v1.38's says go 1.27.0) keeps its
# `go` line, and needs that toolchain here and in its build (localkube/build.py's Component.toolchain):
#   GOTOOLCHAIN=go1.27.3 localkube/gomod/kubernetes-minor.sh 1.38.0-beta.0
set -eu
version=${1:?usage: $0 1.MINOR.PATCH}
minor=$(echo "$version" | cut -d. -f1-2)
staging=0.${version#1.}
dir=$(cd "$(dirname "$0")" && pwd)/kubernetes-$minor
gomod=$(go mod download -json "k8s.io/kubernetes@v$version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
# The wrapper's `go` line: 1.26.0, or the module's own where it asks for more.
go_line=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")
[ "$(printf '%s\n' 1.26.0 "$go_line" | sort -V | tail -1)" = 1.26.0 ] && go_line=1.26.0
mkdir -p "$dir"
{
  echo "// Wrapper module: kube-apiserver and kubectl of Kubernetes $minor, for the compatibility suite (make compat)."
  echo "// k8s.io/kubernetes pins its staging modules at v0.0.0 with local replaces; map each to its release tag."
  echo "module localkube/kubernetes-$minor"
  echo
  echo "go $go_line"
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
