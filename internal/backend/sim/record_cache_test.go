package sim

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

// Two Backends over one directory: each sees what the other wrote, although
// both keep the records they decoded.
func TestSimRecordsWrittenElsewhereAreReadAgain(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, err := New(Options{StateDir: dir, BootDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := New(Options{StateDir: dir, BootDelay: time.Hour})
	if _, err := a.Start(ctx, backend.Spec{ID: "ns_a", Name: "ns/a"}); err != nil {
		t.Fatal(err)
	}
	phase := func(be *Backend) backend.Phase {
		t.Helper()
		list, err := be.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, in := range list {
			if in.ID == "ns_a" {
				return in.Phase
			}
		}
		return "absent"
	}
	if pa, pb := phase(a), phase(b); pa != backend.Booting || pb != backend.Booting {
		t.Fatalf("started by a: a lists it %s, b %s; want Booting in both", pa, pb)
	}

	// Each change is the other Backend's, after both have decoded the record.
	for _, step := range []struct {
		name      string
		by, other *Backend
		change    func(*Backend) error
		want      backend.Phase
	}{
		{"paused by b", b, a, func(be *Backend) error { return be.Pause(ctx, "ns_a") }, backend.Paused},
		{"resumed by a", a, b, func(be *Backend) error { return be.Resume(ctx, "ns_a") }, backend.Booting},
		{"crashed by b", b, a, func(be *Backend) error { return be.Crash("ns_a", "test") }, backend.Exited},
	} {
		if err := step.change(step.by); err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if got := phase(step.other); got != step.want {
			t.Errorf("%s: the other Backend lists it %s, want %s", step.name, got, step.want)
		}
		if in, err := step.other.Get(ctx, "ns_a"); err != nil || in.Phase != step.want {
			t.Errorf("%s: the other Backend's Get = %s, %v; want %s", step.name, in.Phase, err, step.want)
		}
	}

	if err := a.Stop(ctx, "ns_a"); err != nil {
		t.Fatal(err)
	}
	if got := phase(b); got != "absent" {
		t.Errorf("stopped by a: b lists it %s, want it gone", got)
	}
	if _, err := b.Get(ctx, "ns_a"); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("stopped by a: b's Get = %v, want ErrNotFound", err)
	}
}
