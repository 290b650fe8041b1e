package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/testenv"
)

// The LiveOptions a MigrationPolicy gives a live migration, on real QEMU:
// the bandwidth cap and auto-converge reach QEMU, and its two timeouts
// cancel a migration with the guest left running on the source.

// countingWriter counts the bytes written through it and when the first
// and the last were written.
type countingWriter struct {
	w io.Writer

	mu          sync.Mutex
	n           int64
	first, last time.Time
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == 0 {
		c.first = now
	}
	c.n += int64(n)
	c.last = now
	return n, err
}

// rate is the bytes written and their rate, bytes per second, from the
// first write to the last.
func (c *countingWriter) rate() (int64, float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n, float64(c.n) / c.last.Sub(c.first).Seconds()
}

// autoConverge reads QEMU's auto-converge capability of instance id.
func autoConverge(t *testing.T, b *Backend, id string) bool {
	t.Helper()
	var caps []struct {
		Capability string `json:"capability"`
		State      bool   `json:"state"`
	}
	err := qmpDo(context.Background(), b.QMPSocket(id), func(q *qmpConn) error {
		raw, err := q.execute("query-migrate-capabilities", nil)
		if err == nil {
			err = json.Unmarshal(raw, &caps)
		}
		return err
	})
	if err != nil {
		t.Fatalf("query-migrate-capabilities %s: %v", id, err)
	}
	for _, c := range caps {
		if c.Capability == "auto-converge" {
			return c.State
		}
	}
	t.Fatalf("QEMU has no auto-converge capability: %+v", caps)
	return false
}

// queryMigrate is the instance's query-migrate answer.
func queryMigrate(t *testing.T, b *Backend, id string) qmpMigration {
	t.Helper()
	var mig qmpMigration
	if err := qmpDo(context.Background(), b.QMPSocket(id), func(q *qmpConn) error {
		var err error
		mig, err = q.migration()
		return err
	}); err != nil {
		t.Fatalf("query-migrate %s: %v", id, err)
	}
	return mig
}

// TestLiveMigrationBandwidthCap moves one guest (with 24 MiB of random
// data in its memory, so there is something to send) twice: first with
// the default options, then on to a third Backend capped at 8 MiB/s with
// auto-converge on. The capped stream's rate, bytes over the time between
// its first and last byte, keeps to the cap, and the default one runs
// several times faster with about as many bytes; QEMU reports the
// auto-converge capability each migration asked for.
func TestLiveMigrationBandwidthCap(t *testing.T) {
	const capped = 8 << 20
	ctx := context.Background()
	p := startLivePair(t, "bw")
	p.con.ExpectText(t, "dd if=/dev/urandom of=/tmp/blob bs=1M count=24 2>/dev/null; echo filled-$((1+1))", "filled-2", 60*time.Second)

	var fast countingWriter
	if _, sendErr, receiveErr := p.migrateWith(t, p.spec, backend.LiveOptions{}, &fast); sendErr != nil || receiveErr != nil {
		t.Fatal(sendErr, receiveErr)
	}
	if autoConverge(t, p.source, p.spec.ID) {
		t.Error("auto-converge on for a migration whose options leave it off")
	}
	if err := p.source.Stop(ctx, p.spec.ID); err != nil {
		t.Fatal(err)
	}

	// On from the first target to a third Backend, capped.
	next := &livePair{source: p.target, target: newTestBackend(t, Options{Log: testLogger(t)}), spec: p.spec, token: p.token}
	var slow countingWriter
	if _, sendErr, receiveErr := next.migrateWith(t, p.spec, backend.LiveOptions{MaxBandwidth: capped, AutoConverge: true}, &slow); sendErr != nil || receiveErr != nil {
		t.Fatal(sendErr, receiveErr)
	}
	if !autoConverge(t, next.source, p.spec.ID) {
		t.Error("auto-converge off for a migration whose options turn it on")
	}
	fastBytes, fastRate := fast.rate()
	slowBytes, slowRate := slow.rate()
	t.Logf("default: %d bytes at %.1f MiB/s; capped at %d MiB/s: %d bytes at %.1f MiB/s",
		fastBytes, fastRate/(1<<20), capped>>20, slowBytes, slowRate/(1<<20))
	if fastBytes < 24<<20 || slowBytes < fastBytes/2 {
		t.Errorf("streams of %d and %d bytes: want both to carry the guest's 24 MiB of random data", fastBytes, slowBytes)
	}
	// QEMU meters the stream in 100 ms windows and lifts the cap for the
	// final pass, so a little over the cap is the cap kept.
	if slowRate > 1.25*capped {
		t.Errorf("capped stream ran at %.1f MiB/s, over the %d MiB/s cap", slowRate/(1<<20), capped>>20)
	}
	if fastRate < 3*slowRate {
		t.Errorf("default stream at %.1f MiB/s is not clearly faster than the capped one at %.1f MiB/s", fastRate/(1<<20), slowRate/(1<<20))
	}
	if err := next.source.Stop(ctx, p.spec.ID); err != nil {
		t.Fatal(err)
	}
	con := testenv.DialConsole(t, next.target.ConsoleSocket(p.spec.ID))
	con.ExpectText(t, "cat /tmp/x", fmt.Sprint(p.token), 30*time.Second)
}

// cancelledMigrationKeepsTheGuest checks that after a cancelled send the
// source's guest runs on in the same process: QMP running, its counter
// going on, the token still in its memory.
func cancelledMigrationKeepsTheGuest(t *testing.T, p *livePair, before int) {
	t.Helper()
	ctx := context.Background()
	if mig := queryMigrate(t, p.source, p.spec.ID); mig.Status != "cancelled" {
		t.Errorf("query-migrate after the cancel: %q, want cancelled", mig.Status)
	}
	testenv.Eventually(t, 30*time.Second, "the source's QMP status to be running after the cancel", func() (bool, string) {
		st := qmpStatusOf(t, p.source, p.spec.ID)
		return st == "running", "status " + st
	})
	if got, _ := p.source.Get(ctx, p.spec.ID); got.Phase != backend.Running || got.PID != p.orig.PID {
		t.Errorf("source after the cancelled migration: %+v, want the same process Running", got)
	}
	counterPast(t, p.con, before, fmt.Sprintf("the counter to go on from %d on the source", before))
	p.con.ExpectText(t, "cat /tmp/x", fmt.Sprint(p.token), 30*time.Second)
}

// startCounting starts the guest's counter loop and returns a value of it.
func startCounting(t *testing.T, p *livePair) int {
	t.Helper()
	p.con.ExpectText(t, `echo 0 > /tmp/counter; (i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; usleep 100000; done) & echo counting`, "counting", 30*time.Second)
	return counterPast(t, p.con, 0, "the guest's counter to start")
}

// TestLiveMigrationProgressTimeoutCancels: the receiving end never reads, so the RAM QEMU has left to send stops
// shrinking; with a 2 s progress timeout SendLive cancels the migration
// (migrate_cancel) and says ErrMigrationNoProgress, and the guest runs on
// at the source.
func TestLiveMigrationProgressTimeoutCancels(t *testing.T) {
	p := startLivePair(t, "stall")
	// More than loopback TCP's socket buffers hold, so the stream cannot
	// complete into them.
	p.con.ExpectText(t, "dd if=/dev/urandom of=/tmp/blob bs=1M count=24 2>/dev/null; echo filled-$((1+1))", "filled-2", 60*time.Second)
	before := startCounting(t, p)
	send, receive := tcpPair(t)
	_ = receive // never read: the stream stalls once the socket buffers are full
	const progress = 2 * time.Second
	// A bound, so that a send the timeout does not cancel fails the test
	// instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	_, err := p.source.SendLive(ctx, p.spec.ID, send, backend.LiveOptions{ProgressTimeout: progress})
	took := time.Since(began)
	t.Logf("SendLive after %s: %v", took, err)
	if !errors.Is(err, backend.ErrMigrationNoProgress) {
		t.Fatalf("SendLive into a stalled stream: %v, want ErrMigrationNoProgress", err)
	}
	if took < progress {
		t.Errorf("cancelled after %s, before the %s progress timeout", took, progress)
	}
	cancelledMigrationKeepsTheGuest(t, p, before)
}

// TestLiveMigrationCompletionTimeoutCancels: a receiver that reads all,
// but a 1 MiB/s cap on a guest with 16 MiB of random data, so the RAM left
// keeps shrinking (no progress timeout fires, at 2 s) but the migration
// cannot finish within its 3 s completion timeout: SendLive cancels it and
// says ErrMigrationCompletionTimeout, and the guest runs on at the source.
func TestLiveMigrationCompletionTimeoutCancels(t *testing.T) {
	p := startLivePair(t, "slow")
	p.con.ExpectText(t, "dd if=/dev/urandom of=/tmp/blob bs=1M count=16 2>/dev/null; echo filled-$((1+1))", "filled-2", 60*time.Second)
	before := startCounting(t, p)
	send, receive := tcpPair(t)
	go func() { _, _ = io.Copy(io.Discard, receive) }()
	const completion = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	began := time.Now()
	_, err := p.source.SendLive(ctx, p.spec.ID, send, backend.LiveOptions{
		MaxBandwidth: 1 << 20, CompletionTimeout: completion, ProgressTimeout: 2 * time.Second,
	})
	took := time.Since(began)
	t.Logf("SendLive after %s: %v", took, err)
	if !errors.Is(err, backend.ErrMigrationCompletionTimeout) {
		t.Fatalf("SendLive at 1 MiB/s of a 16 MiB guest: %v, want ErrMigrationCompletionTimeout", err)
	}
	if took < completion {
		t.Errorf("cancelled after %s, before the %s completion timeout", took, completion)
	}
	cancelledMigrationKeepsTheGuest(t, p, before)
}
