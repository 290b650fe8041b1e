package qemu

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/zyvor/kairon/internal/guestagent/client"
	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// Readiness. A VM with the guest agent's port (every VM started since it
// exists) is ready once its agent reports, on that channel, that the
// guest's init finished, naming the boot nonce this Backend put on the
// kernel command line (meta.BootNonce): only the guest's root can write to
// the channel, and a report of another boot does not count. A VM without
// the port (restored from a state saved before it existed) is ready once
// it printed readyMarker on its serial console, which any guest process
// that can write to the console could forge.
//
// A watcher records the moment in ready.json: watchReady for a VM this
// Backend started, watchAdopted for one it adopted after a restart (get
// starts it, or scans the console on demand for a VM without the port).

// readyMarker is what the guest prints on its console once it is up.
const readyMarker = "KAIRON-READY"

// agentPollInterval is how often a watcher asks a connected agent whether
// the guest is ready yet.
const agentPollInterval = 10 * time.Millisecond

// agentStatusTimeout bounds one status request: an agent that does not
// answer within it is dialled again.
const agentStatusTimeout = 5 * time.Second

// agentStatusSeen, set only by tests, sees every status a readiness
// watcher got from a guest agent.
var agentStatusSeen atomic.Pointer[func(id string, st wire.Status)]

// newBootNonce is a fresh boot nonce: 128 random bits in hex.
func newBootNonce() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// watchReady records when the VM p runs became ready. It ends with the
// process, or when the VM was stopped or replaced.
func (b *Backend) watchReady(id string, v *vmState, gen int, p *proc, m meta) {
	stale := func() bool {
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.gen != gen
	}
	record := func(at time.Time) {
		v.mu.Lock()
		defer v.mu.Unlock()
		if v.gen == gen {
			_ = writeJSON(filepath.Join(b.dir(id), readyFile), readyRecord{ReadyAfter: at.Sub(m.StartedAt), At: at})
		}
	}
	ctx, cancel := whileRunning(func() bool {
		select {
		case <-p.exited:
			return false
		default:
			return !stale()
		}
	})
	defer cancel()
	guardConsole(b.dir(id))
	go b.guardTimer(ctx, id, m) // timer_guard.go
	if m.AgentPort {
		if at, ok := b.awaitAgentReady(ctx, id, m.BootNonce); ok {
			record(at)
		}
		return
	}
	if at, ok := b.awaitConsoleReady(ctx, id); ok {
		record(at)
	}
}

// adoptedWatchers holds the state directories an adopted VM's watcher
// watches.
var adoptedWatchers sync.Map

// watchAdopted is watchReady for a VM with the agent's port that this
// Backend did not start: it runs once per directory until the VM is ready
// or its process is gone.
func (b *Backend) watchAdopted(id string, m meta) {
	dir := b.dir(id)
	if _, running := adoptedWatchers.LoadOrStore(dir, struct{}{}); running {
		return
	}
	go func() {
		defer adoptedWatchers.Delete(dir)
		same := func() bool {
			now, err := readMeta(dir)
			return err == nil && now.PID == m.PID && now.StartedAt.Equal(m.StartedAt)
		}
		ctx, cancel := whileRunning(func() bool { return same() && processAlive(m.PID, dir) })
		defer cancel()
		go b.guardTimer(ctx, id, m)
		if m.Clone {
			// The Backend that restored it may have stopped before its
			// guest took the clone's identity; once more does no harm.
			at, err := b.configureClone(ctx, m.Spec, m.BootNonce)
			if err != nil {
				b.log.Warn("an adopted clone did not take its identity", "id", id, "err", err)
			}
			if !at.IsZero() && same() {
				_ = writeJSON(filepath.Join(dir, readyFile), readyRecord{ReadyAfter: at.Sub(m.StartedAt), At: at})
				return
			}
		}
		at, ok := b.awaitAgentReady(ctx, id, m.BootNonce)
		if ok && same() {
			_ = writeJSON(filepath.Join(dir, readyFile), readyRecord{ReadyAfter: at.Sub(m.StartedAt), At: at})
		}
	}()
}

// whileRunning is a context that ends once running reports false (checked
// every 50 ms) or it is cancelled.
func whileRunning(running func() bool) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if !running() {
					cancel()
					return
				}
			}
		}
	}()
	return ctx, cancel
}

// awaitAgentReady asks the VM's guest agent until it reports the guest
// ready with nonce, and returns that moment; false if ctx ended first. It
// holds the agent's channel (one client at a time) only while it waits.
func (b *Backend) awaitAgentReady(ctx context.Context, id, nonce string) (time.Time, bool) {
	sock := b.AgentSocket(id)
	warned := false
	for ctx.Err() == nil {
		// A guest whose Hello never comes (seen under load, early in its
		// boot) would hold an unbounded dial forever: dial afresh.
		dctx, cancel := context.WithTimeout(ctx, agentStatusTimeout)
		c, err := client.Dial(dctx, sock, client.Options{Name: "kairon-node/ready"})
		cancel()
		if err != nil {
			// No socket yet, or the guest broke the protocol: try again.
			if !sleepCtx(ctx, agentPollInterval) {
				return time.Time{}, false
			}
			continue
		}
		for ctx.Err() == nil {
			sctx, cancel := context.WithTimeout(ctx, agentStatusTimeout)
			st, err := c.Status(sctx)
			cancel()
			if err != nil {
				break
			}
			if seen := agentStatusSeen.Load(); seen != nil {
				(*seen)(id, st)
			}
			if st.Ready && st.Boot == nonce {
				_ = c.Close()
				return time.Now(), true
			}
			if st.Ready && !warned {
				warned = true
				b.log.Warn("the guest agent reports another boot; waiting for this one's", "id", id, "want", nonce, "got", st.Boot)
			}
			if !sleepCtx(ctx, agentPollInterval) {
				break
			}
		}
		_ = c.Close()
	}
	return time.Time{}, false
}

// awaitConsoleReady polls the console log for the ready marker and returns
// when it appeared; false if ctx ended first.
func (b *Backend) awaitConsoleReady(ctx context.Context, id string) (time.Time, bool) {
	path := b.ConsoleLog(id)
	var sc markerScanner
	for {
		found, err := sc.scan(path)
		if found {
			return time.Now(), true
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			b.log.Warn("watching console", "id", id, "err", err)
		}
		if !sleepCtx(ctx, agentPollInterval) {
			return time.Time{}, false
		}
	}
}

// sleepCtx waits d, or less if ctx ends (then false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// markerScanner finds the ready marker in a growing file, reading each byte once.
type markerScanner struct {
	off   int64
	carry []byte
	mtime time.Time
}

// scan reads what path gained since the last scan and tells whether the
// marker appeared in it (a marker split across two scans counts).
func (s *markerScanner) scan(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil {
		s.mtime = fi.ModTime()
		if fi.Size() < s.off { // truncated: start over
			s.off, s.carry = 0, nil
		}
	}
	buf := make([]byte, 64*1024)
	for {
		n, err := f.ReadAt(buf, s.off)
		if n > 0 {
			s.off += int64(n)
			data := append(s.carry, buf[:n]...)
			if bytes.Contains(data, []byte(readyMarker)) {
				return true, nil
			}
			keep := len(readyMarker) - 1
			if len(data) > keep {
				data = data[len(data)-keep:]
			}
			s.carry = append([]byte(nil), data...)
		}
		if err == io.EOF || n == 0 {
			return false, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// fileContains tells whether the file at path holds s.
func fileContains(path, s string) (bool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	return bytes.Contains(b, []byte(s)), nil
}

// The console log's size cap. QEMU itself appends everything the guest
// prints to console.log (the console chardev's logfile, opened with
// logappend=on, i.e. O_APPEND), so a guest printing without end would fill
// the node's disk. A console guard per running VM (guardConsole) stats the
// log every consoleGuardInterval and, past consoleLogCap, drops its head in
// place so that about consoleLogKeep bytes remain (capConsoleLog: a ring,
// losing nothing of what the guest prints meanwhile, where the file system
// collapses ranges). Because QEMU's descriptor is O_APPEND, its next write
// lands at the new end of the file; nothing has to be reopened, and a QEMU adopted by a new agent after a
// restart is capped the same way (its guard starts at the first readMeta of
// its directory, which every Get and List does). Between two looks the log
// can outgrow the cap by what the guest prints in one interval.
var consoleLogCap atomic.Int64

func init() { consoleLogCap.Store(defaultConsoleLogCap) }

const (
	// defaultConsoleLogCap is the most console.log keeps (consoleLogCap,
	// which tests lower), checked every consoleGuardInterval.
	defaultConsoleLogCap = 8 << 20
	// consoleGuardInterval is how often a guard looks at the log's size.
	consoleGuardInterval = 100 * time.Millisecond
)

// consoleTruncatedNote begins a log that capConsoleLog cut down.
const consoleTruncatedNote = "[kairon: console log exceeded %d bytes; older output dropped]\n"

// consoleLogKeep is how much of the log's end a cut keeps: half the cap, so
// that a guest printing without end costs one cut per half cap printed.
func consoleLogKeep(limit int64) int64 { return limit / 2 }

// consoleGuards holds the state directories whose console a guard watches.
var consoleGuards sync.Map

// guardConsole makes sure a guard caps the console log of the VM in dir
// while its process runs. It is cheap to call again.
func guardConsole(dir string) {
	if _, running := consoleGuards.LoadOrStore(dir, struct{}{}); running {
		return
	}
	go func() {
		defer consoleGuards.Delete(dir)
		path := filepath.Join(dir, consoleLogFile)
		t := time.NewTicker(consoleGuardInterval)
		defer t.Stop()
		for range t.C {
			_, _ = capConsoleLog(path, consoleLogCap.Load())
			if !guardedVMRuns(dir) {
				return
			}
		}
	}()
}

// guardedVMRuns tells whether the VM in dir still has a process (or is
// still being started: spec.json without a PID yet).
func guardedVMRuns(dir string) bool {
	var m meta
	if err := readJSON(filepath.Join(dir, specFile), &m); err != nil {
		return false
	}
	pid := m.PID
	if pid == 0 {
		pid = readPIDFile(filepath.Join(dir, pidFile))
	}
	if pid == 0 {
		return time.Since(m.StartedAt) < startTimeout
	}
	return processAlive(pid, dir)
}

// capConsoleLog cuts the log at path down to about its last
// consoleLogKeep(limit) bytes, behind a note, if it holds more than limit
// bytes. It reports whether it cut.
//
// Where the file system can (ext4, xfs), the cut drops the log's head in
// place with fallocate(FALLOC_FL_COLLAPSE_RANGE): the kernel serialises it
// with QEMU's appends, so nothing the guest prints meanwhile is lost, and
// the log behaves as a ring. Elsewhere it rewrites the end behind a
// truncation, and what the writer appends between the read of the end and
// the truncation is lost.
func capConsoleLog(path string, limit int64) (bool, error) {
	if limit <= 0 {
		return false, nil
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Size() <= limit {
		return false, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	// Two guards of one log (an old Backend's and the adopting one's) take
	// turns, each judging the size it sees under the lock.
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return false, err
	}
	if fi, err = f.Stat(); err != nil || fi.Size() <= limit {
		return false, err
	}
	if cut, err := collapseConsoleLog(f, fi, limit); cut || err != nil {
		return cut, err
	}
	return rewriteConsoleLog(path, fi.Size(), limit)
}

// collapseConsoleLog drops the head of the log open in f so that about
// consoleLogKeep(limit) bytes remain, then writes the note over the first
// (partial) lines. It reports false, nil when the file system cannot
// collapse a range.
func collapseConsoleLog(f *os.File, fi os.FileInfo, limit int64) (bool, error) {
	block := int64(4096)
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Blksize > 0 {
		block = int64(st.Blksize)
	}
	cut := (fi.Size() - consoleLogKeep(limit)) / block * block
	if cut <= 0 {
		return false, nil
	}
	switch err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_COLLAPSE_RANGE, 0, cut); {
	case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP) || errors.Is(err, unix.ENOSYS):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("collapsing the console log: %w", err)
	}
	// The log now begins mid-line. The note goes over the head up to a line
	// end far enough in, so every line after it is whole; the writer only
	// appends, so these old bytes are not being written.
	note := fmt.Sprintf(strings.TrimSuffix(consoleTruncatedNote, "\n"), limit)
	head := make([]byte, 64<<10)
	n, err := f.ReadAt(head, 0)
	if err != nil && err != io.EOF {
		return true, err
	}
	head = head[:n]
	over := []byte(note + "\n")
	if i := bytes.IndexByte(head[min(len(note), len(head)):], '\n'); i >= 0 {
		end := len(note) + i // the line end the note stops at
		over = append([]byte(note), bytes.Repeat([]byte(" "), end-len(note))...)
	}
	if _, err := f.WriteAt(over, 0); err != nil {
		return true, err
	}
	return true, nil
}

// rewriteConsoleLog is capConsoleLog where ranges cannot be collapsed.
func rewriteConsoleLog(path string, size, limit int64) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	keep := consoleLogKeep(limit) - int64(len(consoleTruncatedNote)) - 24
	if keep < 0 {
		keep = 0
	}
	buf := make([]byte, keep)
	n, err := f.ReadAt(buf, size-keep)
	if err != nil && err != io.EOF {
		return false, err
	}
	buf = buf[:n]
	if i := bytes.IndexByte(buf, '\n'); i >= 0 && i < len(buf)/2 {
		buf = buf[i+1:]
	}
	if err := f.Truncate(0); err != nil {
		return false, err
	}
	out := append([]byte(fmt.Sprintf(consoleTruncatedNote, limit)), buf...)
	if _, err := f.Write(out); err != nil {
		return true, err
	}
	return true, nil
}
