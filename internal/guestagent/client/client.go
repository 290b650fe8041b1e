package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// Limits of one Client.
const (
	// MaxSessions bounds the sessions open at once on one channel.
	MaxSessions = 64
	// maxFramesBeforeHello bounds what Dial skips while waiting for the
	// guest's Hello: frames a previous connection's sessions left behind.
	maxFramesBeforeHello = 1024
	// DefaultWriteTimeout bounds one write to the guest.
	DefaultWriteTimeout = 30 * time.Second
)

// Errors.
var (
	// ErrClosed: the channel is closed (Close, or a failure before).
	ErrClosed = errors.New("guestagent: channel closed")
	// ErrProtocol: the guest broke the protocol; the channel was closed.
	ErrProtocol = errors.New("guestagent: the guest broke the protocol")
	// ErrTooManySessions: MaxSessions are open.
	ErrTooManySessions = errors.New("guestagent: too many sessions open")
)

// Options tune a Client.
type Options struct {
	// Name is what Hello names this side as.
	Name string
	// WriteTimeout bounds one write to the guest (0: DefaultWriteTimeout);
	// a guest that does not read its channel that long is broken.
	WriteTimeout time.Duration
}

// Client is one open channel to a guest agent.
type Client struct {
	conn         net.Conn
	writeTimeout time.Duration
	agent        string

	wmu  sync.Mutex
	wbuf []byte

	mu       sync.Mutex
	sessions map[uint32]*session
	next     uint32
	err      error // why the channel closed
	done     chan struct{}
}

// Dial connects to the agent socket at path (a VM's AgentSocket) and says
// Hello. It returns once the guest agent answered, or ctx ends.
func Dial(ctx context.Context, path string, opts Options) (*Client, error) {
	addr := path
	if len(path) >= maxSunPath {
		// Past what sun_path holds (108 bytes, with its NUL): through
		// the directory's descriptor, as the QEMU backend reaches QMP.
		dir, err := os.Open(filepath.Dir(path))
		if err != nil {
			return nil, err
		}
		defer dir.Close()
		addr = fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		return nil, err
	}
	return New(ctx, conn, opts)
}

// firstStream is where a Client's stream numbers start (the first session
// gets the next one): far from 1, where every other connection starts.
func firstStream() uint32 { return 1<<16 + rand.Uint32N(1<<31) }

// maxSunPath is the longest socket path Dial connects to by name; a VM's
// state directory can make agent.sock's longer (a long namespace and
// Machine name under a long state directory).
const maxSunPath = 100

// New says Hello on conn and returns the Client over it; it owns conn from
// then on (and closes it if it fails).
func New(ctx context.Context, conn net.Conn, opts Options) (_ *Client, err error) {
	defer func() {
		if err != nil {
			conn.Close()
		}
	}()
	if opts.Name == "" {
		opts.Name = "kairon-node"
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = DefaultWriteTimeout
	}
	c := &Client{conn: conn, writeTimeout: opts.WriteTimeout, sessions: map[uint32]*session{}, done: make(chan struct{}),
		// Streams are numbered from a random start: the agent's port
		// outlives connections, and frames an earlier connection's
		// sessions left in it, either way, must not match this one's.
		next: firstStream()}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	rd, err := c.hello(opts.Name)
	if !stop() {
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	_ = conn.SetDeadline(time.Time{})
	go c.read(rd)
	return c, nil
}

func (c *Client) hello(name string) (*wire.Reader, error) {
	if err := c.send(0, &wire.Hello{Versions: []int{wire.Version}, Agent: name}); err != nil {
		return nil, err
	}
	rd := wire.NewReader(c.conn)
	for range maxFramesBeforeHello {
		f, err := rd.ReadFrame()
		if err != nil {
			return nil, fmt.Errorf("guestagent: waiting for the guest's hello: %w", err)
		}
		if f.Type != wire.TypeHello {
			continue // left from an earlier connection's sessions
		}
		m, err := wire.Decode(f)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrProtocol, err)
		}
		h := m.(*wire.Hello)
		if _, ok := h.Shared(); !ok {
			return nil, fmt.Errorf("guestagent: the guest speaks versions %v, this side %d", h.Versions, wire.Version)
		}
		c.agent = CleanText(h.Agent, wire.MaxAgentLen)
		return rd, nil
	}
	return nil, fmt.Errorf("%w: no hello in %d frames", ErrProtocol, maxFramesBeforeHello)
}

// Agent is the name and version the guest agent gave (untrusted text,
// cleaned).
func (c *Client) Agent() string { return c.agent }

// Done is closed once the channel is closed; Err says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the channel closed, or nil while it is open.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the channel and fails its sessions.
func (c *Client) Close() error {
	c.fail(ErrClosed)
	return nil
}

// fail closes the channel for err (the first reason sticks).
func (c *Client) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	all := c.sessions
	c.sessions = map[uint32]*session{}
	close(c.done)
	c.mu.Unlock()
	_ = c.conn.Close()
	for _, s := range all {
		s.finish(err)
	}
}

// send writes a control message.
func (c *Client) send(stream uint32, m any) error {
	f, err := wire.Encode(stream, m)
	if err != nil {
		return err
	}
	return c.write(f)
}

// write writes one frame within WriteTimeout; a failed or cut write leaves
// the channel out of step, so it closes it.
func (c *Client) write(f wire.Frame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.done:
		return c.Err()
	default:
	}
	var err error
	if c.wbuf, err = wire.AppendFrame(c.wbuf[:0], f); err != nil {
		return err
	}
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	if _, err := c.conn.Write(c.wbuf); err != nil {
		err = fmt.Errorf("guestagent: writing to the guest: %w", err)
		c.fail(err)
		return err
	}
	if cap(c.wbuf) > 2*wire.MaxPayload {
		c.wbuf = nil
	}
	return nil
}

// read is the only reader of the channel. It never blocks on a session.
func (c *Client) read(rd *wire.Reader) {
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				c.fail(fmt.Errorf("%w: %v", ErrClosed, err))
			} else {
				c.fail(fmt.Errorf("%w: %v", ErrProtocol, err))
			}
			return
		}
		if err := c.dispatch(f); err != nil {
			c.fail(fmt.Errorf("%w: %v", ErrProtocol, err))
			return
		}
	}
}

func (c *Client) dispatch(f wire.Frame) error {
	switch f.Type {
	case wire.TypeStdout, wire.TypeStderr, wire.TypeResponse, wire.TypeExit, wire.TypeClose, wire.TypeWindow:
	case wire.TypeHello:
		// The agent answers every Hello its port reads, those of earlier
		// connections included: the one this side took may have been an
		// earlier connection's, and this one's comes later. It starts
		// nothing and names no stream.
		return nil
	default:
		return fmt.Errorf("a %s frame from the guest", f.Type)
	}
	c.mu.Lock()
	s := c.sessions[f.Stream]
	c.mu.Unlock()
	if f.Type.IsData() {
		if s == nil {
			// A session this side gave up on; its data was never granted
			// again, so there is little of it.
			return nil
		}
		idx := outStdout
		if f.Type == wire.TypeStderr {
			idx = outStderr
		}
		return s.deliver(idx, f.Payload)
	}
	m, err := wire.Decode(f)
	if err != nil {
		return err
	}
	if s == nil {
		return nil
	}
	return s.control(m)
}

// open starts a session: registers it, then sends its Request.
func (c *Client) open(req *wire.Request) (*session, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	if len(c.sessions) >= MaxSessions {
		c.mu.Unlock()
		return nil, ErrTooManySessions
	}
	c.next++
	if c.next == 0 {
		c.next = 1
	}
	s := newSession(c, c.next)
	c.sessions[s.id] = s
	c.mu.Unlock()
	if err := c.send(s.id, req); err != nil {
		c.forget(s)
		return nil, err
	}
	return s, nil
}

// forget drops s from the channel: later frames on its stream are ignored.
func (c *Client) forget(s *session) {
	c.mu.Lock()
	if c.sessions[s.id] == s {
		delete(c.sessions, s.id)
	}
	c.mu.Unlock()
}

// CleanText makes text from the guest safe for a log or an API object: at
// most max bytes, without control characters or invalid UTF-8.
func CleanText(s string, max int) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == '\u2028' || r == '\u2029' {
			return ' '
		}
		return r
	}, s)
	if len(s) > max {
		s = s[:max]
		s = strings.ToValidUTF8(s, "")
	}
	return s
}
