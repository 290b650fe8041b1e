package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// testClock is a clock that moves only when the test moves it, for the
// controllers' clock hooks (bindTracker.now, CordonEvacuationReconciler.now).
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock(start time.Time) *testClock { return &testClock{now: start} }

// Now is the clock's time; it has the signature of the hooks.
func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Step moves the clock by d.
func (c *testClock) Step(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// arrivedAt is when the tracker recorded that the watch first delivered
// the object uid, and whether it did.
func (t *bindTracker) arrivedAt(uid types.UID) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.arrivals[uid]
	return at, ok
}
