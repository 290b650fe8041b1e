package images

import (
	"os"
	"slices"
	"testing"

	"github.com/zyvor/kairon/internal/testenv"
)

// TestGC fills a cache past its budget and collects it: the least
// recently used image goes first, an image in use stays however old, and
// a cache under budget is left alone. What GC removed stays removed for
// the next store on the directory.
func TestGC(t *testing.T) {
	reg := startRegistry(t, testenv.RegistryOptions{})
	ctx := ctxFor(t)
	digests := map[string]string{}
	for _, n := range []string{"a", "b", "c", "d"} {
		digests[n] = reg.Push(t, "team/"+n+":1", simpleImage(t, n))
	}
	dir := t.TempDir()
	m := &fakeMetrics{}
	s := newStore(t, Options{Dir: dir, Metrics: m})
	imgs := map[string]*Image{}
	for _, n := range []string{"a", "b", "c", "d"} {
		img, err := s.Ensure(ctx, reg.Ref("team/"+n+":1"), nil)
		if err != nil {
			t.Fatal(err)
		}
		imgs[n] = img
	}
	size := imgs["a"].SizeBytes
	// Used since: a is now the most recent; b the least.
	if _, ok := s.Lookup(digests["a"]); !ok {
		t.Fatal("a not cached")
	}
	s.opts.DiskBudgetBytes = 2 * size
	inUse := func(d string) bool { return d == digests["b"] }

	removed, err := s.GC(inUse)
	if err != nil {
		t.Fatal(err)
	}
	// b is older than c but in use: c and d go, a (used last) and b stay.
	if want := []string{digests["c"], digests["d"]}; !slices.Equal(removed, want) {
		t.Fatalf("GC removed %v, want c then d: %v", removed, want)
	}
	for n, want := range map[string]bool{"a": true, "b": true, "c": false, "d": false} {
		if _, ok := s.Lookup(digests[n]); ok != want {
			t.Errorf("after GC, %s cached: %v, want %v", n, ok, want)
		}
		if _, err := os.Stat(imgs[n].Path); (err == nil) != want {
			t.Errorf("after GC, %s's file: %v, want it there: %v", n, err, want)
		}
	}
	if got := m.snapshot(); got.images != 2 || got.bytes != 2*size {
		t.Errorf("cache usage reported: %d images, %d bytes; want 2 and %d", got.images, got.bytes, 2*size)
	}
	if removed, err := s.GC(func(string) bool { return false }); err != nil || len(removed) != 0 {
		t.Fatalf("GC of a cache at its budget removed %v, %v", removed, err)
	}

	s.opts.DiskBudgetBytes = 0
	if removed, err := s.GC(func(string) bool { return true }); err != nil || len(removed) != 0 {
		t.Fatalf("GC with everything in use removed %v, %v", removed, err)
	}

	s.Close()
	s2 := newStore(t, Options{Dir: dir})
	for n, want := range map[string]bool{"a": true, "b": true, "c": false, "d": false} {
		if _, ok := s2.Lookup(digests[n]); ok != want {
			t.Errorf("reopened: %s cached: %v, want %v", n, ok, want)
		}
	}
}
