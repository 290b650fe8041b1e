package qemu

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

// tcpPair is both ends of one loopback TCP connection, as the node agents
// set it up between two nodes.
func tcpPair(t testing.TB) (send, receive net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	send, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	receive = <-accepted
	if receive == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { send.Close(); receive.Close() })
	return send, receive
}

// counterOutput matches what readCounter's command prints, not its echo.
var counterOutput = regexp.MustCompile(`counter:(\d+)\.`)

// readCounter prints the guest's counter file and returns its value.
func readCounter(t *testing.T, con *console) int {
	t.Helper()
	con.mu.Lock()
	from := con.seen.Len()
	con.mu.Unlock()
	if _, err := con.c.Write([]byte("echo counter:$(cat /tmp/counter).\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		con.mu.Lock()
		out := con.seen.String()[from:]
		con.mu.Unlock()
		if m := counterOutput.FindStringSubmatch(out); m != nil {
			n, _ := strconv.Atoi(m[1])
			return n
		}
		if time.Now().After(deadline) {
			t.Fatalf("no counter value on the console: %q", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLiveMigration moves a running guest between two Backends (two nodes'
// state directories) over a loopback TCP connection. A value written before
// and a counter a guest process keeps incrementing both survive; the
// counter goes on from where it was, so the guest never rebooted.
func TestLiveMigration(t *testing.T) {
	ctx := context.Background()
	source := newTestBackend(t, Options{Log: testLogger(t)})
	target := newTestBackend(t, Options{Log: testLogger(t)})
	spec := backend.Spec{ID: "ns1_live", Name: "ns1/live", CPU: 1, MemoryMiB: 256}
	if _, err := source.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	orig := waitPhase(t, source, spec.ID, backend.Running, bootTimeout)

	token := rand.IntN(1_000_000) + 1000
	con := dialConsole(t, source.ConsoleSocket(spec.ID))
	con.run(t, fmt.Sprintf("echo %d > /tmp/x; echo wrote-$((%d+1))", token, token), fmt.Sprintf("wrote-%d", token+1), 30*time.Second)
	con.run(t, `(i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; usleep 100000; done) & echo counting`, "counting", 30*time.Second)
	time.Sleep(500 * time.Millisecond)
	before := readCounter(t, con)

	send, receive := tcpPair(t)
	received := make(chan error, 1)
	go func() {
		_, err := target.ReceiveLive(ctx, spec, receive)
		received <- err
	}()
	start := time.Now()
	downtime, err := source.SendLive(ctx, spec.ID, send)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-received; err != nil {
		t.Fatal(err)
	}
	t.Logf("live migration took %s, downtime %s", time.Since(start), downtime)
	if downtime <= 0 {
		t.Errorf("downtime %s, want QEMU's measured downtime", downtime)
	}
	if got, _ := source.Get(ctx, spec.ID); got.Phase != backend.Paused || got.PID != orig.PID {
		t.Errorf("source after SendLive: %+v, want the same process Paused", got)
	}
	moved, err := target.Get(ctx, spec.ID)
	if err != nil || moved.Phase != backend.Running || moved.PID == orig.PID {
		t.Fatalf("target after ReceiveLive: %+v %v, want Running in its own process", moved, err)
	}
	if err := source.Stop(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}

	con = dialConsole(t, target.ConsoleSocket(spec.ID))
	con.run(t, "cat /tmp/x", fmt.Sprint(token), 30*time.Second)
	after := readCounter(t, con)
	if after < before {
		t.Errorf("counter went back from %d to %d: the guest lost its state", before, after)
	}
	time.Sleep(time.Second)
	if later := readCounter(t, con); later <= after {
		t.Errorf("counter stuck at %d after the migration: the guest's process does not run", later)
	}
}

// TestLiveMigrationRefusedKeepsTheSourceRunning: a receiver that cannot take
// the VM (another shape) drops the connection; the sender fails and the
// guest runs on where it was.
func TestLiveMigrationRefusedKeepsTheSourceRunning(t *testing.T) {
	ctx := context.Background()
	source := newTestBackend(t, Options{Log: testLogger(t)})
	target := newTestBackend(t, Options{Log: testLogger(t)})
	spec := backend.Spec{ID: "ns1_stay", Name: "ns1/stay", CPU: 1, MemoryMiB: 256}
	if _, err := source.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	orig := waitPhase(t, source, spec.ID, backend.Running, bootTimeout)

	send, receive := tcpPair(t)
	received := make(chan error, 1)
	go func() {
		other := spec
		other.MemoryMiB = 512
		_, err := target.ReceiveLive(ctx, other, receive)
		receive.Close()
		received <- err
	}()
	if _, err := source.SendLive(ctx, spec.ID, send); err == nil {
		t.Fatal("SendLive succeeded into a receiver that refused the VM")
	} else {
		t.Logf("SendLive: %v", err)
	}
	if err := <-received; err == nil || !strings.Contains(err.Error(), "shape") {
		t.Errorf("ReceiveLive into another shape: %v", err)
	}
	if _, err := target.Get(ctx, spec.ID); err == nil {
		t.Error("the refusing receiver kept an instance")
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := qmpStatusOf(t, source, spec.ID)
		if st == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("source QMP status %q after the failed migration, want running", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got, _ := source.Get(ctx, spec.ID); got.Phase != backend.Running || got.PID != orig.PID {
		t.Errorf("source after the failed migration: %+v, want the same process Running", got)
	}
	con := dialConsole(t, source.ConsoleSocket(spec.ID))
	con.run(t, "echo still-$((40+2))", "still-42", 30*time.Second)
}

// TestLiveMigrationSourceResumesWhenTheTargetGivesUp: the stream completed,
// so the source's guest is paused (post-migrate), but the target drops the
// guest before taking over (its agent could not switch the Machine). The
// source resumes, with the guest's memory as it was.
func TestLiveMigrationSourceResumesWhenTheTargetGivesUp(t *testing.T) {
	ctx := context.Background()
	source := newTestBackend(t, Options{Log: testLogger(t)})
	target := newTestBackend(t, Options{Log: testLogger(t)})
	spec := backend.Spec{ID: "ns1_back", Name: "ns1/back", CPU: 1, MemoryMiB: 256}
	if _, err := source.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	orig := waitPhase(t, source, spec.ID, backend.Running, bootTimeout)
	token := rand.IntN(1_000_000) + 1000
	con := dialConsole(t, source.ConsoleSocket(spec.ID))
	con.run(t, fmt.Sprintf("echo %d > /tmp/x; echo wrote-$((%d+1))", token, token), fmt.Sprintf("wrote-%d", token+1), 30*time.Second)

	send, receive := tcpPair(t)
	received := make(chan error, 1)
	go func() { _, err := target.ReceiveLive(ctx, spec, receive); received <- err }()
	if _, err := source.SendLive(ctx, spec.ID, send); err != nil {
		t.Fatal(err)
	}
	if err := <-received; err != nil {
		t.Fatal(err)
	}
	if err := target.Stop(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := source.Get(ctx, spec.ID); got.Phase != backend.Paused {
		t.Fatalf("source after a completed send: %s, want Paused", got.Phase)
	}
	if err := source.Resume(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := source.Get(ctx, spec.ID); got.Phase != backend.Running || got.PID != orig.PID {
		t.Errorf("source after Resume: %+v, want the same process Running", got)
	}
	con.run(t, "cat /tmp/x", fmt.Sprint(token), 30*time.Second)
}
