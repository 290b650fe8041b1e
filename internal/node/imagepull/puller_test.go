package imagepull

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// fakeStore counts pulls and makes each one wait for the test's go.
type fakeStore struct {
	mu     sync.Mutex
	calls  map[string]int
	gate   chan struct{}
	result func(ref string) (Image, error)
}

func (s *fakeStore) Ensure(ctx context.Context, ref string, _ [][]byte) (Image, error) {
	s.mu.Lock()
	s.calls[ref]++
	s.mu.Unlock()
	select {
	case <-s.gate:
	case <-ctx.Done():
		return Image{}, ctx.Err()
	}
	return s.result(ref)
}

func (s *fakeStore) count(ref string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[ref]
}

func newHarness(t *testing.T, result func(string) (Image, error)) (*Puller, *fakeStore, chan types.NamespacedName, *time.Time) {
	store := &fakeStore{calls: map[string]int{}, gate: make(chan struct{}), result: result}
	wake := make(chan types.NamespacedName, 100)
	p := NewPuller(store, func(k types.NamespacedName) { wake <- k })
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	t.Cleanup(p.Stop)
	return p, store, wake, &now
}

func imageFile(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "image.sqfs")
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestOnePullServesEveryMachine(t *testing.T) {
	path := imageFile(t)
	p, store, wake, _ := newHarness(t, func(ref string) (Image, error) {
		return Image{Reference: ref, Digest: "sha256:x", Path: path}, nil
	})
	ref := "r.io/a:1"
	var started int
	for i := range 10 {
		st := p.Get(Pull{Reference: ref}, types.NamespacedName{Namespace: "ns", Name: string(rune('a' + i))})
		if st.State != Pulling {
			t.Fatalf("Get %d: state %v, want Pulling", i, st.State)
		}
		if st.Started {
			started++
		}
	}
	if started != 1 {
		t.Fatalf("%d Gets said they started the pull, want 1", started)
	}
	close(store.gate)
	for range 10 {
		<-wake // every waiting Machine is woken, once
	}
	st := p.Get(Pull{Reference: ref}, types.NamespacedName{Namespace: "ns", Name: "a"})
	if st.State != Ready || st.Image.Path != path {
		t.Fatalf("after the pull: %+v", st)
	}
	if n := store.count(ref); n != 1 {
		t.Fatalf("the store pulled %d times, want 1", n)
	}
	// The file collected by the store's GC: pulled again.
	os.Remove(path)
	if st := p.Get(Pull{Reference: ref}, types.NamespacedName{Namespace: "ns", Name: "a"}); st.State != Pulling || !st.Started {
		t.Fatalf("after the file went: %+v, want a new pull", st)
	}
}

func TestFailuresForGoodAreRememberedAWhile(t *testing.T) {
	notFound := errors.New("r.io/a:1: not found")
	p, store, wake, now := newHarness(t, func(string) (Image, error) { return Image{}, notFound })
	close(store.gate)
	m := types.NamespacedName{Namespace: "ns", Name: "m"}
	p.Get(Pull{Reference: "r.io/a:1"}, m)
	<-wake
	if st := p.Get(Pull{Reference: "r.io/a:1"}, m); st.State != Failed || !errors.Is(st.Err, notFound) {
		t.Fatalf("after a failed pull: %+v", st)
	}
	*now = now.Add(rememberFailure + time.Second)
	if st := p.Get(Pull{Reference: "r.io/a:1"}, m); st.State != Pulling || !st.Started {
		t.Fatalf("after %s: %+v, want a new pull", rememberFailure, st)
	}
	<-wake
	if n := store.count("r.io/a:1"); n != 2 {
		t.Fatalf("pulled %d times, want 2", n)
	}
}

func TestTransientFailuresAreRetriedWithBackoff(t *testing.T) {
	var mu sync.Mutex
	down := true
	path := imageFile(t)
	p, store, wake, now := newHarness(t, func(ref string) (Image, error) {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return Image{}, TransientError{errors.New("connection refused")}
		}
		return Image{Reference: ref, Path: path}, nil
	})
	close(store.gate)
	m := types.NamespacedName{Namespace: "ns", Name: "m"}
	p.Get(Pull{Reference: "r.io/a:1"}, m)
	<-wake
	st := p.Get(Pull{Reference: "r.io/a:1"}, m)
	if st.State != Pulling || st.Started || st.Err == nil {
		t.Fatalf("right after a transient failure: %+v, want Pulling with the error and no new pull", st)
	}
	*now = now.Add(firstRetry)
	if st := p.Get(Pull{Reference: "r.io/a:1"}, m); !st.Started {
		t.Fatalf("after the backoff: %+v, want a new pull", st)
	}
	<-wake
	*now = now.Add(firstRetry) // the second failure doubles the wait
	if st := p.Get(Pull{Reference: "r.io/a:1"}, m); st.Started {
		t.Fatalf("%s after a second failure: a new pull started, want a backoff of %s", firstRetry, retryAfter(2))
	}
	mu.Lock()
	down = false
	mu.Unlock()
	*now = now.Add(retryAfter(2))
	p.Get(Pull{Reference: "r.io/a:1"}, m)
	<-wake
	if st := p.Get(Pull{Reference: "r.io/a:1"}, m); st.State != Ready {
		t.Fatalf("once the registry is back: %+v", st)
	}
}

func TestRetryAfter(t *testing.T) {
	for n, want := range map[int]time.Duration{0: time.Second, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 10: maxRetry} {
		if got := retryAfter(n); got != want {
			t.Errorf("retryAfter(%d) = %s, want %s", n, got, want)
		}
	}
}

// A Machine refused for want of credentials does not make one with
// credentials wait out that refusal: each set of credentials pulls on its
// own.
func TestPullsWithOtherCredentialsAreSeparate(t *testing.T) {
	unauthorized := errors.New("unauthorized")
	path := imageFile(t)
	p, store, wake, _ := newHarness(t, func(string) (Image, error) { return Image{}, unauthorized })
	close(store.gate)
	m := types.NamespacedName{Namespace: "ns", Name: "m"}
	p.Get(Pull{Reference: "r.io/a:1"}, m)
	<-wake
	if st := p.Get(Pull{Reference: "r.io/a:1"}, m); st.State != Failed {
		t.Fatalf("anonymous: %+v, want the refusal", st)
	}
	store.result = func(ref string) (Image, error) { return Image{Reference: ref, Path: path}, nil }
	st := p.Get(Pull{Reference: "r.io/a:1", CredentialsKey: "ns/creds"}, m)
	if st.State != Pulling || !st.Started {
		t.Fatalf("with credentials: %+v, want a pull of its own", st)
	}
	<-wake
	if st := p.Get(Pull{Reference: "r.io/a:1", CredentialsKey: "ns/creds"}, m); st.State != Ready {
		t.Fatalf("with credentials, after its pull: %+v", st)
	}
}

func TestRecentPullsAreKept(t *testing.T) {
	path := imageFile(t)
	p, store, wake, now := newHarness(t, func(ref string) (Image, error) {
		return Image{Reference: ref, Digest: "sha256:abc", Path: path}, nil
	})
	close(store.gate)
	p.Get(Pull{Reference: "r.io/a:1"}, types.NamespacedName{Name: "m"})
	<-wake
	if got := p.Recent(time.Minute); len(got) != 1 || got[0] != "sha256:abc" {
		t.Fatalf("Recent right after the pull = %v", got)
	}
	*now = now.Add(2 * time.Minute)
	if got := p.Recent(time.Minute); len(got) != 0 {
		t.Fatalf("Recent a while after = %v, want none", got)
	}
}
