package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/guestagent/wire"
	"github.com/zyvor/kairon/internal/testenv"
)

// hostEnd runs Serve on one end of a socket pair and returns the other,
// after Hello.
func hostEnd(t *testing.T) (host *os.File, rd *wire.Reader, served chan error, guest *os.File) {
	t.Helper()
	return hostEndOf(t, New(Options{}))
}

// hostEndOf is hostEnd with agent a serving.
func hostEndOf(t *testing.T, a *Agent) (host *os.File, rd *wire.Reader, served chan error, guest *os.File) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	host, guest = os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "guest")
	t.Cleanup(func() { host.Close(); guest.Close() })
	served = make(chan error, 1)
	go func() { served <- a.Serve(guest) }()
	send(t, host, 0, &wire.Hello{Versions: []int{1}})
	rd = wire.NewReader(host)
	if f := next(t, rd); f.Type != wire.TypeHello {
		t.Fatalf("first frame %s", f.Type)
	}
	return host, rd, served, guest
}

func send(t *testing.T, w io.Writer, stream uint32, m any) {
	t.Helper()
	f, err := wire.Encode(stream, m)
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.WriteFrame(w, f); err != nil {
		t.Fatal(err)
	}
}

func next(t *testing.T, rd *wire.Reader) wire.Frame {
	t.Helper()
	f, err := rd.ReadFrame()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A host that sends stdin past the window breaks the protocol: Serve ends
// with ErrProtocol and kills the session's program.
func TestServeRefusesStdinPastTheWindow(t *testing.T) {
	host, rd, served, guest := hostEnd(t)
	pid := startSleep(t, host, rd, 1)
	// sleep never reads stdin: once the window and the pipe's buffer are
	// full, more is past the window. The write is cut when Serve gives up.
	go func() { _ = wire.WriteData(host, wire.TypeStdin, 1, make([]byte, 4<<20)) }()
	if err := <-served; !errors.Is(err, ErrProtocol) {
		t.Fatalf("Serve ended with %v", err)
	}
	guest.Close()
	// The program was killed (and reaped by its session).
	waitKilled(t, pid)
}

// startSleep runs a long sleep on stream and returns its pid once it runs.
func startSleep(t *testing.T, host io.Writer, rd *wire.Reader, stream uint32) int {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	send(t, host, stream, &wire.Request{Op: wire.OpExec, Exec: &wire.Exec{Args: []string{"sh", "-c", "echo $$ > " + pidFile + "; echo started; exec sleep 60"}}})
	if f := next(t, rd); f.Type != wire.TypeResponse {
		t.Fatalf("got %s", f.Type)
	}
	if f := next(t, rd); f.Type != wire.TypeStdout || string(f.Payload) != "started\n" {
		t.Fatalf("got %s %q", f.Type, f.Payload)
	}
	pid, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(pid)))
	if err != nil {
		t.Fatalf("pid file %q", pid)
	}
	return n
}

// waitKilled waits until the process pid is gone.
func waitKilled(t *testing.T, pid int) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "the session's program to be killed", func() (bool, string) {
		err := syscall.Kill(pid, 0)
		return errors.Is(err, syscall.ESRCH), fmt.Sprintf("kill -0 %d: %v", pid, err)
	})
}

// A host that hangs up ends Serve with io.EOF; a garbled frame with
// ErrProtocol.
func TestServeEnds(t *testing.T) {
	host, _, served, _ := hostEnd(t)
	host.Close()
	if err := <-served; !errors.Is(err, io.EOF) {
		t.Errorf("after hang-up: %v", err)
	}
	host, _, served, _ = hostEnd(t)
	if _, err := host.Write([]byte("garbage that is no frame")); err != nil {
		t.Fatal(err)
	}
	if err := <-served; !errors.Is(err, ErrProtocol) && !errors.Is(err, wire.ErrBadMagic) {
		t.Errorf("after garbage: %v", err)
	}
}

func TestResync(t *testing.T) {
	hello, err := wire.Encode(0, &wire.Hello{Versions: []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	frame, _ := wire.AppendFrame(nil, hello)
	for _, junk := range []string{"", "garbage", "KG", "KKG\x01", "KG\x01\x01\x00\x00\x00\x07 stream 7", strings.Repeat("K", 70000)} {
		br := bufio.NewReader(io.MultiReader(strings.NewReader(junk), bytes.NewReader(frame)))
		if err := Resync(br); err != nil {
			t.Fatalf("after %q: %v", junk, err)
		}
		f, err := wire.NewReader(br).ReadFrame()
		if err != nil || f.Type != wire.TypeHello {
			t.Errorf("after %q: read %v, %v", junk, f.Type, err)
		}
	}
	br := bufio.NewReader(strings.NewReader("no hello here KG\x01"))
	if err := Resync(br); !errors.Is(err, io.EOF) || br.Buffered() != 0 {
		t.Errorf("without a hello: %v, %d left", err, br.Buffered())
	}
}

// Frames before Hello are left from an earlier connection: skipped.
func TestServeSkipsFramesBeforeHello(t *testing.T) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	host, guest := os.NewFile(uintptr(fds[0]), "host"), os.NewFile(uintptr(fds[1]), "guest")
	t.Cleanup(func() { host.Close(); guest.Close() })
	served := make(chan error, 1)
	go func() { served <- New(Options{}).Serve(guest) }()
	send(t, host, 9, &wire.Cancel{Signal: "KILL"})
	send(t, host, 0, &wire.Hello{Versions: []int{1}})
	send(t, host, 1, &wire.Request{Op: wire.OpPing})
	rd := wire.NewReader(host)
	for _, want := range []wire.Type{wire.TypeHello, wire.TypeResponse, wire.TypeExit} {
		if f := next(t, rd); f.Type != want {
			t.Fatalf("got %s, want %s", f.Type, want)
		}
	}
	host.Close()
	if err := <-served; !errors.Is(err, io.EOF) {
		t.Errorf("Serve ended with %v", err)
	}
}

// A host that reconnects (a second Hello on the port) and sends its
// configure again while the first still runs gets the second applied after
// the first, never alongside it: two at once race each other's address
// flush, and one fails.
func TestConfigureRequestsRunOneAtATime(t *testing.T) {
	var (
		mu      sync.Mutex
		events  []string
		entered = make(chan struct{}, 2)
		ended   = make(chan struct{}, 2)
		release = make(chan struct{})
	)
	a := New(Options{Configure: func(c *wire.Configure) error {
		mu.Lock()
		events = append(events, "begin "+c.Hostname)
		mu.Unlock()
		entered <- struct{}{}
		if c.Hostname == "first" {
			<-release
		}
		mu.Lock()
		events = append(events, "end "+c.Hostname)
		mu.Unlock()
		ended <- struct{}{}
		return nil
	}})
	host, rd, _, _ := hostEndOf(t, a)
	expect := func(want wire.Type) wire.Frame {
		t.Helper()
		f := next(t, rd)
		if f.Type != want {
			t.Fatalf("got a %s frame on stream %d, want %s", f.Type, f.Stream, want)
		}
		return f
	}
	send(t, host, 1, &wire.Request{Op: wire.OpConfigure, Configure: &wire.Configure{Hostname: "first"}})
	expect(wire.TypeResponse)
	<-entered
	send(t, host, 0, &wire.Hello{Versions: []int{1}})
	expect(wire.TypeHello)
	send(t, host, 1, &wire.Request{Op: wire.OpConfigure, Configure: &wire.Configure{Hostname: "second"}})
	expect(wire.TypeResponse)
	// A ping's round trip gives the second request's session the time to
	// reach its configure before the first is let go.
	send(t, host, 3, &wire.Request{Op: wire.OpPing})
	expect(wire.TypeResponse)
	expect(wire.TypeExit)
	close(release)
	<-ended
	<-ended
	mu.Lock()
	defer mu.Unlock()
	if got, want := strings.Join(events, ", "), "begin first, end first, begin second, end second"; got != want {
		t.Errorf("configure calls: %s; want %s", got, want)
	}
}

// What a command wrote before it exited is sent even when the pump reads
// it only after the drain's deadline passed, as it does when the guest
// stalls between the exit and the read. Here the pump waits for the host's
// window while the command exits, and there is no grace at all.
func TestOutputBufferedAtExitIsSentAfterTheGrace(t *testing.T) {
	exited := make(chan struct{})
	oldGrace, oldHook := drainGrace, afterExitHook
	drainGrace, afterExitHook = 0, func() { close(exited) }
	t.Cleanup(func() { drainGrace, afterExitHook = oldGrace, oldHook })

	host, rd, _, _ := hostEnd(t)
	send(t, host, 1, &wire.Request{Op: wire.OpExec, Exec: &wire.Exec{Args: []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero; echo tail", wire.InitialWindow)}}})
	if f := next(t, rd); f.Type != wire.TypeResponse {
		t.Fatalf("got %s", f.Type)
	}
	for got := 0; got < wire.InitialWindow; {
		f := next(t, rd)
		if f.Type != wire.TypeStdout {
			t.Fatalf("got a %s frame after %d bytes of stdout", f.Type, got)
		}
		got += len(f.Payload)
	}
	// The window is spent: "tail" waits in the pipe until the command has
	// exited and its pipes' deadlines have passed.
	<-exited
	send(t, host, 1, &wire.Window{Stream: "stdout", Bytes: 1 << 10})
	f := next(t, rd)
	if f.Type != wire.TypeStdout || string(f.Payload) != "tail\n" {
		t.Fatalf("after the window: a %s frame %q, want stdout %q", f.Type, f.Payload, "tail\n")
	}
	if f := next(t, rd); f.Type != wire.TypeExit {
		t.Fatalf("then a %s frame, want exit", f.Type)
	}
}

// A second Hello starts a new connection on the same port: the old one's
// sessions are killed, and nothing of theirs follows the new Hello, where
// their streams may already be the new connection's.
func TestSecondHelloDropsTheOldSessions(t *testing.T) {
	host, rd, _, _ := hostEnd(t)
	pid := startSleep(t, host, rd, 1)
	send(t, host, 0, &wire.Hello{Versions: []int{1}})
	if f := next(t, rd); f.Type != wire.TypeHello {
		t.Fatalf("got a %s frame on stream %d, want the Hello", f.Type, f.Stream)
	}
	waitKilled(t, pid)
	// Stream 1 again, now the new connection's: only its own frames.
	send(t, host, 1, &wire.Request{Op: wire.OpPing})
	for _, want := range []wire.Type{wire.TypeResponse, wire.TypeExit} {
		f := next(t, rd)
		if f.Type != want || f.Stream != 1 {
			t.Fatalf("got a %s frame on stream %d (%q), want the ping's %s", f.Type, f.Stream, f.Payload, want)
		}
		if want == wire.TypeExit {
			m, err := wire.Decode(f)
			if err != nil {
				t.Fatal(err)
			}
			if e := m.(*wire.Exit); e.Status == nil || e.Signal != "" {
				t.Fatalf("the ping's exit: %+v, want a status", e)
			}
		}
	}
}
