package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"

	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// Options configure an Agent.
type Options struct {
	// Name is what Hello names this agent as.
	Name string
	// Log receives what the agent does; nil discards it.
	Log *slog.Logger
	// Configure applies a configure request; nil: the guest's own network
	// and RNG (System).
	Configure func(*wire.Configure) error
	// Env is the base environment of commands; nil: DefaultEnv.
	Env []string
	// Boot is the boot nonce a ping reports until a configure request
	// replaces it (the kernel command line's kairon.boot in a guest).
	Boot string
	// ReadyFile is the file whose presence makes a ping report the guest
	// ready (the guest's init creates it once its services run); empty:
	// ready as soon as the agent serves.
	ReadyFile string
	// Image, if set, is the image the guest booted (an image guest):
	// commands run in it and files are read and written in it
	// (image.go). Nil: the default guest, whose commands run in the
	// initramfs with Env.
	Image *Image
	// MainStateFile is where RunMain records the image's main process,
	// which every ping reports; empty: no main process.
	MainStateFile string
}

// DefaultEnv is the base environment of a command.
var DefaultEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "TERM=xterm"}

// Agent serves the protocol; one connection at a time.
type Agent struct {
	opts Options
	log  *slog.Logger
	// wmu serializes writes across connections too: a write of a
	// connection that ended may still be blocked on the port (it blocks
	// while no host is connected) and must finish whole before the next
	// connection's Hello, or the host would read a frame cut in two.
	wmu  sync.Mutex
	wbuf []byte

	boot atomic.Pointer[string]

	// configuring serializes configure requests. A host that reconnects
	// (a second Hello) sends its configure again while the first may still
	// run; two at once race each other's address flush and add, and one
	// fails with a guest left half configured.
	configuring sync.Mutex
}

// New returns an Agent.
func New(opts Options) *Agent {
	if opts.Name == "" {
		opts.Name = "kairon-guest-agent"
	}
	if opts.Configure == nil {
		opts.Configure = System{}.Configure
	}
	if opts.Env == nil {
		opts.Env = DefaultEnv
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Agent{opts: opts, log: log}
	a.boot.Store(&opts.Boot)
	return a
}

// status is what a ping reports.
func (a *Agent) status() *wire.Status {
	st := &wire.Status{Boot: *a.boot.Load(), Ready: true}
	if a.opts.ReadyFile != "" {
		_, err := os.Stat(a.opts.ReadyFile)
		st.Ready = err == nil
	}
	if a.opts.MainStateFile != "" {
		st.Main = readMainState(a.opts.MainStateFile)
	}
	return st
}

// configure applies c, and takes its boot nonce even if a part of the rest
// failed: the guest is the clone the host names either way.
func (a *Agent) configure(c *wire.Configure) error {
	a.configuring.Lock()
	defer a.configuring.Unlock()
	if c.Boot != "" {
		boot := c.Boot
		a.boot.Store(&boot)
	}
	return a.opts.Configure(c)
}

// ErrProtocol is returned by Serve when the host broke the protocol; the
// channel is out of step until the host reconnects.
var ErrProtocol = errors.New("agent: protocol violation")

// Serve serves one connection on rw until reading fails: io.EOF when the
// host hung up between frames. Every session is ended (its program killed)
// before Serve returns.
func (a *Agent) Serve(rw io.ReadWriter) error {
	c := &conn{a: a, w: rw, sessions: map[uint32]*session{}}
	defer func() { c.shutdown() }()
	rd := wire.NewReader(rw)
	for {
		f, err := rd.ReadFrame()
		if err != nil {
			return err
		}
		if f.Type == wire.TypeHello && c.hello {
			// A second Hello: the host starts over (it hung up and another
			// connected without the port reading EOF in between). The old
			// sessions end, and nothing of theirs is sent from now on: it
			// would reach the new connection after its Hello, where their
			// streams may be the new sessions'.
			c.shutdown()
			c = &conn{a: a, w: rw, sessions: map[uint32]*session{}}
		}
		if err := c.handle(f); err != nil {
			a.log.Warn("host broke the protocol; dropping the connection's sessions", "err", err)
			return fmt.Errorf("%w: %v", ErrProtocol, err)
		}
	}
}

// conn is one connection's state.
type conn struct {
	a     *Agent
	w     io.Writer
	dead  atomic.Bool // a write failed or the connection ended
	hello bool

	mu       sync.Mutex
	sessions map[uint32]*session
}

// send writes m as a control frame on stream.
func (c *conn) send(stream uint32, m any) error {
	f, err := wire.Encode(stream, m)
	if err != nil {
		return err
	}
	return c.write(f)
}

func (c *conn) write(f wire.Frame) error {
	a := c.a
	a.wmu.Lock()
	defer a.wmu.Unlock()
	if c.dead.Load() {
		return io.ErrClosedPipe
	}
	var err error
	if a.wbuf, err = wire.AppendFrame(a.wbuf[:0], f); err != nil {
		return err
	}
	if _, err := c.w.Write(a.wbuf); err != nil {
		c.dead.Store(true)
		return err
	}
	return nil
}

func (c *conn) handle(f wire.Frame) error {
	if f.Type == wire.TypeHello {
		m, err := wire.Decode(f)
		if err != nil {
			return err
		}
		h := m.(*wire.Hello)
		c.hello = true
		v, _ := h.Shared()
		c.a.log.Debug("host connected", "host", h.Agent, "version", v)
		return c.send(0, &wire.Hello{Versions: []int{wire.Version}, Agent: c.a.opts.Name})
	}
	if !c.hello {
		// Left from the host's last connection (an agent started
		// again finds them in the port): a connection starts at Hello.
		return nil
	}
	if f.Type == wire.TypeRequest {
		c.mu.Lock()
		_, busy := c.sessions[f.Stream]
		c.mu.Unlock()
		if busy {
			return fmt.Errorf("request on stream %d, which is in use", f.Stream)
		}
		m, err := wire.Decode(f)
		if err != nil {
			return c.send(f.Stream, &wire.Response{Error: clip(err.Error())})
		}
		c.start(f.Stream, m.(*wire.Request))
		return nil
	}
	c.mu.Lock()
	s := c.sessions[f.Stream]
	c.mu.Unlock()
	switch f.Type {
	case wire.TypeStdin:
		if s == nil {
			return nil // a session that ended meanwhile
		}
		return s.stdinData(f.Payload)
	case wire.TypeClose, wire.TypeResize, wire.TypeCancel, wire.TypeWindow:
		m, err := wire.Decode(f)
		if err != nil {
			return err
		}
		if s == nil {
			return nil
		}
		return s.control(m)
	}
	return fmt.Errorf("%s frame from the host", f.Type)
}

// start runs a request's session in its own goroutine.
func (c *conn) start(id uint32, req *wire.Request) {
	s := newSession(c, id)
	c.mu.Lock()
	c.sessions[id] = s
	c.mu.Unlock()
	go func() {
		defer func() {
			c.mu.Lock()
			if c.sessions[id] == s {
				delete(c.sessions, id)
			}
			c.mu.Unlock()
			s.end()
		}()
		s.run(req)
	}()
}

func (c *conn) endSessions() {
	c.mu.Lock()
	all := c.sessions
	c.sessions = map[uint32]*session{}
	c.mu.Unlock()
	for _, s := range all {
		s.abort()
	}
}

// shutdown ends the connection. A write blocked on a host that hung up
// finishes (or fails) by itself; nothing waits for it.
func (c *conn) shutdown() {
	c.dead.Store(true)
	c.endSessions()
}

// helloPrefix is how every connection starts: the header of a Hello frame
// (magic, version, type, stream 0).
var helloPrefix = []byte{'K', 'G', wire.Version, byte(wire.TypeHello), 0, 0, 0, 0}

// Resync skips what r holds up to the next Hello header, which every
// connection starts with: after a broken frame, the agent serves again from
// the host's next connection (or from its next Hello). At the end of what
// the host sent it drops a partial header and returns io.EOF.
func Resync(r *bufio.Reader) error {
	for {
		b, err := r.Peek(len(helloPrefix))
		if err != nil {
			_, _ = r.Discard(r.Buffered())
			return err
		}
		if bytes.Equal(b, helloPrefix) {
			return nil
		}
		if i := bytes.IndexByte(b[1:], 'K'); i >= 0 {
			_, _ = r.Discard(i + 1)
		} else {
			_, _ = r.Discard(len(b))
		}
	}
}

// clip bounds an error message to what wire allows.
func clip(s string) string {
	if len(s) > wire.MaxErrorLen {
		return s[:wire.MaxErrorLen]
	}
	return s
}
