package qemu

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"
)

// Readiness: a guest is ready once it printed readyMarker on its serial
// console. The console log is the only place to learn it, for a VM this
// Backend started (watchReady) as for one it adopted (get scans on demand).

// readyMarker is what the guest prints on its console once it is up.
const readyMarker = "KAIRON-READY"

// watchReady polls the console log for the ready marker and records when it
// appeared. It ends with the process, or when the VM was stopped or replaced.
func (b *Backend) watchReady(id string, v *vmState, gen int, p *proc, started time.Time) {
	path := b.ConsoleLog(id)
	var sc markerScanner
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		found, err := sc.scan(path)
		if found {
			at := time.Now()
			v.mu.Lock()
			if v.gen == gen {
				_ = writeJSON(filepath.Join(b.dir(id), readyFile), readyRecord{ReadyAfter: at.Sub(started), At: at})
			}
			v.mu.Unlock()
			return
		}
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			b.log.Warn("watching console", "id", id, "err", err)
		}
		select {
		case <-p.exited:
			return
		case <-t.C:
		}
		v.mu.Lock()
		stale := v.gen != gen
		v.mu.Unlock()
		if stale {
			return
		}
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
