package node

import (
	"errors"
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"
)

type tempErr struct{ temp bool }

func (e tempErr) Error() string   { return "backend says" }
func (e tempErr) Temporary() bool { return e.temp }

func TestIsTransientStart(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"address range full (IPAM)", transient(errors.New("no free address in 10.88.0.0/24")), true},
		{"tap", fmt.Errorf("attach: %w", transient(errors.New("creating tap"))), true},
		{"disk full", &os.PathError{Op: "write", Path: "/var/lib/kairon-node/x", Err: syscall.ENOSPC}, true},
		{"disk quota", fmt.Errorf("overlay: %w", syscall.EDQUOT), true},
		{"too many open files", fmt.Errorf("open: %w", syscall.EMFILE), true},
		{"busy", fmt.Errorf("qemu: %w", syscall.EBUSY), true},
		{"backend marks it temporary", fmt.Errorf("start: %w", tempErr{true}), true},
		{"backend marks it permanent", tempErr{false}, false},
		{"guest image missing", errors.New(`guest image "default" is not on node n1`), false},
		{"permission", fmt.Errorf("open: %w", syscall.EACCES), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := isTransientStart(tc.err); got != tc.want {
				t.Errorf("isTransientStart(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestStartBackoff(t *testing.T) {
	for n, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 5: 16 * time.Second, 6: 30 * time.Second, 40: 30 * time.Second} {
		if got := startBackoff(n); got != want {
			t.Errorf("startBackoff(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestBootAttempts(t *testing.T) {
	var b bootAttempts
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := b.begin("x", t0); !got.Equal(t0) {
		t.Fatalf("begin = %s", got)
	}
	if got := b.begin("x", t0.Add(time.Minute)); !got.Equal(t0) {
		t.Errorf("a second attempt moved the first to %s", got)
	}
	if n := b.failed("x", t0); n != 1 {
		t.Errorf("failed = %d", n)
	}
	if w := b.wait("x", t0.Add(500*time.Millisecond)); w != 500*time.Millisecond {
		t.Errorf("wait = %s, want 500ms", w)
	}
	if w := b.wait("x", t0.Add(time.Second)); w != 0 {
		t.Errorf("wait after the backoff = %s", w)
	}
	b.gaveUp("x", "StartFailed", "no kernel")
	if r, m, ok := b.failedForGood("x"); !ok || r != "StartFailed" || m != "no kernel" {
		t.Errorf("failedForGood = %q %q %v", r, m, ok)
	}
	b.forget("x")
	if _, _, ok := b.failedForGood("x"); ok || !b.since("x").IsZero() {
		t.Error("forget left a record")
	}
}
