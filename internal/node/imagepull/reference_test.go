package imagepull

import (
	"strings"
	"testing"
)

func TestPinned(t *testing.T) {
	d1 := "sha256:" + strings.Repeat("1", 64)
	d2 := "sha256:" + strings.Repeat("2", 64)
	for _, tc := range []struct {
		image, digest, want string
		err                 bool
	}{
		{"127.0.0.1:5000/kairon/python:3.11", "", "127.0.0.1:5000/kairon/python:3.11", false},
		{"127.0.0.1:5000/kairon/python:3.11", d1, "127.0.0.1:5000/kairon/python:3.11@" + d1, false},
		{"registry.example.com/app", d1, "registry.example.com/app@" + d1, false},
		// Pinned by the user: the spec's digest stands.
		{"registry.example.com/app:1@" + d2, d1, "registry.example.com/app:1@" + d2, false},
		{"registry.example.com/app", "sha256:short", "", true},
		{"registry.example.com/App", d1, "", true},
	} {
		got, err := Pinned(tc.image, tc.digest)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("Pinned(%q, %q) = %q, %v; want %q (error %v)", tc.image, tc.digest, got, err, tc.want, tc.err)
		}
	}
	if got := DigestOf("r.io/a:1@" + d1); got != d1 {
		t.Errorf("DigestOf = %q", got)
	}
	if got := DigestOf("r.io/a:1"); got != "" {
		t.Errorf("DigestOf of a tag = %q", got)
	}
}
