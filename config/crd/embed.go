package crd

import "embed"

// Bases holds config/crd/bases/*.yaml, one CRD per file.
//
//go:embed bases/*.yaml
var Bases embed.FS
