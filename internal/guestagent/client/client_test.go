package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"github.com/zyvor/kairon/internal/testenv"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/zyvor/kairon/internal/guestagent/agent"
	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// socketPair is a connected pair: the host's net.Conn and the guest's end.
func socketPair(t *testing.T) (net.Conn, *os.File) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	hf := os.NewFile(uintptr(fds[0]), "host")
	host, err := net.FileConn(hf)
	hf.Close()
	if err != nil {
		t.Fatal(err)
	}
	guest := os.NewFile(uintptr(fds[1]), "guest")
	t.Cleanup(func() { host.Close(); guest.Close() })
	return host, guest
}

// agentPair runs the real agent on one end of a socket pair and returns a
// Client on the other.
func agentPair(t *testing.T, opts agent.Options) *Client {
	t.Helper()
	host, guest := socketPair(t)
	a := agent.New(opts)
	served := make(chan error, 1)
	go func() { served <- a.Serve(guest) }()
	c, err := New(context.Background(), host, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		// The host hung up. A Unix socket closed with data it had not read
		// yet (a session's output still on its way, as when a test leaves
		// one stalled) resets the connection instead of ending it, and the
		// guest reads ECONNRESET rather than EOF.
		if err := <-served; !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("agent ended with %v, want EOF or ECONNRESET", err)
		}
	})
	return c
}

func run(t *testing.T, c *Client, req *wire.Exec, stdin io.Reader) (Result, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := c.Exec(context.Background(), req, stdin, &out, &errb)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Args, err)
	}
	return res, out.String(), errb.String()
}

func TestExec(t *testing.T) {
	c := agentPair(t, agent.Options{})
	if !strings.HasPrefix(c.Agent(), "kairon-guest-agent") {
		t.Errorf("agent name %q", c.Agent())
	}
	if err := c.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}

	t.Run("echo", func(t *testing.T) {
		res, out, _ := run(t, c, &wire.Exec{Args: []string{"echo", "hello", "kairon"}}, nil)
		if res.Code != 0 || out != "hello kairon\n" {
			t.Errorf("got %+v %q", res, out)
		}
	})
	t.Run("exit codes and stderr", func(t *testing.T) {
		res, out, errs := run(t, c, &wire.Exec{Args: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, nil)
		if res.Code != 3 || out != "out\n" || errs != "err\n" {
			t.Errorf("got %+v %q %q", res, out, errs)
		}
	})
	t.Run("env and dir", func(t *testing.T) {
		dir := t.TempDir()
		_, out, _ := run(t, c, &wire.Exec{Args: []string{"sh", "-c", `echo "$GREETING $(pwd)"`}, Env: []string{"GREETING=hi"}, Dir: dir}, nil)
		if out != "hi "+dir+"\n" {
			t.Errorf("got %q", out)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		in := bytes.Repeat([]byte("stdin passes through\n"), 100000) // 2 MiB: past the window
		_, out, _ := run(t, c, &wire.Exec{Args: []string{"cat"}}, bytes.NewReader(in))
		if out != string(in) {
			t.Errorf("cat gave back %d bytes of %d", len(out), len(in))
		}
	})
	t.Run("10 MB of output", func(t *testing.T) {
		const size = 10 << 20
		h := sha256.New()
		res, err := c.Exec(context.Background(), &wire.Exec{Args: []string{"sh", "-c", "yes 0123456789abcdef | head -c 10485760"}}, nil, h, nil)
		if err != nil || res.Code != 0 {
			t.Fatal(res, err)
		}
		want := sha256.Sum256(bytes.Repeat([]byte("0123456789abcdef\n"), size/17+1)[:size])
		if !bytes.Equal(h.Sum(nil), want[:]) {
			t.Error("output checksum differs")
		}
	})
	t.Run("not found", func(t *testing.T) {
		res, err := c.Exec(context.Background(), &wire.Exec{Args: []string{"/no/such/program"}}, nil, nil, nil)
		var ee *ExitError
		if !errors.As(err, &ee) || res.Code != 127 {
			t.Errorf("got %+v, %v", res, err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		res, err := c.Exec(context.Background(), &wire.Exec{Args: []string{"sleep", "60"}, TimeoutSeconds: 1}, nil, nil, nil)
		if err != nil || !res.TimedOut || res.Code != -1 || res.Signal != "KILL" {
			t.Errorf("got %+v, %v", res, err)
		}
	})
	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		started := &signalWriter{ch: make(chan struct{})}
		errc := make(chan error, 1)
		go func() {
			_, err := c.Exec(ctx, &wire.Exec{Args: []string{"sh", "-c", "echo started; exec sleep 60"}}, nil, started, nil)
			errc <- err
		}()
		<-started.ch
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("got %v", err)
		}
		// The channel is still usable.
		if err := c.Ping(context.Background()); err != nil {
			t.Error(err)
		}
	})
	t.Run("tty", func(t *testing.T) {
		res, out, _ := run(t, c, &wire.Exec{Args: []string{"sh", "-c", "tty; stty size"}, TTY: true, Rows: 40, Cols: 120}, nil)
		if res.Code != 0 || !strings.HasPrefix(out, "/dev/pts/") || !strings.Contains(out, "40 120\r\n") {
			t.Errorf("got %+v %q", res, out)
		}
	})
	t.Run("tty resize", func(t *testing.T) {
		resize := make(chan wire.Resize, 1)
		ready := &signalWriter{ch: make(chan struct{})}
		out := &lockedBuffer{}
		go func() {
			<-ready.ch
			resize <- wire.Resize{Rows: 50, Cols: 132}
		}()
		script := `trap 'stty size; exit 0' WINCH; echo ready; while :; do sleep 1; done`
		res, err := c.Exec(context.Background(), &wire.Exec{Args: []string{"sh", "-c", script}, TTY: true, Rows: 24, Cols: 80}, nil,
			io.MultiWriter(out, ready), nil, WithResize(resize))
		if err != nil || res.Code != 0 || !strings.Contains(out.String(), "50 132") {
			t.Errorf("got %+v %v %q", res, err, out.String())
		}
	})
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type signalWriter struct {
	once sync.Once
	ch   chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.ch) })
	return len(p), nil
}

func TestFiles(t *testing.T) {
	c := agentPair(t, agent.Options{})
	ctx := context.Background()
	dir := t.TempDir()
	data := make([]byte, 20<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>13)
	}
	path := filepath.Join(dir, "big.bin")
	n, err := c.WriteFile(ctx, path, 0o600, bytes.NewReader(data))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("wrote %d: %v", n, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("written file: %v %v", fi, err)
	}
	h := sha256.New()
	n, err = c.ReadFile(ctx, path, h)
	if err != nil || n != int64(len(data)) {
		t.Fatalf("read %d: %v", n, err)
	}
	if want := sha256.Sum256(data); !bytes.Equal(h.Sum(nil), want[:]) {
		t.Error("checksum differs")
	}
	if _, err := c.ReadFile(ctx, filepath.Join(dir, "missing"), io.Discard); err == nil {
		t.Error("reading a missing file succeeded")
	}
	if _, err := c.ReadFile(ctx, dir, io.Discard); err == nil {
		t.Error("reading a directory succeeded")
	}
	if _, err := c.WriteFile(ctx, "/no/such/dir/x", 0, strings.NewReader("x")); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
	// A source that fails half way: no half file in its place.
	cut := filepath.Join(dir, "cut.bin")
	if _, err := c.WriteFile(ctx, cut, 0o644, io.MultiReader(bytes.NewReader(data[:1<<20]), iotest.ErrReader(errors.New("disk gone")))); err == nil {
		t.Error("a write whose source failed succeeded")
	}
	testenv.Eventually(t, 10*time.Second, "the guest to drop the cut write", func() (bool, string) {
		ents, _ := os.ReadDir(dir)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		return len(ents) == 1, fmt.Sprint(names)
	})
}

func TestConfigure(t *testing.T) {
	var got *wire.Configure
	c := agentPair(t, agent.Options{Configure: func(cfg *wire.Configure) error {
		got = cfg
		if cfg.Hostname == "bad" {
			return errors.New("cannot")
		}
		return nil
	}})
	cfg := &wire.Configure{Hostname: "web-1", Addresses: []string{"10.88.0.5/24"}, Gateway: "10.88.0.1", DNS: []string{"10.88.0.1"}, Seed: []byte{1, 2, 3}}
	if err := c.Configure(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.Hostname != "web-1" || string(got.Seed) != "\x01\x02\x03" {
		t.Errorf("agent got %+v", got)
	}
	if err := c.Configure(context.Background(), &wire.Configure{Hostname: "bad"}); err == nil || !strings.Contains(err.Error(), "cannot") {
		t.Errorf("failed configure: %v", err)
	}
}

// A ping reports the boot nonce the agent was started with, or the one the
// last configure gave it, and readiness as the ready file says.
func TestStatus(t *testing.T) {
	ctx := context.Background()
	ready := filepath.Join(t.TempDir(), "ready")
	c := agentPair(t, agent.Options{Boot: "b00t1", ReadyFile: ready, Configure: func(*wire.Configure) error { return nil }})
	status := func() wire.Status {
		t.Helper()
		st, err := c.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if st := status(); st != (wire.Status{Boot: "b00t1"}) {
		t.Errorf("before the ready file: %+v", st)
	}
	if err := os.WriteFile(ready, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if st := status(); st != (wire.Status{Boot: "b00t1", Ready: true}) {
		t.Errorf("with the ready file: %+v", st)
	}
	if err := c.Configure(ctx, &wire.Configure{Boot: "cl0ne2"}); err != nil {
		t.Fatal(err)
	}
	if st := status(); st != (wire.Status{Boot: "cl0ne2", Ready: true}) {
		t.Errorf("after configure: %+v", st)
	}
	// A nonce is letters and digits: nothing a log or a command line would
	// misread.
	if err := c.Configure(ctx, &wire.Configure{Boot: "a b"}); err == nil || !strings.Contains(err.Error(), "configure.boot") {
		t.Errorf("configure with a bad nonce: %v", err)
	}
}

// A caller that stops taking one session's output stalls that session
// only: the guest fills its window and waits, and the channel still serves
// the others.
func TestStalledSessionDoesNotBlockOthers(t *testing.T) {
	c := agentPair(t, agent.Options{})
	release := make(chan struct{})
	stuck := &blockingWriter{entered: make(chan struct{}), release: release}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, &wire.Exec{Args: []string{"yes"}}, nil, stuck, nil)
		done <- err
	}()
	<-stuck.entered
	for range 3 {
		if err := c.Ping(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, out, _ := run(t, c, &wire.Exec{Args: []string{"echo", "still here"}}, nil); out != "still here\n" {
			t.Fatalf("got %q", out)
		}
	}
	cancel()
	close(release)
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("stalled exec ended with %v", err)
	}
}

type blockingWriter struct {
	once    sync.Once
	entered chan struct{}
	release chan struct{}
}

func (w *blockingWriter) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.entered) })
	<-w.release
	return len(p), nil
}

// fakeGuest is the guest's end of a channel driven by a test: it answers
// Hello, then does what the test says.
func fakeGuest(t *testing.T) (*Client, *os.File, *wire.Reader) {
	t.Helper()
	host, guest := socketPair(t)
	rd := wire.NewReader(guest)
	helloed := make(chan error, 1)
	go func() {
		f, err := rd.ReadFrame()
		if err == nil && f.Type != wire.TypeHello {
			err = errors.New("first frame is not Hello")
		}
		if err == nil {
			err = send(guest, 0, &wire.Hello{Versions: []int{1}, Agent: "fake\x1b[31m guest\n"})
		}
		helloed <- err
	}()
	c, err := New(context.Background(), host, Options{WriteTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := <-helloed; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, guest, rd
}

func send(w io.Writer, stream uint32, m any) error {
	f, err := wire.Encode(stream, m)
	if err != nil {
		return err
	}
	return wire.WriteFrame(w, f)
}

// A guest that writes garbage, an oversized frame, data past its window or
// a message out of place gets its channel closed; sessions waiting on it
// fail at once, and nothing on the host crashes or waits.
func TestHostileGuest(t *testing.T) {
	cases := []struct {
		name string
		act  func(guest *os.File, stream uint32) error
	}{
		{"garbage", func(g *os.File, _ uint32) error {
			_, err := g.Write([]byte("\x00\xffGET / HTTP/1.1\r\n\r\n rm -rf / ; KAIRON-READY"))
			return err
		}},
		{"oversized frame", func(g *os.File, stream uint32) error {
			// 4 GiB announced: refused from the header, nothing allocated.
			_, err := g.Write([]byte{'K', 'G', 1, byte(wire.TypeStdout), 0, 0, 0, byte(stream), 0xff, 0xff, 0xff, 0xff})
			return err
		}},
		{"oversized control frame", func(g *os.File, stream uint32) error {
			_, err := g.Write([]byte{'K', 'G', 1, byte(wire.TypeExit), 0, 0, 0, byte(stream), 0, 1, 0, 0})
			return err
		}},
		{"data past the window", func(g *os.File, stream uint32) error {
			if err := send(g, stream, &wire.Response{OK: true}); err != nil {
				return err
			}
			return wire.WriteData(g, wire.TypeStdout, stream, make([]byte, wire.InitialWindow+1))
		}},
		{"a request from the guest", func(g *os.File, stream uint32) error {
			return send(g, stream, &wire.Request{Op: wire.OpPing})
		}},
		{"invalid exit", func(g *os.File, stream uint32) error {
			return wire.WriteFrame(g, wire.Frame{Type: wire.TypeExit, Stream: stream, Payload: []byte(`{"code":999}`)})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, guest, rd := fakeGuest(t)
			if !strings.HasPrefix(c.Agent(), "fake ") || strings.ContainsAny(c.Agent(), "\x1b\n") {
				t.Errorf("agent name not cleaned: %q", c.Agent())
			}
			// A caller that takes no output: nothing is granted again, so
			// data past the first window is the guest's doing.
			release := make(chan struct{})
			stuck := &blockingWriter{entered: make(chan struct{}), release: release}
			errc := make(chan error, 1)
			go func() {
				_, err := c.Exec(context.Background(), &wire.Exec{Args: []string{"yes"}}, nil, stuck, nil)
				errc <- err
			}()
			f, err := rd.ReadFrame()
			if err != nil || f.Type != wire.TypeRequest {
				t.Fatalf("guest read %v, %v", f.Type, err)
			}
			if err := tc.act(guest, f.Stream); err != nil {
				t.Fatal(err)
			}
			<-c.Done()
			if err := c.Err(); !errors.Is(err, ErrProtocol) {
				t.Errorf("channel closed with %v, want ErrProtocol", err)
			}
			close(release)
			if err := <-errc; !errors.Is(err, ErrProtocol) {
				t.Errorf("the session ended with %v", err)
			}
			if err := c.Ping(context.Background()); err == nil {
				t.Error("ping on a closed channel succeeded")
			}
		})
	}
}

// A guest that stops answering does not hold a caller past its context.
func TestStalledGuest(t *testing.T) {
	c, _, rd := fakeGuest(t)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Ping(ctx) }()
	if f, err := rd.ReadFrame(); err != nil || f.Type != wire.TypeRequest {
		t.Fatalf("guest read %v, %v", f.Type, err)
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("ping ended with %v", err)
	}
	// The host told the guest to give up.
	if f, err := rd.ReadFrame(); err != nil || f.Type != wire.TypeCancel {
		t.Errorf("guest read %v, %v; want Cancel", f.Type, err)
	}
}

// A guest that never says Hello, or says everything but, does not hold
// Dial past its context or its frame limit.
func TestHelloRefusals(t *testing.T) {
	t.Run("silent", func(t *testing.T) {
		host, guest := socketPair(t)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := New(ctx, host, Options{})
			errc <- err
		}()
		if f, err := wire.NewReader(guest).ReadFrame(); err != nil || f.Type != wire.TypeHello {
			t.Fatalf("guest read %v, %v", f.Type, err)
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("New ended with %v", err)
		}
	})
	t.Run("chatter without hello", func(t *testing.T) {
		host, guest := socketPair(t)
		go func() {
			f, _ := wire.Encode(7, &wire.Exit{Code: 0})
			for range maxFramesBeforeHello + 1 {
				if wire.WriteFrame(guest, f) != nil {
					return
				}
			}
		}()
		if _, err := New(context.Background(), host, Options{}); !errors.Is(err, ErrProtocol) {
			t.Errorf("New ended with %v", err)
		}
	})
	t.Run("another version", func(t *testing.T) {
		host, guest := socketPair(t)
		go func() { _ = send(guest, 0, &wire.Hello{Versions: []int{2, 3}}) }()
		if _, err := New(context.Background(), host, Options{}); err == nil || !strings.Contains(err.Error(), "versions") {
			t.Errorf("New ended with %v", err)
		}
	})
}

// Frames an earlier connection's sessions left in the agent's port (here
// the end of a killed session on stream 1, where every connection used to
// start) do not end this connection's first session.
func TestFramesLeftByAnEarlierConnection(t *testing.T) {
	c, guest, rd := fakeGuest(t)
	type result struct {
		res Result
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		var out bytes.Buffer
		res, err := c.Exec(context.Background(), &wire.Exec{Args: []string{"cat", "/tmp/kept"}}, nil, &out, nil)
		done <- result{res, out.String(), err}
	}()
	f, err := rd.ReadFrame()
	if err != nil || f.Type != wire.TypeRequest {
		t.Fatalf("guest read %v, %v", f.Type, err)
	}
	stream := f.Stream
	if err := send(guest, 1, &wire.Response{OK: true}); err != nil {
		t.Fatal(err)
	}
	if err := send(guest, 1, &wire.Exit{Code: -1, Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	if stream == 1 {
		// What the earlier connection's frames did to this one's session:
		// it ended killed, without its output.
		r := <-done
		t.Fatalf("this connection's first session is on stream 1 too: it ended with %+v %q %v", r.res, r.out, r.err)
	}
	if err := send(guest, stream, &wire.Response{OK: true}); err != nil {
		t.Fatal(err)
	}
	if err := wire.WriteData(guest, wire.TypeStdout, stream, []byte("kept\n")); err != nil {
		t.Fatal(err)
	}
	if err := send(guest, stream, &wire.Exit{Code: 0}); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || r.res.Code != 0 || r.res.Signal != "" || r.out != "kept\n" {
		t.Errorf("the session ended with %+v %q %v, want code 0 and %q", r.res, r.out, r.err, "kept\n")
	}
}

// An image guest's ping carries its main process's state, which the node
// reads from the Status it already asks for; a guest that sends a state
// that is not one breaks the protocol.
func TestStatusMain(t *testing.T) {
	ctx := context.Background()
	state := filepath.Join(t.TempDir(), "main.json")
	c := agentPair(t, agent.Options{Boot: "b00t1", MainStateFile: state})
	if st, err := c.Status(ctx); err != nil || st.Main != nil {
		t.Errorf("before the main process: %+v %v", st, err)
	}
	if err := os.WriteFile(state, []byte(`{"state":"exited","exitCode":3}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if st, err := c.Status(ctx); err != nil || st.Main == nil || *st.Main != (wire.MainProcess{State: wire.MainExited, ExitCode: 3}) || st.Main.String() != "exited with code 3" {
		t.Errorf("after it exited: %+v %v", st, err)
	}

	c2, guest, rd := fakeGuest(t)
	done := make(chan error, 1)
	go func() { _, err := c2.Status(ctx); done <- err }()
	f, err := rd.ReadFrame()
	if err != nil || f.Type != wire.TypeRequest {
		t.Fatalf("guest read %v, %v", f.Type, err)
	}
	if err := send(guest, f.Stream, &wire.Response{OK: true}); err != nil {
		t.Fatal(err)
	}
	bad := []byte(`{"code":0,"status":{"main":{"state":"exited","exitCode":-1,"signal":"\u001b[2J"}}}`)
	if err := wire.WriteFrame(guest, wire.Frame{Type: wire.TypeExit, Stream: f.Stream, Payload: bad}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrProtocol) {
		t.Errorf("a main process with a terminal escape for a signal: %v", err)
	}
}

// A Hello after the handshake is dropped: the agent answers every Hello its
// port read, an earlier connection's too, so the one Dial took may not have
// been the answer to its own. The channel and its sessions go on.
func TestHelloAfterTheHandshake(t *testing.T) {
	c, guest, rd := fakeGuest(t)
	done := make(chan error, 1)
	go func() { done <- c.Ping(context.Background()) }()
	f, err := rd.ReadFrame()
	if err != nil || f.Type != wire.TypeRequest {
		t.Fatalf("guest read %v, %v", f.Type, err)
	}
	for _, m := range []struct {
		stream uint32
		msg    any
	}{
		{0, &wire.Hello{Versions: []int{1}, Agent: "the answer to this connection's Hello"}},
		{f.Stream, &wire.Response{OK: true}},
		{f.Stream, &wire.Exit{Status: &wire.Status{Ready: true}}},
	} {
		if err := send(guest, m.stream, m.msg); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Errorf("ping: %v (channel: %v)", err, c.Err())
	}
}
