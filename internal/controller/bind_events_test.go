package controller

import (
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// eventNotes is an inner recorder that keeps, in order, the name of each
// event's object and its note. With gate set, each event says so on
// entered, then waits for a value from gate before it is recorded.
type eventNotes struct {
	mu            sync.Mutex
	got           []string
	gate, entered chan struct{}
}

func (r *eventNotes) Eventf(regarding, _ runtime.Object, _, _, _, note string, args ...any) {
	if r.gate != nil {
		select {
		case r.entered <- struct{}{}:
		default:
		}
		<-r.gate
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, regarding.(metav1.Object).GetName()+": "+fmt.Sprintf(note, args...))
}

func (r *eventNotes) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// idle says whether no event is held or being let go.
func (e *eventsAfterBinds) idle() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.held) == 0 && !e.draining
}

func claimNamed(name string) *kaironv1.MachineClaim {
	return &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
}

func heldEventsForTest(inner *eventNotes, maxHold time.Duration) *eventsAfterBinds {
	e := newEventsAfterBinds(inner)
	e.maxHold, e.spacing = maxHold, 0
	return e
}

func waitEventsLetGo(t *testing.T, e *eventsAfterBinds, inner *eventNotes, want int) {
	t.Helper()
	testenv.Eventually(t, time.Minute, fmt.Sprintf("%d events recorded", want), func() (bool, string) {
		got := inner.list()
		return e.idle() && len(got) == want, fmt.Sprintf("%q recorded", got)
	})
}

func TestBinderEventsWaitForTheBindsRunning(t *testing.T) {
	inner := &eventNotes{}
	e := heldEventsForTest(inner, time.Hour)

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
	if got := inner.list(); len(got) != 1 || e.idle() {
		t.Fatalf("one bind still running: %q recorded, want only the first event and the rest held", got)
	}
	e.bindEnded()
	waitEventsLetGo(t, e, inner, 3)
	want := []string{"idle: no bind running: at once", "a: Bound to machine m-1 in 12ms", "b: Bound to machine m-2 in 13ms"}
	if got := inner.list(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after the last bind: %q, want %q", got, want)
	}

	e.Eventf(claimNamed("c"), nil, "Normal", "Bound", "Bind", "again at once")
	if got := inner.list(); len(got) != 4 {
		t.Errorf("after the binds: %q, want the new event at once", got)
	}
}

// Held events are let go one at a time, and a bind that starts meanwhile
// holds the rest again: a burst that pauses for a moment does not get its
// events written in the middle of its next binds.
func TestBinderEventsHeldAgainWhenABindStartsWhileLetGo(t *testing.T) {
	inner := &eventNotes{gate: make(chan struct{}), entered: make(chan struct{}, 1)}
	e := heldEventsForTest(inner, time.Hour)
	e.bindStarted()
	for _, name := range []string{"a", "b", "c"} {
		e.Eventf(claimNamed(name), nil, "Normal", "Bound", "Bind", "bound")
	}
	e.bindEnded()
	// The first event is on its way (waiting at the gate) when the next
	// bind starts.
	<-inner.entered
	e.bindStarted()
	inner.gate <- struct{}{}
	testenv.Eventually(t, time.Minute, "the rest held again", func() (bool, string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		return !e.draining, fmt.Sprintf("%d held, draining %v", len(e.held), e.draining)
	})
	if got := inner.list(); len(got) != 1 || got[0] != "a: bound" {
		t.Fatalf("recorded %q while the next bind runs, want only the first event", got)
	}
	close(inner.gate)
	e.bindEnded()
	waitEventsLetGo(t, e, inner, 3)
	if got := inner.list(); fmt.Sprint(got) != "[a: bound b: bound c: bound]" {
		t.Errorf("recorded %q, want a, b and c in order", got)
	}
}

// Events do not wait for binds forever: a bind that never ends (or binds
// that keep coming) lets them go after maxHold.
func TestBinderEventsWaitAtMostMaxHold(t *testing.T) {
	inner := &eventNotes{}
	e := heldEventsForTest(inner, 50*time.Millisecond)
	e.bindStarted()
	defer e.bindEnded()
	e.Eventf(claimNamed("a"), nil, "Normal", "Bound", "Bind", "held")
	waitEventsLetGo(t, e, inner, 1)
	if got := inner.list(); got[0] != "a: held" {
		t.Errorf("recorded %q, want the held event", got)
	}
	// The next event, with the bind still running, is held again.
	e.Eventf(claimNamed("b"), nil, "Normal", "Bound", "Bind", "held again")
	if e.idle() {
		t.Errorf("an event recorded during a bind after a forced drain was not held")
	}
	waitEventsLetGo(t, e, inner, 2)
}
