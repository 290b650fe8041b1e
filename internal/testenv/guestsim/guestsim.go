package guestsim

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/guestagent/agent"
	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// Backend is a sim.Backend with AgentSocket and ConsoleSocket, as the qemu
// backend has them.
type Backend struct {
	*sim.Backend
	dir string
	t   testing.TB

	mu     sync.Mutex
	guests map[string]*Guest
	// silent: guests' agents take connections but never answer, as a hung
	// agent does.
	silent atomic.Bool
}

// SetAgentsSilent makes every guest's agent hang (true: connections are
// taken, nothing is answered) or answer again (false). A connection taken
// while silent stays unanswered; the node drops it and dials again.
func (b *Backend) SetAgentsSilent(silent bool) { b.silent.Store(silent) }

// Guest is one VM's in-process guest agent and interactive console.
type Guest struct {
	// AgentPath and ConsolePath are the sockets.
	AgentPath, ConsolePath string
	agentLn, consoleLn     net.Listener
	connections            atomic.Int64
	requests               atomic.Int64
	silent                 *atomic.Bool
}

// Connections is how many times the node connected to the guest agent
// (its pings of a Running Machine's agent count).
func (g *Guest) Connections() int64 { return g.connections.Load() }

// Requests is how many sessions other than pings the node asked the guest
// agent for.
func (g *Guest) Requests() int64 { return g.requests.Load() }

// New wraps b; sockets live in a short directory removed with t.
func New(t testing.TB, b *sim.Backend) *Backend {
	dir, err := os.MkdirTemp("", "gs") // unix socket paths are short
	if err != nil {
		t.Fatal(err)
	}
	gb := &Backend{Backend: b, dir: dir, t: t, guests: map[string]*Guest{}}
	t.Cleanup(func() {
		gb.mu.Lock()
		defer gb.mu.Unlock()
		for _, g := range gb.guests {
			g.agentLn.Close()
			g.consoleLn.Close()
		}
		os.RemoveAll(dir)
	})
	return gb
}

// Guest is id's guest, started on first use.
func (b *Backend) Guest(id string) *Guest {
	b.mu.Lock()
	defer b.mu.Unlock()
	if g := b.guests[id]; g != nil {
		return g
	}
	sum := sha256.Sum256([]byte(id))
	base := filepath.Join(b.dir, hex.EncodeToString(sum[:6]))
	g := &Guest{AgentPath: base + ".agent", ConsolePath: base + ".console", silent: &b.silent}
	var err error
	if g.agentLn, err = net.Listen("unix", g.AgentPath); err != nil {
		b.t.Errorf("guest %s: %v", id, err)
		return g
	}
	if g.consoleLn, err = net.Listen("unix", g.ConsolePath); err != nil {
		b.t.Errorf("guest %s: %v", id, err)
		return g
	}
	b.guests[id] = g
	go g.serveAgent()
	go g.serveConsole()
	return g
}

// AgentSocket implements what kairon-node asks of a qemu backend.
func (b *Backend) AgentSocket(id string) string { return b.Guest(id).AgentPath }

// ConsoleSocket implements what kairon-node asks of a qemu backend.
func (b *Backend) ConsoleSocket(id string) string { return b.Guest(id).ConsolePath }

// serveAgent serves the guest agent, one connection at a time as the
// virtio-serial port does.
func (g *Guest) serveAgent() {
	for {
		conn, err := g.agentLn.Accept()
		if err != nil {
			return
		}
		g.connections.Add(1)
		if g.silent.Load() {
			go func() { // read and drop everything, answer nothing
				_, _ = io.Copy(io.Discard, conn)
				conn.Close()
			}()
			continue
		}
		a := agent.New(agent.Options{Name: "kairon-guest-agent/guestsim", Configure: func(*wire.Configure) error { return nil }})
		_ = a.Serve(countingConn{Conn: conn, g: g, fr: newFrameCounter()})
		conn.Close()
	}
}

// serveConsole is a serial console whose shell answers each line typed
// with "echo: " and the line.
func (g *Guest) serveConsole() {
	for {
		conn, err := g.consoleLn.Accept()
		if err != nil {
			return
		}
		_, _ = io.WriteString(conn, "guestsim login: ")
		buf := make([]byte, 4096)
		var line []byte
		for {
			n, err := conn.Read(buf)
			for _, c := range buf[:n] {
				if c == '\r' || c == '\n' {
					_, _ = io.WriteString(conn, "\r\necho: "+string(line)+"\r\n")
					line = line[:0]
				} else {
					line = append(line, c)
				}
			}
			if err != nil {
				break
			}
		}
		conn.Close()
	}
}

// countingConn counts the Request frames the agent reads.
type countingConn struct {
	net.Conn
	g  *Guest
	fr *frameCounter
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.fr.feed(p[:n], &c.g.requests)
	return n, err
}

// frameCounter follows the frame boundaries of a byte stream (12-byte
// headers, big-endian length at 8..12) and counts the Request frames of
// sessions other than pings (the node pings every Running Machine's agent
// each tick; what tests count is what a user asked for).
type frameCounter struct {
	header  []byte
	payload uint32
	request []byte // the payload of the Request frame being read
	inReq   bool
}

func newFrameCounter() *frameCounter { return &frameCounter{} }

func (f *frameCounter) feed(p []byte, requests *atomic.Int64) {
	for len(p) > 0 {
		if f.payload > 0 {
			k := min(uint32(len(p)), f.payload)
			if f.inReq {
				f.request = append(f.request, p[:k]...)
			}
			f.payload -= k
			p = p[k:]
			if f.payload == 0 && f.inReq {
				f.countRequest(requests)
			}
			continue
		}
		need := 12 - len(f.header)
		k := min(need, len(p))
		f.header = append(f.header, p[:k]...)
		p = p[k:]
		if len(f.header) == 12 {
			f.inReq = wire.Type(f.header[3]) == wire.TypeRequest
			f.request = f.request[:0]
			f.payload = uint32(f.header[8])<<24 | uint32(f.header[9])<<16 | uint32(f.header[10])<<8 | uint32(f.header[11])
			f.header = f.header[:0]
			if f.payload == 0 && f.inReq {
				f.countRequest(requests)
			}
		}
	}
}

func (f *frameCounter) countRequest(requests *atomic.Int64) {
	f.inReq = false
	var req struct {
		Op string `json:"op"`
	}
	if json.Unmarshal(f.request, &req) != nil || req.Op != wire.OpPing {
		requests.Add(1)
	}
}
