package controller

import (
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// eventNotes is an inner recorder that keeps, in order, the name of
// each event's object and its note.
type eventNotes struct {
	mu  sync.Mutex
	got []string
	// arrived is signalled on each event.
	arrived chan struct{}
}

func (r *eventNotes) Eventf(regarding, _ runtime.Object, _, _, _, note string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, regarding.(metav1.Object).GetName()+": "+fmt.Sprintf(note, args...))
	select {
	case r.arrived <- struct{}{}:
	default:
	}
}

func (r *eventNotes) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

func claimNamed(name string) *kaironv1.MachineClaim {
	return &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
}

func TestBinderEventsWaitForTheBindsRunning(t *testing.T) {
	inner := &eventNotes{arrived: make(chan struct{}, 1)}
	e := newEventsAfterBinds(inner)
	e.maxHold = time.Hour

	e.Eventf(claimNamed("idle"), nil, "Normal", "Bound", "Bind", "no bind running: %s", "at once")
	if got := inner.list(); len(got) != 1 {
		t.Fatalf("with no bind running: %q recorded, want the event at once", got)
	}

	e.bindStarted()
	e.bindStarted()
	first := claimNamed("a")
	e.Eventf(first, nil, "Normal", "Bound", "Bind", "Bound to machine %s in %dms", "m-1", 12)
	first.Name = "renamed after the event" // the event names the claim as it was
	e.Eventf(claimNamed("b"), nil, "Normal", "Bound", "Bind", "Bound to machine %s in %dms", "m-2", 13)
	e.bindEnded()
	if got := inner.list(); len(got) != 1 {
		t.Fatalf("one bind still running: %q recorded, want only the first event", got)
	}
	e.bindEnded()
	want := []string{"idle: no bind running: at once", "a: Bound to machine m-1 in 12ms", "b: Bound to machine m-2 in 13ms"}
	if got := inner.list(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the last bind: %q, want %q", got, want)
	}

	e.Eventf(claimNamed("c"), nil, "Normal", "Bound", "Bind", "again at once")
	if got := inner.list(); len(got) != 4 {
		t.Errorf("after the binds: %q, want the new event at once", got)
	}
}

// Events do not wait for binds forever: a bind that never ends (or binds
// that keep coming) lets them go after maxHold.
func TestBinderEventsWaitAtMostMaxHold(t *testing.T) {
	inner := &eventNotes{arrived: make(chan struct{}, 1)}
	e := newEventsAfterBinds(inner)
	e.maxHold = 50 * time.Millisecond
	e.bindStarted()
	defer e.bindEnded()
	e.Eventf(claimNamed("a"), nil, "Normal", "Bound", "Bind", "held")
	select {
	case <-inner.arrived:
	case <-time.After(time.Minute):
		t.Fatalf("the event was still held a minute later with maxHold %v", e.maxHold)
	}
	if got := inner.list(); len(got) != 1 || got[0] != "a: held" {
		t.Errorf("recorded %q, want the held event", got)
	}
}
