package qemu

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

// A VM's state directory, StateDir/<id>/: the files in it, their paths, and
// how they are read and written.

// The files in a VM's state directory.
const (
	// specFile is what was started, when, with which acceleration, its PID.
	specFile = "spec.json"
	// pidFile is QEMU's own pidfile.
	pidFile = "qemu.pid"
	// qmpSock is the QMP (control) socket.
	qmpSock = "qmp.sock"
	// consoleSock is the serial console, interactive (one client at a time).
	consoleSock = "console.sock"
	// agentSock is the guest agent's virtio-serial port (kairon.agent).
	agentSock = "agent.sock"
	// consoleLogFile is everything the serial console printed.
	consoleLogFile = "console.log"
	// qemuLogFile is QEMU's stdout and stderr.
	qemuLogFile = "qemu.log"
	// readyFile is written once the guest is ready (ready.go).
	readyFile = "ready.json"
	// pausedFile is present while the VM is paused through the backend.
	pausedFile = "paused"
	// exitFile is how the process ended, when this agent saw it end.
	exitFile = "exit.json"
)

// dir is the VM's state directory.
func (b *Backend) dir(id string) string { return filepath.Join(b.opts.StateDir, id) }

// ConsoleLog implements backend.Backend.
func (b *Backend) ConsoleLog(id string) string {
	return filepath.Join(b.opts.StateDir, id, consoleLogFile)
}

// ConsoleSocket is the unix socket of the VM's interactive serial console.
func (b *Backend) ConsoleSocket(id string) string {
	return filepath.Join(b.opts.StateDir, id, consoleSock)
}

// AgentSocket is the unix socket of the VM's guest agent channel: the
// virtio-serial port kairon.agent, spoken to with package
// guestagent/client. One client at a time; a VM restored from a state
// saved before the channel existed has none.
func (b *Backend) AgentSocket(id string) string {
	return filepath.Join(b.opts.StateDir, id, agentSock)
}

// QMPSocket is the VM's QMP socket.
func (b *Backend) QMPSocket(id string) string {
	return filepath.Join(b.opts.StateDir, id, qmpSock)
}

// meta is spec.json.
type meta struct {
	Spec         backend.Spec `json:"spec"`
	Acceleration string       `json:"acceleration"`
	StartedAt    time.Time    `json:"startedAt"`
	PID          int          `json:"pid,omitempty"`
	// RestoredFrom is the state file a restored VM was loaded from, or
	// "live migration".
	RestoredFrom string `json:"restoredFrom,omitempty"`
	// RestoredReady: the saved guest had been ready, so the restored VM is
	// Running as soon as it runs.
	RestoredReady bool `json:"restoredReady,omitempty"`
	// AgentPort: the VM has the guest agent's virtio-serial port. Every VM
	// started since it exists does; one restored keeps what it was saved
	// with, since QEMU loads a state only into the same devices.
	AgentPort bool `json:"agentPort,omitempty"`
	// BootNonce is the nonce this boot of the guest was given (kernel
	// command line kairon.boot); with AgentPort the guest is ready once its
	// agent reports it ready with this nonce. A restored or migrated VM
	// keeps the saved guest's.
	BootNonce string `json:"bootNonce,omitempty"`
	// Clone: restored from another VM's saved state by RestoreClone, with
	// a new BootNonce the guest got through its agent's configure.
	Clone bool `json:"clone,omitempty"`
}

// readyRecord is ready.json.
type readyRecord struct {
	ReadyAfter time.Duration `json:"readyAfter"`
	At         time.Time     `json:"at"`
}

// exitRecord is exit.json.
type exitRecord struct {
	PID    int       `json:"pid"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
}

// readMeta reads spec.json; backend.ErrNotFound if there is none.
func readMeta(dir string) (meta, error) {
	var m meta
	err := readJSON(filepath.Join(dir, specFile), &m)
	if errors.Is(err, os.ErrNotExist) {
		return m, backend.ErrNotFound
	}
	return m, err
}

func readPIDFile(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// writeJSON writes atomically (temporary file, then rename).
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// removeAll removes dir, trying again for a moment if a file appears in it
// meanwhile: another Backend over the same StateDir (a process that started
// the VM) may be recording the exit it just saw.
func removeAll(dir string) error {
	var err error
	for i := 0; i < 20; i++ {
		if err = os.RemoveAll(dir); err == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// readTail returns up to the last n bytes of a file.
func readTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := fi.Size() - n
	if off < 0 {
		off = 0
	}
	buf := make([]byte, fi.Size()-off)
	k, _ := f.ReadAt(buf, off)
	return string(buf[:k])
}

// lastLines returns the last n non-empty lines of s, without carriage
// returns or terminal escape sequences.
func lastLines(s string, n int) string {
	s = stripEscapes(strings.ReplaceAll(s, "\r", ""))
	var keep []string
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0 && len(keep) < n; i-- {
		if strings.TrimSpace(lines[i]) != "" {
			keep = append(keep, lines[i])
		}
	}
	for i, j := 0, len(keep)-1; i < j; i, j = i+1, j-1 {
		keep[i], keep[j] = keep[j], keep[i]
	}
	return strings.Join(keep, "\n")
}

// stripEscapes drops ANSI CSI sequences (the shell asks the terminal for its
// cursor position, for one).
func stripEscapes(s string) string {
	if !strings.Contains(s, "\x1b") {
		return s
	}
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j
			continue
		}
		sb.WriteByte(s[i])
	}
	return sb.String()
}
