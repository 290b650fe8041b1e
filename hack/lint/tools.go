//go:build tools

// Package lint pins the linter `make lint` builds from the Go module proxy,
// apart from hack/tools so that bumping it does not rebuild Kubernetes.
package lint

import _ "honnef.co/go/tools/cmd/staticcheck"
