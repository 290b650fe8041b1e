package testenv

import (
	"strings"
	"sync"
	"testing"
)

// LogWriter sends what is written to it, a line at a time as loggers write,
// to a test's log, which go test shows when the test fails. Give it to the
// logger of something that runs in the background, such as a
// controller-runtime manager (zap.New(zap.WriteTo(w))).
//
// Logging through a test after it ended panics, and a background goroutine
// may still log while it stops, so the writer drops what arrives after Stop
// or after the test's cleanup has run.
type LogWriter struct {
	mu      sync.Mutex
	t       testing.TB
	stopped bool
}

// NewLogWriter returns a LogWriter for t that stops when t's cleanup runs.
// Cleanups run last registered first, so create it before starting what
// logs to it: the cleanup that stops that then runs before this one.
func NewLogWriter(t testing.TB) *LogWriter {
	w := &LogWriter{t: t}
	t.Cleanup(w.Stop)
	return w
}

// Write logs p, without its trailing newline, unless w has stopped.
func (w *LogWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.stopped {
		w.t.Log(strings.TrimRight(string(p), "\n"))
	}
	return len(p), nil
}

// Stop has w drop what is written from now on.
func (w *LogWriter) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
}
