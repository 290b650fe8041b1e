package v1alpha1

import (
	"os"
	"strings"
	"testing"
)

// The CRD validates spec.image with CEL from the marker in
// machine_types.go; the pattern there must be this package's.
func TestImageRuleUsesThePattern(t *testing.T) {
	src, err := os.ReadFile("machine_types.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{OCIImageReferencePattern, BuiltinImagePattern} {
		if !strings.Contains(string(src), "self.matches('"+p+"')") {
			t.Errorf("machine_types.go's spec.image rule does not use %s", p)
		}
	}
}

func TestValidImage(t *testing.T) {
	for _, tc := range []struct {
		image string
		ok    bool
	}{
		{"default", true},
		{"my-guest.v2", true},
		{"127.0.0.1:5000/kairon/python:3.11", true},
		{"localhost/app", true},
		{"localhost:5000/app:latest", true},
		{"registry.example.com/team/app", true},
		{"registry.example.com:443/team/sub/app:v1.2_3", true},
		{"ghcr.io/a/b@sha256:" + strings.Repeat("a", 64), true},
		{"ghcr.io/a/b:1.0@sha256:" + strings.Repeat("0", 64), true},
		{"registry:5000/app", true},
		{"Default", false},
		{"", false},
		{"kairon/python:3.11", false}, // no registry
		{"python:3.11", false},        // a built-in name has no colon
		{"ghcr.io/A/b", false},        // repositories are lowercase
		{"ghcr.io/a/b:", false},
		{"ghcr.io/a/b@sha256:abc", false},
		{"ghcr.io/a/b@sha512:" + strings.Repeat("a", 128), false},
		{"ghcr.io//b", false},
		{"ghcr.io/a/b:-x", false},
		{"host:1:2/a", false},
		{"ghcr.io/a b", false},
	} {
		if got := ValidImage(tc.image); got != tc.ok {
			t.Errorf("ValidImage(%q) = %v, want %v", tc.image, got, tc.ok)
		}
	}
}
