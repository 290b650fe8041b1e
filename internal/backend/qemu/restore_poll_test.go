package qemu

import (
	"context"
	"testing"
	"time"
)

// A monitor that does not answer within one conversation's deadline while
// QEMU loads an incoming stream is busy, not broken: finishRestore asks
// again, and the restore goes on once the monitor answers.
func TestFinishRestoreOutlastsAMonitorBusyLoading(t *testing.T) {
	saved := qmpTimeout.Swap(int64(200 * time.Millisecond))
	t.Cleanup(func() { qmpTimeout.Store(saved) })

	dir, ln := fakeMonitor(t)
	served := make(chan int, 8)
	go func() {
		for conn := 0; ; conn++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			served <- conn
			rd := greetQMP(c)
			if _, err := rd.ReadBytes('\n'); err == nil { // qmp_capabilities
				_, _ = c.Write([]byte(`{"return": {}}` + "\n"))
			}
			if conn == 0 {
				// Busy loading: the question goes unanswered until the
				// client hangs up.
				_, _ = rd.ReadBytes('\n')
				_, _ = rd.ReadBytes('\n')
				c.Close()
				continue
			}
			for _, answer := range []string{
				`{"return": {"status": "running", "running": true}}`, // query-status
				`{"return": {"status": "completed"}}`,                // query-migrate
			} {
				if _, err := rd.ReadBytes('\n'); err != nil {
					break
				}
				_, _ = c.Write([]byte(answer + "\n"))
			}
			c.Close()
		}
	}()

	p := &proc{exited: make(chan struct{})}
	if err := (&Backend{}).finishRestore(context.Background(), dir, p); err != nil {
		t.Fatalf("finishRestore with the monitor busy at first: %v", err)
	}
	if len(served) < 2 {
		t.Fatalf("the monitor was asked %d times, want a second time after the first went unanswered", len(served))
	}
}
