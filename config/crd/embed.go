// Package crd carries the generated CustomResourceDefinitions so that
// kairon-local and the test harness install exactly what `make generate` wrote.
package crd

import "embed"

// Bases holds config/crd/bases/*.yaml, one CRD per file.
//
//go:embed bases/*.yaml
var Bases embed.FS
