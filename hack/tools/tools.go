//go:build tools

// Package tools records the commands hack/tools/build.sh compiles so that
// `go mod tidy` keeps their modules pinned in go.sum.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
