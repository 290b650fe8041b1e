package testenv

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// recorder is a TB that records a failure instead of ending the test, so
// the helpers' own failures can be checked.
type recorder struct{ failed string }

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	if r.failed == "" {
		r.failed = fmt.Sprintf(format, args...)
	}
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	r := &recorder{}
	Eventually(r, time.Minute, "third call", func() (bool, string) {
		calls++
		return calls == 3, fmt.Sprintf("call %d", calls)
	})
	if r.failed != "" || calls != 3 {
		t.Fatalf("Eventually: failed %q after %d calls, want success on call 3", r.failed, calls)
	}
}

func TestEventuallyFailsNamingWhatAndTheLastSight(t *testing.T) {
	r := &recorder{}
	calls := 0
	Eventually(r, 3*PollInterval, "the impossible", func() (bool, string) {
		calls++
		return false, fmt.Sprintf("call %d", calls)
	})
	want := fmt.Sprintf("last saw: call %d", calls)
	if !strings.Contains(r.failed, "the impossible") || !strings.Contains(r.failed, want) {
		t.Fatalf("failure %q does not name what was awaited and %q", r.failed, want)
	}
}

func TestConsistentlyChecksThroughoutItsWindow(t *testing.T) {
	r := &recorder{}
	calls := 0
	start := time.Now()
	Consistently(r, 5*PollInterval, "steady", func() (bool, string) {
		calls++
		return true, ""
	})
	if r.failed != "" {
		t.Fatalf("Consistently failed on a check that always holds: %s", r.failed)
	}
	if elapsed := time.Since(start); elapsed < 5*PollInterval {
		t.Errorf("Consistently returned after %s, before its %s window ended", elapsed, 5*PollInterval)
	}
	if calls < 2 {
		t.Errorf("Consistently asked %d times in its window; it must keep asking, not check once", calls)
	}
}

func TestConsistentlyFailsWhenTheConditionBreaksMidWindow(t *testing.T) {
	r := &recorder{}
	calls := 0
	Consistently(r, time.Minute, "steady", func() (bool, string) {
		calls++
		return calls < 4, fmt.Sprintf("call %d", calls)
	})
	if !strings.Contains(r.failed, "steady") || !strings.Contains(r.failed, "call 4") {
		t.Fatalf("failure %q should name the condition and the breaking sight (call 4)", r.failed)
	}
	if calls != 4 {
		t.Errorf("Consistently asked %d times; it must stop at the first break (call 4)", calls)
	}
}
