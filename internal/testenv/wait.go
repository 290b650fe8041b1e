package testenv

import (
	"time"
)

// TB is the part of testing.TB the wait helpers use; a *testing.T or
// *testing.B satisfies it.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// PollInterval is how often Eventually and Consistently ask their check.
// Short enough that a test waits little past the moment its condition
// holds, long enough that a check that GETs from the API server does not
// load it. A check reads through a client in the test process (the Env's,
// or JSONPath for kubectl's jsonpath output), not a kubectl process: one
// every 50 ms takes most of a core from the tests beside it.
const PollInterval = 50 * time.Millisecond

// Eventually asks check until it reports done and fails tb, naming what and
// the last thing check saw, if it has not within timeout. The timeout is an
// upper bound for a loaded machine, never a measurement: a test passes as
// soon as its condition holds.
func Eventually(tb TB, timeout time.Duration, what string, check func() (done bool, saw string)) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	ticker := time.NewTicker(PollInterval)
	defer ticker.Stop()
	for {
		done, saw := check()
		if done {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("timed out after %s waiting for %s; last saw: %s", timeout, what, saw)
			return
		}
		<-ticker.C
	}
}

// Consistently asks check throughout window, from its start to its end,
// and fails tb the first time check reports not ok. It stands for "this
// must not happen", so window is real time by nature: how long a wrong
// action had to show itself.
func Consistently(tb TB, window time.Duration, what string, check func() (ok bool, saw string)) {
	tb.Helper()
	start := time.Now()
	end := start.Add(window)
	ticker := time.NewTicker(PollInterval)
	defer ticker.Stop()
	for {
		ok, saw := check()
		if !ok {
			tb.Fatalf("%s stopped holding after %s of %s: %s", what, time.Since(start).Round(time.Millisecond), window, saw)
			return
		}
		if !time.Now().Before(end) {
			return
		}
		<-ticker.C
	}
}
