package controller

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestImageRetryDelay(t *testing.T) {
	for _, tt := range []struct {
		attempts int
		want     time.Duration
	}{
		{1, 2 * time.Second}, {2, 4 * time.Second}, {3, 8 * time.Second}, {8, 256 * time.Second},
		{9, 5 * time.Minute}, {50, 5 * time.Minute},
	} {
		if got := imageRetryDelay(tt.attempts); got != tt.want {
			t.Errorf("imageRetryDelay(%d) = %s, want %s", tt.attempts, got, tt.want)
		}
	}
}

// stepResolver answers each Resolve of a reference with what the test
// sends on that reference's channel, and counts the calls.
type stepResolver struct {
	mu      sync.Mutex
	calls   []string
	answers map[string]chan resolverAnswer
}

func (r *stepResolver) answer(ref string) chan resolverAnswer {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.answers == nil {
		r.answers = map[string]chan resolverAnswer{}
	}
	if r.answers[ref] == nil {
		r.answers[ref] = make(chan resolverAnswer)
	}
	return r.answers[ref]
}

type resolverAnswer struct {
	digest string
	err    error
}

func (r *stepResolver) Resolve(ctx context.Context, ref string, _ authn.Keychain) (string, error) {
	r.mu.Lock()
	r.calls = append(r.calls, ref)
	r.mu.Unlock()
	select {
	case a := <-r.answer(ref):
		return a.digest, a.err
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (r *stepResolver) called() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

// The resolutions of one pool: one registry call per template however
// often the pool is reconciled meanwhile, a failure retried only when its
// backoff is over, and the result of a template that changed meanwhile
// dropped.
func TestPoolImagesResolveOncePerTemplate(t *testing.T) {
	const (
		d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
		d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	)
	resolver := &stepResolver{}
	const ref = "registry.example/app:1"
	p := newPoolImages(resolver, fake.NewClientBuilder().Build(), nil)
	now := time.Date(2026, 12, 8, 12, 0, 0, 0, time.UTC)
	p.now = func() time.Time { return now }
	pool := &kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "agents", UID: "u1", Generation: 1}}
	pool.Spec.Template.Spec.Image = "registry.example/app:1"
	woken := func() {
		t.Helper()
		select {
		case <-p.wake:
		case <-time.After(time.Minute):
			t.Fatal("the pool was not woken when its resolution ended")
		}
	}

	// Resolving: every pass while it runs asks nothing more.
	for range 3 {
		st := p.pin(pool, "h1", nil)
		if !st.unknown || st.cond.Reason != kaironv1.ImageReasonResolving || st.status != nil {
			t.Fatalf("while resolving: %+v", st)
		}
	}
	resolver.answer(ref) <- resolverAnswer{err: errors.New("unauthorized: no")}
	woken()
	st := p.pin(pool, "h1", nil)
	if !st.unknown || st.cond.Reason != kaironv1.ImageReasonResolveFailed || st.retryIn != imageRetryFirst ||
		!strings.Contains(st.cond.Message, "resolving image registry.example/app:1: unauthorized: no") ||
		!strings.Contains(st.cond.Message, "1 attempt so far") {
		t.Fatalf("after a failure: %+v %+v", st, st.cond)
	}
	if calls := resolver.called(); len(calls) != 1 {
		t.Fatalf("registry asked %d times, want once", len(calls))
	}

	// Before the backoff is over, nothing; after it, one more attempt,
	// still reported failed while it runs.
	now = now.Add(imageRetryFirst - time.Millisecond)
	if st := p.pin(pool, "h1", nil); st.cond.Reason != kaironv1.ImageReasonResolveFailed || len(resolver.called()) != 1 {
		t.Fatalf("before the backoff ended: %+v, %d calls", st.cond, len(resolver.called()))
	}
	now = now.Add(time.Millisecond)
	if st := p.pin(pool, "h1", nil); st.cond.Reason != kaironv1.ImageReasonResolveFailed || st.retryIn != imageResolveTimeout {
		t.Fatalf("retrying: %+v", st)
	}
	resolver.answer(ref) <- resolverAnswer{digest: d1}
	woken()
	st = p.pin(pool, "h1", nil)
	if st.unknown || st.image != "registry.example/app:1@"+d1 || st.status.Digest != d1 || st.status.TemplateHash != "h1" ||
		st.status.ResolvedAt == nil || !st.status.ResolvedAt.Time.Equal(now) || st.cond.Reason != kaironv1.ImageReasonResolved {
		t.Fatalf("resolved: %+v %+v", st, st.status)
	}
	if calls := resolver.called(); len(calls) != 2 {
		t.Fatalf("registry asked %d times, want twice", len(calls))
	}

	// A new template while its resolution runs: the old answer is
	// dropped, and wakes nobody.
	pool.Spec.Template.Spec.Image = "registry.example/app:2"
	p.pin(pool, "h2", nil)
	pool.Spec.Template.Spec.Image = "registry.example/app:3"
	p.pin(pool, "h3", nil)
	resolver.answer("registry.example/app:2") <- resolverAnswer{digest: d1}
	resolver.answer("registry.example/app:3") <- resolverAnswer{digest: d2}
	woken()
	if st := p.pin(pool, "h3", nil); st.status == nil || st.status.Digest != d2 || st.status.TemplateHash != "h3" {
		t.Fatalf("after the template changed twice: %+v", st.status)
	}
	select {
	case <-p.wake:
		t.Error("the dropped resolution woke the pool")
	default:
	}

	// The status names the digest of its template: no registry is asked
	// (a restarted controller), nor when only the members do.
	calls := len(resolver.called())
	fresh := newPoolImages(resolver, fake.NewClientBuilder().Build(), nil)
	pool.Status.Image = &kaironv1.MachinePoolImage{Reference: "registry.example/app:3", Digest: d2, TemplateHash: "h3"}
	if st := fresh.pin(pool, "h3", nil); st.image != "registry.example/app:3@"+d2 {
		t.Errorf("from the status: %+v", st)
	}
	pool.Status.Image = nil
	member := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{kaironv1.LabelMachinePoolTemplateHash: "h3"}}}
	member.Spec.Image = "registry.example/app:3@" + d1
	if st := fresh.pin(pool, "h3", []*kaironv1.Machine{member}); st.image != "registry.example/app:3@"+d1 || st.status.ResolvedAt != nil {
		t.Errorf("from the members: %+v", st)
	}
	if got := len(resolver.called()); got != calls {
		t.Errorf("registry asked %d more times for a template whose digest was known", got-calls)
	}
}
