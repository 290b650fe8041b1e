package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// Output streams, as indexes.
const (
	outStdout = 0
	outStderr = 1
)

var outNames = [2]string{"stdout", "stderr"}

// session is one request's state on the host.
type session struct {
	c  *Client
	id uint32

	mu   sync.Mutex
	cond *sync.Cond
	// out holds output received and not yet written; the guest may send
	// allowed more bytes of each stream. spare is the other buffer.
	out, spare [2][]byte
	allowed    [2]int
	// credit is how many bytes of stdin the guest takes.
	credit      int
	stdinClosed bool
	resp        *wire.Response
	exit        *wire.Exit
	err         error
	ended       bool
	endCh       chan struct{}
}

func newSession(c *Client, id uint32) *session {
	s := &session{c: c, id: id, allowed: [2]int{wire.InitialWindow, wire.InitialWindow}, credit: wire.InitialWindow, endCh: make(chan struct{})}
	s.cond = sync.NewCond(&s.mu)
	return s
}

// deliver takes output from the reader: within the window, or refused.
func (s *session) deliver(idx int, p []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.exit != nil {
		return fmt.Errorf("stream %d: %s after Exit", s.id, outNames[idx])
	}
	if len(p) > s.allowed[idx] {
		return fmt.Errorf("stream %d: %d bytes of %s past the window (%d left)", s.id, len(p), outNames[idx], s.allowed[idx])
	}
	s.allowed[idx] -= len(p)
	s.out[idx] = append(s.out[idx], p...)
	s.cond.Broadcast()
	return nil
}

func (s *session) control(m any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch m := m.(type) {
	case *wire.Response:
		if s.resp != nil || s.exit != nil {
			return fmt.Errorf("stream %d: a response out of place", s.id)
		}
		s.resp = m
		if !m.OK {
			s.endLocked(nil)
			go s.c.forget(s)
		}
	case *wire.Exit:
		if s.exit != nil {
			return fmt.Errorf("stream %d: a second Exit", s.id)
		}
		s.exit = m
		s.endLocked(nil)
		go s.c.forget(s)
	case *wire.Close:
		if m.Stream == "stdin" {
			s.stdinClosed = true
			s.cond.Broadcast()
		}
	case *wire.Window:
		if m.Stream != "stdin" {
			return fmt.Errorf("stream %d: the guest granted a %s window", s.id, m.Stream)
		}
		if s.credit > 1<<30 {
			return fmt.Errorf("stream %d: stdin window past 1 GiB", s.id)
		}
		s.credit += m.Bytes
		s.cond.Broadcast()
	default:
		return fmt.Errorf("stream %d: %T from the guest", s.id, m)
	}
	return nil
}

func (s *session) endLocked(err error) {
	if s.ended {
		return
	}
	s.ended, s.err = true, err
	close(s.endCh)
	s.cond.Broadcast()
}

// finish ends the session for err (the channel failed, or the caller gave
// up).
func (s *session) finish(err error) {
	s.mu.Lock()
	s.endLocked(err)
	s.mu.Unlock()
}

// drain writes the output of idx to w as it arrives and grants it again
// once written, until the session ended and its output is all written. A
// failing w is replaced by io.Discard, so the guest is never left waiting;
// its error is returned.
func (s *session) drain(idx int, w io.Writer) error {
	var werr error
	for {
		s.mu.Lock()
		for len(s.out[idx]) == 0 && !s.ended {
			s.cond.Wait()
		}
		buf := s.out[idx]
		if len(buf) == 0 {
			s.mu.Unlock()
			return werr
		}
		s.out[idx], s.spare[idx] = s.spare[idx][:0], nil
		s.mu.Unlock()

		if werr == nil {
			if _, err := w.Write(buf); err != nil {
				werr = err
			}
		}
		n := len(buf)
		s.mu.Lock()
		s.spare[idx] = buf[:0]
		grant := !s.ended
		if grant {
			s.allowed[idx] += n
		}
		s.mu.Unlock()
		if grant {
			_ = s.c.send(s.id, &wire.Window{Stream: outNames[idx], Bytes: n})
		}
	}
}

// feed sends r as stdin within the guest's window, then Close. nil r sends
// Close at once. It stops early when the session ends.
func (s *session) feed(r io.Reader) (int64, error) {
	var total int64
	if r != nil {
		buf := make([]byte, wire.MaxPayload)
		for {
			s.mu.Lock()
			for s.credit == 0 && !s.ended && !s.stdinClosed {
				s.cond.Wait()
			}
			if s.ended || s.stdinClosed {
				s.mu.Unlock()
				return total, nil
			}
			n := min(s.credit, wire.MaxPayload)
			s.mu.Unlock()

			k, err := r.Read(buf[:n])
			if k > 0 {
				s.mu.Lock()
				if s.ended {
					s.mu.Unlock()
					return total, nil
				}
				s.credit -= k
				s.mu.Unlock()
				if werr := s.c.write(wire.Frame{Type: wire.TypeStdin, Stream: s.id, Payload: buf[:k]}); werr != nil {
					return total, werr
				}
				total += int64(k)
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				// Not Close: an end of input would let a file write that
				// lost its source put half a file in place. Cancel ends
				// the session without its result.
				_ = s.c.send(s.id, &wire.Cancel{Signal: "KILL"})
				return total, err
			}
		}
	}
	return total, s.c.send(s.id, &wire.Close{Stream: "stdin"})
}

// wait waits for the session's end, or ctx's: then the guest is told to
// kill it, and the session is dropped.
func (s *session) wait(ctx context.Context) (*wire.Exit, error) {
	select {
	case <-s.endCh:
	case <-ctx.Done():
		s.finish(ctx.Err())
		s.c.forget(s)
		go func() { _ = s.c.send(s.id, &wire.Cancel{Signal: "KILL"}) }()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	if s.resp != nil && !s.resp.OK {
		return nil, fmt.Errorf("guestagent: the guest refused: %s", CleanText(s.resp.Error, wire.MaxErrorLen))
	}
	return s.exit, nil
}

// Result is how a command ended.
type Result struct {
	// Code is the exit status; -1 when killed by Signal.
	Code     int
	Signal   string
	TimedOut bool
}

// ExitError is a session that failed outside the program (a program not
// found, a file that cannot be opened), with the guest's reason.
type ExitError struct {
	Code   int
	Reason string // untrusted text, cleaned
}

func (e *ExitError) Error() string { return "guestagent: in the guest: " + e.Reason }

func exitError(e *wire.Exit) error {
	if e.Error == "" {
		return nil
	}
	return &ExitError{Code: e.Code, Reason: CleanText(e.Error, wire.MaxErrorLen)}
}

// ExecOption adds to an Exec.
type ExecOption func(*execOpts)

type execOpts struct{ resize <-chan wire.Resize }

// WithResize sends each window size from ch to a TTY session.
func WithResize(ch <-chan wire.Resize) ExecOption { return func(o *execOpts) { o.resize = ch } }

// Exec runs req in the guest with stdin (nil: none) and copies its output
// to stdout and stderr (nil: dropped) until it ends. The error is for what
// went wrong outside the program: the channel, the guest refusing, ctx
// ending (the program is then killed), an *ExitError, or a writer's error.
// Exec may return before stdin was read to its end; it reads no more of it
// after its current Read returns.
func (c *Client) Exec(ctx context.Context, req *wire.Exec, stdin io.Reader, stdout, stderr io.Writer, options ...ExecOption) (Result, error) {
	var o execOpts
	for _, opt := range options {
		opt(&o)
	}
	s, err := c.open(&wire.Request{Op: wire.OpExec, Exec: req})
	if err != nil {
		return Result{}, err
	}
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	var wg sync.WaitGroup
	var werrs [2]error
	for i, w := range []io.Writer{stdout, stderr} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			werrs[i] = s.drain(i, w)
		}()
	}
	go func() { _, _ = s.feed(stdin) }()
	if o.resize != nil {
		go func() {
			for {
				select {
				case <-s.endCh:
					return
				case r, ok := <-o.resize:
					if !ok {
						return
					}
					_ = c.send(s.id, &r)
				}
			}
		}()
	}
	exit, err := s.wait(ctx)
	wg.Wait()
	if err != nil {
		return Result{}, err
	}
	res := Result{Code: exit.Code, Signal: exit.Signal, TimedOut: exit.TimedOut}
	if err := exitError(exit); err != nil {
		return res, err
	}
	return res, errors.Join(werrs[0], werrs[1])
}

// ReadFile copies the guest's file at path (absolute) to w.
func (c *Client) ReadFile(ctx context.Context, path string, w io.Writer) (int64, error) {
	s, err := c.open(&wire.Request{Op: wire.OpReadFile, File: &wire.File{Path: path}})
	if err != nil {
		return 0, err
	}
	cw := &countingWriter{w: w}
	drained := make(chan error, 1)
	go func() { drained <- s.drain(outStdout, cw) }()
	exit, err := s.wait(ctx)
	werr := <-drained
	if err != nil {
		return cw.n, err
	}
	if err := exitError(exit); err != nil {
		return cw.n, err
	}
	if exit.Code != 0 {
		return cw.n, fmt.Errorf("guestagent: reading %s ended with code %d", path, exit.Code)
	}
	return cw.n, werr
}

// WriteFile writes r to the guest's file at path (absolute) with mode's
// permission bits (0: 0644). The guest writes a temporary file and renames
// it into place once all of r arrived.
func (c *Client) WriteFile(ctx context.Context, path string, mode uint32, r io.Reader) (int64, error) {
	s, err := c.open(&wire.Request{Op: wire.OpWriteFile, File: &wire.File{Path: path, Mode: mode}})
	if err != nil {
		return 0, err
	}
	type fed struct {
		n   int64
		err error
	}
	done := make(chan fed, 1)
	go func() {
		n, err := s.feed(r)
		done <- fed{n, err}
	}()
	exit, err := s.wait(ctx)
	if err != nil {
		return 0, err
	}
	if err := exitError(exit); err != nil {
		return 0, err
	}
	// The guest answers only after Close, so feeding has ended.
	f := <-done
	if f.err != nil {
		return f.n, f.err
	}
	if exit.Code != 0 {
		return f.n, fmt.Errorf("guestagent: writing %s ended with code %d", path, exit.Code)
	}
	return f.n, nil
}

// Ping asks the agent whether it is there.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.Status(ctx)
	return err
}

// Status pings the agent and returns what it reports of the guest: its
// boot nonce, whether the guest's init finished, and in an image guest
// what became of the image's main process (Main, nil without one or from
// an agent older than it; validated by wire, so its text is safe to show).
// An agent too old to report any of it answers with a zero Status.
func (c *Client) Status(ctx context.Context) (wire.Status, error) {
	exit, err := c.simpleExit(ctx, &wire.Request{Op: wire.OpPing})
	if err != nil || exit.Status == nil {
		return wire.Status{}, err
	}
	return *exit.Status, nil
}

// Configure sets the guest's hostname, addresses, gateway and DNS servers
// and mixes a seed into its entropy pool.
func (c *Client) Configure(ctx context.Context, cfg *wire.Configure) error {
	return c.simple(ctx, &wire.Request{Op: wire.OpConfigure, Configure: cfg})
}

func (c *Client) simple(ctx context.Context, req *wire.Request) error {
	_, err := c.simpleExit(ctx, req)
	return err
}

// simpleExit runs a session that carries no data and returns its Exit,
// which must report success.
func (c *Client) simpleExit(ctx context.Context, req *wire.Request) (*wire.Exit, error) {
	s, err := c.open(req)
	if err != nil {
		return nil, err
	}
	exit, err := s.wait(ctx)
	if err != nil {
		return nil, err
	}
	if err := exitError(exit); err != nil {
		return nil, err
	}
	if exit.Code != 0 {
		return nil, fmt.Errorf("guestagent: %s ended with code %d", req.Op, exit.Code)
	}
	return exit, nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (cw *countingWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.n += int64(n)
	return n, err
}
