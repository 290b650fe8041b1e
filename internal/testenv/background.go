package testenv

import (
	"context"
	"sync"
	"testing"
	"time"
)

// stopTimeout bounds how long stopping a background component may take.
const stopTimeout = time.Minute

// RunInBackground runs run (a controller manager's Start, a node agent's
// Run) until the returned stop is called or the test ends, whichever comes
// first. Stopping cancels run's context and waits for it; an error it
// returns, or not returning within a minute, fails the test under what.
func RunInBackground(tb testing.TB, what string, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("%s: %v", what, err)
				}
			case <-time.After(stopTimeout):
				tb.Errorf("%s did not stop within %s", what, stopTimeout)
			}
		})
	}
	tb.Cleanup(stop)
	return stop
}
