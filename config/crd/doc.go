// Package crd carries the generated CustomResourceDefinitions (bases/,
// embedded by embed.go) so that kairon-local and the test harness install
// exactly what `make generate` wrote.
package crd
