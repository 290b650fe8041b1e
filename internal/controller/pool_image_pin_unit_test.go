package controller

import (
	"strings"
	"testing"
)

func TestPinImage(t *testing.T) {
	const (
		d1 = "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		d2 = "sha256:" + "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	)
	long := "registry.example:5000/" + strings.Repeat("a", 420) + ":1"
	tests := []struct {
		name, ref, digest string
		want              string
		err               string
	}{
		{name: "tag", ref: "127.0.0.1:5000/kairon/python:3.11", digest: d1, want: "127.0.0.1:5000/kairon/python:3.11@" + d1},
		{name: "no tag: kept as written", ref: "registry.example/app", digest: d1, want: "registry.example/app@" + d1},
		{name: "localhost", ref: "localhost/app:v1", digest: d1, want: "localhost/app:v1@" + d1},
		{name: "already pinned by it", ref: "registry.example/app:v1@" + d1, digest: d1, want: "registry.example/app:v1@" + d1},
		{name: "digest only, pinned by it", ref: "registry.example/app@" + d1, digest: d1, want: "registry.example/app@" + d1},
		{name: "pinned by another", ref: "registry.example/app:v1@" + d1, digest: d2, err: "is pinned by " + d1 + ", not " + d2},
		{name: "not sha256", ref: "registry.example/app:v1", digest: "sha512:" + strings.Repeat("a", 128), err: "is not sha256:<64 lowercase hex digits>"},
		{name: "upper-case hex", ref: "registry.example/app:v1", digest: strings.ToUpper(d1), err: "is not sha256"},
		{name: "short", ref: "registry.example/app:v1", digest: "sha256:abc", err: "is not sha256"},
		{name: "a registry's junk", ref: "registry.example/app:v1", digest: "sha256:" + strings.Repeat("\x00", 300), err: "…"},
		{name: "too long once pinned", ref: long, digest: d1, err: "more than the 512 spec.image may hold"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := pinImage(tt.ref, tt.digest)
			switch {
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("pinImage(%q, %q) = %q, %v; want an error containing %q", tt.ref, tt.digest, got, err, tt.err)
			case tt.err == "" && err != nil:
				t.Fatalf("pinImage(%q, %q): %v", tt.ref, tt.digest, err)
			case tt.err == "" && got != tt.want:
				t.Fatalf("pinImage(%q, %q) = %q, want %q", tt.ref, tt.digest, got, tt.want)
			}
			if err != nil && len(err.Error()) > 700 {
				t.Errorf("error is %d bytes long: a registry's answer is not cut short", len(err.Error()))
			}
		})
	}
}

func TestDigestOf(t *testing.T) {
	const d = "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	tests := []struct {
		ref, want string
		pinned    bool
	}{
		{"registry.example/app:v1", "", false},
		{"registry.example:5000/app", "", false},
		{"registry.example/app@" + d, d, true},
		{"registry.example:5000/team/app:v1@" + d, d, true},
	}
	for _, tt := range tests {
		got, pinned := digestOf(tt.ref)
		if got != tt.want || pinned != tt.pinned {
			t.Errorf("digestOf(%q) = %q, %v; want %q, %v", tt.ref, got, pinned, tt.want, tt.pinned)
		}
	}
}
