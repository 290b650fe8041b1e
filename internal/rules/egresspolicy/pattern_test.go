package egresspolicy

import "testing"

func TestPatternCovers(t *testing.T) {
	for _, c := range []struct {
		p, q Pattern
		want bool
	}{
		{"pkg.test", "pkg.test", true},
		{"pkg.test", "a.pkg.test", false},
		{"pkg.test", "*.pkg.test", false},
		{"*.test", "pkg.test", true},
		{"*.test", "a.b.test", true},
		{"*.test", "test", false},
		{"*.test", "*.test", true},
		{"*.test", "*.pkg.test", true},
		{"*.pkg.test", "*.test", false},
		{"*.pkg.test", "*.evilpkg.test", false},
	} {
		if got := c.p.Covers(c.q); got != c.want {
			t.Errorf("%q.Covers(%q) = %v, want %v", c.p, c.q, got, c.want)
		}
	}
}
