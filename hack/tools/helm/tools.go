//go:build tools

// Package tools pins helm for hack/tools/build.sh. It lives in its own module
// because helm's Kubernetes libraries differ from the control plane's.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
