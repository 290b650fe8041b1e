package controller

import (
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/events"
)

// maxEventHold is the longest an event of the binder waits for binds to
// finish: a burst of a thousand claims takes tens of seconds on a small
// API server, and its events come after it.
const maxEventHold = 30 * time.Second

// eventsAfterBinds is the binder's event recorder: the events it records
// while binds run wait until none is running, then go to the API server in
// the order they were recorded. An event is an API write like a bind's,
// one per bind (`Bound to machine ... in ...ms`), and in a burst of claims
// those writes competed with the binds themselves for the API server: the
// burst bound about a quarter slower with them (docs/benchmarks.md). The
// time in an event is when it was written; a Bound event's note carries
// the bind's own time. Like refills (pool_refill_hold.go), events wait at
// most maxEventHold.
type eventsAfterBinds struct {
	inner   events.EventRecorder
	maxHold time.Duration

	mu      sync.Mutex
	// sending keeps events in order: a flush holds it while it records
	// the held ones, and an event recorded at once waits for it.
	sending sync.Mutex
	binding int
	held    []heldEvent
	// timer flushes the held events once the oldest has waited maxHold.
	timer *time.Timer
}

type heldEvent struct {
	regarding, related             runtime.Object
	eventtype, reason, action, note string
}

func newEventsAfterBinds(inner events.EventRecorder) *eventsAfterBinds {
	return &eventsAfterBinds{inner: inner, maxHold: maxEventHold}
}

var _ events.EventRecorder = &eventsAfterBinds{}

// Eventf records an event now, or once the binds running are done.
func (e *eventsAfterBinds) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	e.mu.Lock()
	if e.binding == 0 && len(e.held) == 0 {
		e.sending.Lock()
		e.mu.Unlock()
		defer e.sending.Unlock()
		e.inner.Eventf(regarding, related, eventtype, reason, action, note, args...)
		return
	}
	defer e.mu.Unlock()
	// Copies: the caller goes on changing its objects, and the event must
	// name them as they were.
	ev := heldEvent{eventtype: eventtype, reason: reason, action: action, note: fmt.Sprintf(note, args...)}
	if regarding != nil {
		ev.regarding = regarding.DeepCopyObject()
	}
	if related != nil {
		ev.related = related.DeepCopyObject()
	}
	e.held = append(e.held, ev)
	if e.timer == nil {
		e.timer = time.AfterFunc(e.maxHold, e.flush)
	}
}

// bindStarted counts a bind in flight; its events wait.
func (e *eventsAfterBinds) bindStarted() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.binding++
}

// bindEnded counts a bind done; the last one lets the held events go.
func (e *eventsAfterBinds) bindEnded() {
	e.mu.Lock()
	e.binding--
	last := e.binding == 0
	e.mu.Unlock()
	if last {
		e.flush()
	}
}

// flush records the held events.
func (e *eventsAfterBinds) flush() {
	e.mu.Lock()
	held := e.held
	e.held = nil
	if e.timer != nil {
		e.timer.Stop()
		e.timer = nil
	}
	e.sending.Lock()
	e.mu.Unlock()
	defer e.sending.Unlock()
	for _, ev := range held {
		e.inner.Eventf(ev.regarding, ev.related, ev.eventtype, ev.reason, ev.action, "%s", ev.note)
	}
}
