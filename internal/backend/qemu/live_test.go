package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/testenv"
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
var counterOutput = regexp.MustCompile(`counter:(\d*)\.`)

// readCounter prints the guest's counter file and returns its value. The
// guest's loop rewrites the file ten times a second, so a read may find it
// just truncated; then it reads again.
func readCounter(t *testing.T, con *testenv.Console) int {
	t.Helper()
	var n int
	testenv.Eventually(t, 30*time.Second, "a value in the guest's counter file", func() (bool, string) {
		m := con.Expect(t, "echo counter:$(cat /tmp/counter).", counterOutput, 30*time.Second)
		var err error
		n, err = strconv.Atoi(m[1])
		return err == nil, m[0]
	})
	return n
}

// counterPast waits until the guest's counter is past n and returns it.
func counterPast(t *testing.T, con *testenv.Console, n int, what string) int {
	t.Helper()
	var c int
	testenv.Eventually(t, 30*time.Second, what, func() (bool, string) {
		c = readCounter(t, con)
		return c > n, fmt.Sprintf("counter %d", c)
	})
	return c
}

// livePair is a guest running on the first of two Backends (two nodes'
// state directories), with a random token written into its memory.
type livePair struct {
	source, target *Backend
	spec           backend.Spec
	orig           backend.Instance
	con            *testenv.Console
	token          int
}

func startLivePair(t *testing.T, name string) *livePair {
	t.Helper()
	p := &livePair{
		source: newTestBackend(t, Options{Log: testLogger(t)}),
		target: newTestBackend(t, Options{Log: testLogger(t)}),
		spec:   backend.Spec{ID: "ns1_" + name, Name: "ns1/" + name, CPU: 1, MemoryMiB: 256},
		token:  rand.IntN(1_000_000) + 1000,
	}
	if _, err := p.source.Start(context.Background(), p.spec); err != nil {
		t.Fatal(err)
	}
	p.orig = waitPhase(t, p.source, p.spec.ID, backend.Running, bootTimeout)
	p.con = testenv.DialConsole(t, p.source.ConsoleSocket(p.spec.ID))
	p.con.ExpectText(t, fmt.Sprintf("echo %d > /tmp/x; echo wrote-$((%d+1))", p.token, p.token), fmt.Sprintf("wrote-%d", p.token+1), 30*time.Second)
	return p
}

// targetConsole connects to the console of the guest on the target; a
// failed Expect shows the end of its console log and QEMU's log.
func (p *livePair) targetConsole(t *testing.T) *testenv.Console {
	t.Helper()
	dir := p.target.dir(p.spec.ID)
	return testenv.DialConsole(t, p.target.ConsoleSocket(p.spec.ID)).
		WithLogs(filepath.Join(dir, consoleLogFile), filepath.Join(dir, qemuLogFile))
}

// migrate streams the guest from source to target over loopback TCP with
// the default LiveOptions; the target is asked to load it as receiveSpec.
func (p *livePair) migrate(t *testing.T, receiveSpec backend.Spec) (downtime time.Duration, sendErr, receiveErr error) {
	return p.migrateWith(t, receiveSpec, backend.LiveOptions{}, nil)
}

// migrateWith is migrate with opts; sent, if not nil, counts what the
// source writes.
func (p *livePair) migrateWith(t *testing.T, receiveSpec backend.Spec, opts backend.LiveOptions, sent *countingWriter) (downtime time.Duration, sendErr, receiveErr error) {
	t.Helper()
	send, receive := tcpPair(t)
	received := make(chan error, 1)
	go func() {
		_, err := p.target.ReceiveLive(context.Background(), receiveSpec, receive)
		receive.Close()
		received <- err
	}()
	var w io.Writer = send
	if sent != nil {
		sent.w = send
		w = sent
	}
	downtime, sendErr = p.source.SendLive(context.Background(), p.spec.ID, w, opts)
	return downtime, sendErr, <-received
}

// TestLiveMigration moves a running guest between two Backends over a
// loopback TCP connection. A value written before and a counter a guest
// process keeps incrementing both survive; the counter goes on from where
// it was, so the guest never rebooted.
func TestLiveMigration(t *testing.T) {
	ctx := context.Background()
	p := startLivePair(t, "live")
	// The counter file exists before the loop runs, so it can be read at once.
	p.con.ExpectText(t, `echo 0 > /tmp/counter; (i=0; while :; do i=$((i+1)); echo $i > /tmp/counter; usleep 100000; done) & echo counting`, "counting", 30*time.Second)
	before := counterPast(t, p.con, 0, "the guest's counter to start")

	start := time.Now()
	downtime, sendErr, receiveErr := p.migrate(t, p.spec)
	if err := errors.Join(sendErr, receiveErr); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("live migration took %s, downtime %s", took, downtime)
	switch {
	case p.source.Acceleration() == "tcg":
		// The guest was stopped for the whole copy (stopsBeforeCopy), and
		// no longer.
		if downtime <= 0 || downtime > took {
			t.Errorf("downtime %s of a migration that took %s: want the copy's, with the guest stopped before it", downtime, took)
		}
	case downtime < 0 || downtime > time.Second:
		// QEMU measures the final pause in whole milliseconds; an idle
		// guest may take less than one. A live migration that paused the
		// guest for the whole copy would show seconds.
		t.Errorf("downtime %s, want QEMU's measure of a short final pause", downtime)
	}
	if got, _ := p.source.Get(ctx, p.spec.ID); got.Phase != backend.Paused || got.PID != p.orig.PID {
		t.Errorf("source after SendLive: %+v, want the same process Paused", got)
	}
	moved, err := p.target.Get(ctx, p.spec.ID)
	if err != nil || moved.Phase != backend.Running || moved.PID == p.orig.PID {
		t.Fatalf("target after ReceiveLive: %+v %v, want Running in its own process", moved, err)
	}
	if err := p.source.Stop(ctx, p.spec.ID); err != nil {
		t.Fatal(err)
	}

	con := p.targetConsole(t)
	con.ExpectText(t, "cat /tmp/x", fmt.Sprint(p.token), 30*time.Second)
	after := readCounter(t, con)
	if after < before {
		t.Errorf("counter went back from %d to %d: the guest lost its state", before, after)
	}
	// A counter stuck at after: the guest's process does not run.
	counterPast(t, con, after, fmt.Sprintf("the counter to go on from %d after the migration", after))
}

// TestLiveMigrationRefusedKeepsTheSourceRunning: a receiver that cannot take
// the VM (another shape) drops the connection; the sender fails and the
// guest runs on where it was.
func TestLiveMigrationRefusedKeepsTheSourceRunning(t *testing.T) {
	ctx := context.Background()
	p := startLivePair(t, "stay")
	other := p.spec
	other.MemoryMiB = 512
	_, sendErr, receiveErr := p.migrate(t, other)
	if sendErr == nil {
		t.Fatal("SendLive succeeded into a receiver that refused the VM")
	}
	t.Logf("SendLive: %v", sendErr)
	if receiveErr == nil || !strings.Contains(receiveErr.Error(), "shape") {
		t.Errorf("ReceiveLive into another shape: %v", receiveErr)
	}
	if _, err := p.target.Get(ctx, p.spec.ID); err == nil {
		t.Error("the refusing receiver kept an instance")
	}
	testenv.Eventually(t, 30*time.Second, "the source's QMP status to be running after the failed migration", func() (bool, string) {
		st := qmpStatusOf(t, p.source, p.spec.ID)
		return st == "running", "status " + st
	})
	if got, _ := p.source.Get(ctx, p.spec.ID); got.Phase != backend.Running || got.PID != p.orig.PID {
		t.Errorf("source after the failed migration: %+v, want the same process Running", got)
	}
	p.con.ExpectText(t, "cat /tmp/x", fmt.Sprint(p.token), 30*time.Second)
}

// TestLiveMigrationSourceResumesWhenTheTargetGivesUp: the stream completed,
// so the source's guest is paused (post-migrate), but the target drops the
// guest before taking over (its agent could not switch the Machine). The
// source resumes, with the guest's memory as it was.
func TestLiveMigrationSourceResumesWhenTheTargetGivesUp(t *testing.T) {
	ctx := context.Background()
	p := startLivePair(t, "back")
	if _, sendErr, receiveErr := p.migrate(t, p.spec); sendErr != nil || receiveErr != nil {
		t.Fatal(sendErr, receiveErr)
	}
	if err := p.target.Stop(ctx, p.spec.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := p.source.Get(ctx, p.spec.ID); got.Phase != backend.Paused {
		t.Fatalf("source after a completed send: %s, want Paused", got.Phase)
	}
	if err := p.source.Resume(ctx, p.spec.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := p.source.Get(ctx, p.spec.ID); got.Phase != backend.Running || got.PID != p.orig.PID {
		t.Errorf("source after Resume: %+v, want the same process Running", got)
	}
	p.con.ExpectText(t, "cat /tmp/x", fmt.Sprint(p.token), 30*time.Second)
}

// statusProbe passes a migration stream on and, once more than after bytes
// went through, reads the source's QMP status once, from inside the copy.
type statusProbe struct {
	w     io.Writer
	sock  string
	after int64

	n     int64
	asked bool
	seen  chan qmpStatus // one status, or closed without one on a QMP error
}

func (s *statusProbe) Write(b []byte) (int, error) {
	s.n += int64(len(b))
	if s.n > s.after && !s.asked {
		s.asked = true
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var st qmpStatus
		err := qmpDo(ctx, s.sock, func(q *qmpConn) error { var err error; st, err = q.status(); return err })
		cancel()
		if err == nil {
			s.seen <- st
		}
		close(s.seen)
	}
	return s.w.Write(b)
}

// TestLiveMigrationUnderTCGCopiesAStoppedGuest: under TCG, QEMU 7.2 loses
// guest stores made while it copies a running guest (see stopsBeforeCopy),
// and the target's guest crashed or hung, its console silent. So SendLive
// stops the guest first: once the guest's memory is on its way, the source
// reports it stopped, and after the move the token written before it is
// there and the counter goes on. Under KVM the guest runs during the copy.
func TestLiveMigrationUnderTCGCopiesAStoppedGuest(t *testing.T) {
	p := startLivePair(t, "stopped")
	before := startCounting(t, p)
	send, receive := tcpPair(t)
	received := make(chan error, 1)
	go func() {
		_, err := p.target.ReceiveLive(context.Background(), p.spec, receive)
		receive.Close()
		received <- err
	}()
	// Past the header and the first MiB of RAM: the copy is under way.
	probe := &statusProbe{w: send, sock: p.source.QMPSocket(p.spec.ID), after: 1 << 20, seen: make(chan qmpStatus, 1)}
	downtime, sendErr := p.source.SendLive(context.Background(), p.spec.ID, probe, backend.LiveOptions{})
	if err := errors.Join(sendErr, <-received); err != nil {
		t.Fatal(err)
	}
	st, ok := <-probe.seen
	if !ok {
		t.Fatal("no QMP status read during the copy")
	}
	t.Logf("source during the copy: %+v; downtime %s", st, downtime)
	if want := p.source.Acceleration() != "tcg"; st.Running != want {
		t.Errorf("source's guest during the copy (acceleration %s): %+v, want running %v", p.source.Acceleration(), st, want)
	}
	if err := p.source.Stop(context.Background(), p.spec.ID); err != nil {
		t.Fatal(err)
	}
	con := p.targetConsole(t)
	con.ExpectText(t, "cat /tmp/x", fmt.Sprint(p.token), 30*time.Second)
	counterPast(t, con, before, fmt.Sprintf("the counter to go on from %d after the migration", before))
}
