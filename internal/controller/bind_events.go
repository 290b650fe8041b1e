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

// heldEventSpacing paces the held events as they are let go. The event
// broadcaster writes every event in a goroutine of its own, so a thousand
// let go at once were a thousand concurrent requests, for which the HTTP
// client opened over a thousand new connections to the API server (seen
// after a burst of 1,000 claims, each a TLS handshake on both sides). One
// every few milliseconds is about as fast as the API server takes them one
// at a time, so they go over the connection already open.
const heldEventSpacing = 5 * time.Millisecond

// eventsAfterBinds is the binder's event recorder: the events it records
// while binds run wait until none is running, then go to the API server in
// the order they were recorded. An event is an API write like a bind's,
// one per bind (`Bound to machine ... in ...ms`), and in a burst of claims
// those writes competed with the binds themselves for the API server: the
// burst bound about a quarter slower with them (docs/benchmarks.md). The
// time in an event is when it was written; a Bound event's note carries
// the bind's own time. Like refills (pool_refill_hold.go), events wait at
// most maxEventHold; a bind that starts while held events are let go
// holds the rest again.
type eventsAfterBinds struct {
	inner   events.EventRecorder
	maxHold time.Duration
	spacing time.Duration

	mu      sync.Mutex
	binding int
	held    []heldEvent
	// draining: a goroutine is letting the held events go; forced: it
	// does so because the oldest waited maxHold, binds running or not.
	draining, forced bool
	// timer forces the drain once the oldest held event has waited maxHold.
	timer *time.Timer
}

type heldEvent struct {
	regarding, related              runtime.Object
	eventtype, reason, action, note string
}

func newEventsAfterBinds(inner events.EventRecorder) *eventsAfterBinds {
	return &eventsAfterBinds{inner: inner, maxHold: maxEventHold, spacing: heldEventSpacing}
}

var _ events.EventRecorder = &eventsAfterBinds{}

// Eventf records an event now, or once the binds running are done.
func (e *eventsAfterBinds) Eventf(regarding, related runtime.Object, eventtype, reason, action, note string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.binding == 0 && len(e.held) == 0 && !e.draining {
		e.inner.Eventf(regarding, related, eventtype, reason, action, note, args...)
		return
	}
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
		e.timer = time.AfterFunc(e.maxHold, e.forceDrain)
	}
}

// bindStarted counts a bind in flight; events wait.
func (e *eventsAfterBinds) bindStarted() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.binding++
}

// bindEnded counts a bind done; the last one lets the held events go.
func (e *eventsAfterBinds) bindEnded() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.binding--
	if e.binding == 0 && len(e.held) > 0 {
		e.startDrain()
	}
}

// forceDrain lets the held events go although binds still run.
func (e *eventsAfterBinds) forceDrain() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.timer = nil
	e.forced = true
	e.startDrain()
}

// startDrain starts the goroutine that lets the held events go, unless it
// runs. Called with mu held.
func (e *eventsAfterBinds) startDrain() {
	if e.draining {
		return
	}
	e.draining = true
	go e.drain()
}

// drain lets the held events go one at a time, oldest first, until none
// is left or, unforced, a bind starts.
func (e *eventsAfterBinds) drain() {
	for {
		e.mu.Lock()
		if len(e.held) == 0 || (e.binding > 0 && !e.forced) {
			e.draining = false
			if len(e.held) == 0 {
				e.forced = false
				if e.timer != nil {
					e.timer.Stop()
					e.timer = nil
				}
			}
			e.mu.Unlock()
			return
		}
		ev := e.held[0]
		e.held[0] = heldEvent{}
		e.held = e.held[1:]
		e.mu.Unlock()
		e.inner.Eventf(ev.regarding, ev.related, ev.eventtype, ev.reason, ev.action, "%s", ev.note)
		if e.spacing > 0 {
			time.Sleep(e.spacing)
		}
	}
}
