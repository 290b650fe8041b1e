package node

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/execstream"
	"github.com/zyvor/kairon/internal/guestagent/client"
	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// The node agent's endpoints into a guest (docs/guides/exec.md), beside the
// console log, each an HTTP/1.1 POST upgraded to an execstream connection:
//
//	POST /v1/machines/{namespace}/{name}/exec?command=A&command=B&stdin=true&tty=true&rows=R&cols=C&timeout=S&dir=D&env=K=V
//	POST /v1/machines/{namespace}/{name}/files/read?path=P
//	POST /v1/machines/{namespace}/{name}/files/write?path=P&mode=0644
//	POST /v1/machines/{namespace}/{name}/console/attach
//
// Each is authenticated like the console (a client certificate of
// --client-ca-file or a bearer token) and authorized per request with a
// SubjectAccessReview: create machines/exec for exec and the files,
// create machines/console to attach. A request with Impersonate-* headers
// is authorized and logged as the user it impersonates, once its sender
// was found allowed to (console_impersonation.go). A refused request gets
// its status before anything is dialed: nothing reaches the guest. Every
// session is logged with who ran it, and who impersonated them.

// agentChannel is a backend whose VMs have a guest agent channel (qemu).
type agentChannel interface {
	AgentSocket(id string) string
}

// consoleChannel is a backend whose VMs' serial consoles can be typed
// into (qemu).
type consoleChannel interface {
	ConsoleSocket(id string) string
}

// guestDialTimeout bounds connecting to a guest agent (the Hello).
const guestDialTimeout = 10 * time.Second

func (a *Agent) execRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/machines/{namespace}/{name}/exec", a.serveExec)
	mux.HandleFunc("POST /v1/machines/{namespace}/{name}/files/read", a.serveFileRead)
	mux.HandleFunc("POST /v1/machines/{namespace}/{name}/files/write", a.serveFileWrite)
	mux.HandleFunc("POST /v1/machines/{namespace}/{name}/console/attach", a.serveConsoleAttach)
}

// guestRequest is an authorized request for a session in a guest.
type guestRequest struct {
	user            consoleUser
	namespace, name string
	op              string
	start           time.Time
}

func (g *guestRequest) machine() string { return g.namespace + "/" + g.name }

// admit authenticates (401), checks the names (400), authorizes access
// (403) and checks that the request asks for the upgrade (400), in that
// order; refusals after authentication are logged.
func (a *Agent) admit(w http.ResponseWriter, r *http.Request, access machineAccess, op string) (*guestRequest, bool) {
	user, ok := a.consoleAuth.authenticate(w, r)
	if !ok {
		return nil, false
	}
	namespace, name, ok := requestNames(w, r)
	if !ok {
		return nil, false
	}
	g := &guestRequest{user: user, namespace: namespace, name: name, op: op, start: time.Now()}
	if !a.consoleAuth.authorize(w, r, user, access, namespace, name) {
		log.FromContext(r.Context()).WithName("guest-session").Info("refused",
			append(user.logValues(), "op", op, "machine", g.machine(), "needs", access.String())...)
		return nil, false
	}
	if r.ProtoMajor != 1 || !execstream.IsUpgrade(r) {
		http.Error(w, "needs HTTP/1.1 with Connection: Upgrade and Upgrade: "+execstream.Protocol, http.StatusBadRequest)
		return nil, false
	}
	return g, true
}

// guestClient is the open channel to the Machine's guest agent, or an
// answered error.
func (a *Agent) guestClient(w http.ResponseWriter, r *http.Request, g *guestRequest) (*client.Client, bool) {
	id := instanceID(g.namespace, g.name)
	if !a.hasInstance(w, r, g) {
		return nil, false
	}
	ch, ok := a.opts.Backend.(agentChannel)
	if !ok {
		http.Error(w, fmt.Sprintf("machine %s runs on the %s backend, which has no guest agent channel (exec and cp need the qemu backend)", g.machine(), a.opts.Backend.Name()), http.StatusNotImplemented)
		return nil, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), guestDialTimeout)
	defer cancel()
	c, err := guestChannels.get(ctx, ch.AgentSocket(id))
	if err != nil {
		http.Error(w, fmt.Sprintf("the guest agent of machine %s does not answer: %s", g.machine(), client.CleanText(err.Error(), 512)), http.StatusServiceUnavailable)
		return nil, false
	}
	return c, true
}

// hasInstance answers 404 unless the Machine's VM runs on this node.
func (a *Agent) hasInstance(w http.ResponseWriter, r *http.Request, g *guestRequest) bool {
	inst, err := a.opts.Backend.Get(r.Context(), instanceID(g.namespace, g.name))
	switch {
	case errors.Is(err, backend.ErrNotFound):
		http.Error(w, fmt.Sprintf("no machine %s on node %s", g.machine(), a.opts.NodeName), http.StatusNotFound)
		return false
	case err != nil:
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return false
	case inst.Phase == backend.Exited:
		http.Error(w, fmt.Sprintf("machine %s is not running on node %s (%s)", g.machine(), a.opts.NodeName, inst.Phase), http.StatusConflict)
		return false
	}
	return true
}

// upgrade answers 101 and takes the connection over.
// openGuestStream reaches g's guest agent, then upgrades the request: a
// guest that cannot be reached is answered in HTTP before the upgrade.
func (a *Agent) openGuestStream(w http.ResponseWriter, r *http.Request, g *guestRequest) (*client.Client, net.Conn, *wire.Reader, bool) {
	c, ok := a.guestClient(w, r, g)
	if !ok {
		return nil, nil, nil, false
	}
	conn, fr, err := upgrade(w)
	if err != nil {
		return nil, nil, nil, false
	}
	return c, conn, fr, true
}

func upgrade(w http.ResponseWriter) (net.Conn, *wire.Reader, error) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		http.Error(w, "cannot take the connection over", http.StatusInternalServerError)
		return nil, nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + execstream.Protocol + "\r\n\r\n")
	if err := brw.Flush(); err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, wire.NewReader(brw.Reader), nil
}

// clientStream reads what the client sends during a session: only Stdin
// data (if the session takes stdin), Close of stdin, Resize (TTY) and
// Cancel on execstream.StreamID. Anything else, or the client hanging up,
// ends the session (cancel). Stdin goes to stdin, a pipe the session
// reads, so a client sending faster than the guest takes is held by TCP.
type clientStream struct {
	fr     *wire.Reader
	stdin  *io.PipeWriter // nil: the session takes no stdin
	resize chan wire.Resize
	cancel context.CancelFunc
	// input is the session's side of stdin; ended is closed once the
	// session returned: stdin is failed only then (see sessionInput).
	input *sessionInput
	ended <-chan struct{}
}

// run reads the client until it hangs up or breaks the rules, then
// cancels the session and ends its stdin.
func (s *clientStream) run() error {
	err := s.loop()
	s.cancel()
	if s.ended != nil {
		<-s.ended
	}
	if s.stdin != nil {
		s.stdin.CloseWithError(fmt.Errorf("the client: %w", err))
	}
	return err
}

// sessionInput is a session's stdin from the client. The guest agent
// client takes an error from its stdin as the end of it and sends Close
// (the guest then renames a file being written into place); a session
// canceled because its client hung up must not end like that. Once
// aborted (after the session was canceled and returned), a read hands out
// one byte instead of the error: the client sees that its session ended
// and stops without a Close.
type sessionInput struct {
	pr      *io.PipeReader
	aborted atomic.Bool
}

func newSessionInput() (*sessionInput, *io.PipeWriter) {
	pr, pw := io.Pipe()
	return &sessionInput{pr: pr}, pw
}

// abort is called once the session returned: later reads hand out a byte,
// and a client still writing stdin is released.
func (s *sessionInput) abort() {
	s.aborted.Store(true)
	s.pr.CloseWithError(io.ErrClosedPipe)
}

func (s *sessionInput) Read(p []byte) (int, error) {
	n, err := s.pr.Read(p)
	if err != nil && err != io.EOF && s.aborted.Load() && len(p) > 0 {
		p[0] = 0
		return 1, nil
	}
	return n, err
}

func (s *clientStream) loop() error {
	stdinOpen := s.stdin != nil
	for {
		f, err := s.fr.ReadFrame()
		if err != nil {
			return err
		}
		if f.Stream != execstream.StreamID {
			return fmt.Errorf("frame on stream %d", f.Stream)
		}
		switch f.Type {
		case wire.TypeStdin:
			if !stdinOpen {
				return errors.New("stdin data the session does not take")
			}
			// A session that stopped reading its stdin (it ended) is
			// torn down by its own end; until then, drop what it refuses.
			_, _ = s.stdin.Write(f.Payload)
			continue
		case wire.TypeClose, wire.TypeResize, wire.TypeCancel:
		default:
			return fmt.Errorf("unexpected frame type %d from the client", f.Type)
		}
		m, err := wire.Decode(f)
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *wire.Close:
			if m.Stream != "stdin" {
				return fmt.Errorf("close of %s from the client", m.Stream)
			}
			if stdinOpen {
				_ = s.stdin.Close()
				stdinOpen = false
			}
		case *wire.Resize:
			if s.resize == nil {
				continue
			}
			select { // keep only the latest size
			case <-s.resize:
			default:
			}
			s.resize <- *m
		case *wire.Cancel:
			return errors.New("canceled by the client")
		}
	}
}

// finish sends exit, closes the connection and logs the session.
func (a *Agent) finish(ctx context.Context, conn net.Conn, w *execstream.Writer, g *guestRequest, exit wire.Exit, kv ...any) {
	exit.Code = max(-1, min(255, exit.Code))
	exit.Error = client.CleanText(exit.Error, wire.MaxErrorLen)
	if exit.Signal != "" && (&wire.Exit{Signal: exit.Signal}).Validate() != nil {
		exit.Signal = ""
	}
	_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_ = w.Send(&exit)
	_ = conn.Close()
	kv = append(append([]any{"op", g.op}, append(g.user.logValues(), "machine", g.machine())...), kv...)
	kv = append(kv, "exitCode", exit.Code, "duration", time.Since(g.start).Round(time.Millisecond).String())
	if exit.Signal != "" {
		kv = append(kv, "signal", exit.Signal)
	}
	if exit.TimedOut {
		kv = append(kv, "timedOut", true)
	}
	if exit.Error != "" {
		kv = append(kv, "error", exit.Error)
	}
	log.FromContext(ctx).WithName("guest-session").Info("session ended", kv...)
}

// exitOf is how a session that returned err ended.
func exitOf(res client.Result, err error) wire.Exit {
	exit := wire.Exit{Code: res.Code, Signal: res.Signal, TimedOut: res.TimedOut}
	var ee *client.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		exit.Code, exit.Error = ee.Code, ee.Reason
		if exit.Code == 0 {
			exit.Code = 1
		}
	default:
		exit.Code, exit.Error = -1, err.Error()
	}
	return exit
}

// parseExec reads an exec's query; the guest's own limits apply (wire).
func parseExec(r *http.Request) (*wire.Exec, bool, error) {
	q, err := execstream.Params(r)
	if err != nil {
		return nil, false, errors.New("bad parameters")
	}
	req := &wire.Exec{Args: q["command"], Env: q["env"], Dir: q.Get("dir"), TTY: q.Get("tty") == "true"}
	if len(req.Args) == 0 {
		return nil, false, errors.New("command is required")
	}
	num := func(key string, bits int) (uint64, error) {
		text := q.Get(key)
		if text == "" {
			return 0, nil
		}
		n, err := strconv.ParseUint(text, 10, bits)
		if err != nil {
			return 0, fmt.Errorf("%s must be a number of at most %d bits", key, bits)
		}
		return n, nil
	}
	rows, err := num("rows", 16)
	if err != nil {
		return nil, false, err
	}
	cols, err := num("cols", 16)
	if err != nil {
		return nil, false, err
	}
	timeout, err := num("timeout", 32)
	if err != nil {
		return nil, false, err
	}
	if req.TTY {
		req.Rows, req.Cols = uint16(rows), uint16(cols)
	}
	req.TimeoutSeconds = int(timeout)
	if err := req.Validate(); err != nil {
		return nil, false, errors.New(strings.TrimPrefix(err.Error(), "wire: "))
	}
	return req, q.Get("stdin") == "true", nil
}

func (a *Agent) serveExec(w http.ResponseWriter, r *http.Request) {
	g, ok := a.admit(w, r, execMachine, "exec")
	if !ok {
		return
	}
	req, withStdin, err := parseExec(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c, conn, fr, ok := a.openGuestStream(w, r, g)
	if !ok {
		return
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	ended := make(chan struct{})
	cs := &clientStream{fr: fr, cancel: cancel, ended: ended}
	var stdin io.Reader
	if withStdin {
		in, pw := newSessionInput()
		stdin, cs.stdin, cs.input = in, pw, in
	}
	var opts []client.ExecOption
	if req.TTY {
		cs.resize = make(chan wire.Resize, 1)
		opts = append(opts, client.WithResize(cs.resize))
	}
	go func() { _ = cs.run() }()
	out := execstream.NewWriter(conn)
	res, err := c.Exec(ctx, req, stdin, out.DataWriter(wire.TypeStdout), out.DataWriter(wire.TypeStderr), opts...)
	if cs.input != nil {
		cs.input.abort()
	}
	close(ended)
	a.finish(r.Context(), conn, out, g, exitOf(res, err), "command", commandForLog(req.Args), "tty", req.TTY)
}

// commandForLog is a command as one bounded line.
func commandForLog(args []string) string {
	return client.CleanText(strings.Join(args, " "), 1024)
}

// fileRequest reads a file endpoint's path and mode.
func fileRequest(r *http.Request, withMode bool) (*wire.File, error) {
	q, err := execstream.Params(r)
	if err != nil {
		return nil, errors.New("bad parameters")
	}
	f := &wire.File{Path: q.Get("path")}
	if f.Path == "" {
		return nil, errors.New("path is required")
	}
	if text := q.Get("mode"); withMode && text != "" {
		mode, err := strconv.ParseUint(text, 8, 32)
		if err != nil || mode > 0o7777 {
			return nil, errors.New("mode must be octal permission bits such as 0644")
		}
		f.Mode = uint32(mode)
	}
	if err := f.Validate(); err != nil {
		return nil, errors.New(strings.TrimPrefix(err.Error(), "wire: "))
	}
	return f, nil
}

func (a *Agent) serveFileRead(w http.ResponseWriter, r *http.Request) {
	g, ok := a.admit(w, r, execMachine, "read")
	if !ok {
		return
	}
	f, err := fileRequest(r, false)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c, conn, fr, ok := a.openGuestStream(w, r, g)
	if !ok {
		return
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	go func() { _ = (&clientStream{fr: fr, cancel: cancel}).run() }()
	out := execstream.NewWriter(conn)
	n, err := c.ReadFile(ctx, f.Path, out.DataWriter(wire.TypeStdout))
	a.finish(r.Context(), conn, out, g, exitOf(client.Result{}, err), "path", client.CleanText(f.Path, 1024), "bytes", n)
}

func (a *Agent) serveFileWrite(w http.ResponseWriter, r *http.Request) {
	g, ok := a.admit(w, r, execMachine, "write")
	if !ok {
		return
	}
	f, err := fileRequest(r, true)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c, conn, fr, ok := a.openGuestStream(w, r, g)
	if !ok {
		return
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	in, pw := newSessionInput()
	ended := make(chan struct{})
	go func() { _ = (&clientStream{fr: fr, stdin: pw, input: in, ended: ended, cancel: cancel}).run() }()
	out := execstream.NewWriter(conn)
	n, err := c.WriteFile(ctx, f.Path, f.Mode, in)
	in.abort()
	close(ended)
	a.finish(r.Context(), conn, out, g, exitOf(client.Result{}, err), "path", client.CleanText(f.Path, 1024), "mode", fmt.Sprintf("%04o", f.Mode), "bytes", n)
}

func (a *Agent) serveConsoleAttach(w http.ResponseWriter, r *http.Request) {
	g, ok := a.admit(w, r, attachConsole, "attach")
	if !ok {
		return
	}
	if !a.hasInstance(w, r, g) {
		return
	}
	ch, ok := a.opts.Backend.(consoleChannel)
	if !ok {
		http.Error(w, fmt.Sprintf("machine %s runs on the %s backend, whose consoles cannot be attached to (kaironctl logs reads them)", g.machine(), a.opts.Backend.Name()), http.StatusNotImplemented)
		return
	}
	path := ch.ConsoleSocket(instanceID(g.namespace, g.name))
	lock := consoleAttachments.lock(path)
	if !lock.TryLock() {
		http.Error(w, fmt.Sprintf("the console of machine %s is attached by another session", g.machine()), http.StatusConflict)
		return
	}
	defer lock.Unlock()
	dialCtx, cancelDial := context.WithTimeout(r.Context(), guestDialTimeout)
	defer cancelDial()
	serial, err := dialUnix(dialCtx, path)
	if err != nil {
		http.Error(w, fmt.Sprintf("the console of machine %s is not reachable: %v", g.machine(), err), http.StatusServiceUnavailable)
		return
	}
	defer serial.Close()
	conn, fr, err := upgrade(w)
	if err != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	pr, pw := io.Pipe()
	go func() { _ = (&clientStream{fr: fr, stdin: pw, cancel: cancel}).run() }()
	go func() { // typed keys to the serial port
		// The client's stdin ending (Close) leaves it attached, reading,
		// until it leaves; failing to write to the console ends it.
		if _, err := io.Copy(serial, pr); err != nil {
			cancel()
		}
	}()
	go func() {
		<-ctx.Done()
		serial.Close()
	}()
	out := execstream.NewWriter(conn)
	_, err = io.Copy(out.DataWriter(wire.TypeStdout), bufio.NewReaderSize(serial, wire.MaxPayload))
	exit := wire.Exit{}
	if err != nil && ctx.Err() == nil {
		exit = wire.Exit{Code: 1, Error: err.Error()}
	}
	a.finish(r.Context(), conn, out, g, exit)
}

// guestChannels holds one open channel per guest agent socket: the guest
// takes one connection at a time, so every session to a VM shares it
// (the client multiplexes them). A closed channel is dialed again.
var guestChannels = &channelPool{m: map[string]*pooledChannel{}}

type channelPool struct {
	mu sync.Mutex
	m  map[string]*pooledChannel
}

type pooledChannel struct {
	mu sync.Mutex
	c  *client.Client
}

func (p *channelPool) get(ctx context.Context, path string) (*client.Client, error) {
	p.mu.Lock()
	ch := p.m[path]
	if ch == nil {
		ch = &pooledChannel{}
		p.m[path] = ch
	}
	p.mu.Unlock()
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.c != nil {
		select {
		case <-ch.c.Done():
			ch.c = nil
		default:
			return ch.c, nil
		}
	}
	conn, err := dialUnix(ctx, path)
	if err != nil {
		return nil, err
	}
	c, err := client.New(ctx, conn, client.Options{Name: "kairon-node"})
	if err != nil {
		return nil, err
	}
	ch.c = c
	go func() { // forget a VM's channel once it closed
		<-c.Done()
		p.mu.Lock()
		defer p.mu.Unlock()
		ch.mu.Lock()
		defer ch.mu.Unlock()
		if ch.c == c {
			ch.c = nil
			delete(p.m, path)
		}
	}()
	return c, nil
}

// consoleAttachments lets one session at a time type into a console.
var consoleAttachments = &attachLocks{m: map[string]*sync.Mutex{}}

type attachLocks struct {
	mu sync.Mutex
	m  map[string]*sync.Mutex
}

func (l *attachLocks) lock(path string) *sync.Mutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m[path] == nil {
		l.m[path] = &sync.Mutex{}
	}
	return l.m[path]
}

// maxSocketPath is the longest path connect(2) takes for a unix socket
// (sun_path is 108 bytes with its NUL).
const maxSocketPath = 107

// dialUnix connects to the unix socket at path, however long: a VM's
// sockets live in its state directory, whose path (state dir, namespace
// and name) can be longer than a socket address may be. Such a path is
// reached through the directory opened beforehand, as
// /proc/self/fd/N/NAME.
func dialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) <= maxSocketPath {
		return d.DialContext(ctx, "unix", path)
	}
	dir, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: filepath.Dir(path), Err: err}
	}
	defer unix.Close(dir)
	short := fmt.Sprintf("/proc/self/fd/%d/%s", dir, filepath.Base(path))
	if len(short) > maxSocketPath {
		return nil, fmt.Errorf("socket name %q too long", filepath.Base(path))
	}
	return d.DialContext(ctx, "unix", short)
}
