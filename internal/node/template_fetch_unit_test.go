package node

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// Clones started at once on one node share one fetch: callers of one key
// wait for the first one's run and get its result; a later call runs again.
func TestInFlightSharesOneRun(t *testing.T) {
	var f inFlight
	var runs atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{})
	failure := errors.New("the owner refused")
	const callers = 8
	errs := make([]error, callers)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		errs[0] = f.do("copy", func() error {
			runs.Add(1)
			close(started)
			<-release
			return failure
		})
	}()
	<-started
	for i := 1; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f.do("copy", func() error { runs.Add(1); return nil })
		}()
	}
	testenv.Eventually(t, 30*time.Second, "the other callers to wait for the first one's run", func() (bool, string) {
		n := f.waiting("copy")
		return n == callers-1, fmt.Sprintf("%d waiting", n)
	})
	close(release)
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Errorf("%d runs for %d concurrent callers, want 1", n, callers)
	}
	for i, err := range errs {
		if !errors.Is(err, failure) {
			t.Errorf("caller %d got %v, want the shared run's error", i, err)
		}
	}
	if f.busy("copy") {
		t.Error("the key is still in flight after its run ended")
	}
	if err := f.do("copy", func() error { runs.Add(1); return nil }); err != nil || runs.Load() != 2 {
		t.Errorf("a later call: %v, %d runs; want it run anew", err, runs.Load())
	}
}

// A copy's name parses back to its template and version, with or without
// a digest; other names do not parse.
func TestTemplateCopyNames(t *testing.T) {
	saved := metav1.NewTime(time.Unix(1700000000, 0))
	for _, snap := range []*kaironv1.TemplateSnapshot{
		{SizeBytes: 42, SavedAt: saved, SHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		{SizeBytes: 42, SavedAt: saved},
	} {
		name := templateCopyName("team-a", "agents-template-5f7c.x", snap)
		ns, tmpl, version, ok := parseTemplateCopyName(name)
		if !ok || ns != "team-a" || tmpl != "agents-template-5f7c.x" || version != templateVersion(snap) {
			t.Errorf("%s parsed to %q %q %q %v", name, ns, tmpl, version, ok)
		}
	}
	if v := templateVersion(&kaironv1.TemplateSnapshot{SizeBytes: 42, SavedAt: saved}); v != "1700000000-42" {
		t.Errorf("version without a digest %q", v)
	}
	for _, name := range []string{"x.state.tmp", "team-a_t.v.state.unchecked", "noversion.state", "_t.v.state", "ns_.v.state"} {
		if _, _, _, ok := parseTemplateCopyName(name); ok {
			t.Errorf("%s parsed", name)
		}
	}
}
