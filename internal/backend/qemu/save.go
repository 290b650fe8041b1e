package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

// Save and Restore: a VM's whole state in a file, a saveHeader followed by
// QEMU's migration stream (migration.go). A live migration stream (live.go)
// has the same form.

// Save implements backend.Backend: the VM is paused, then QEMU migrates its
// whole state into path through a file descriptor passed over QMP. path
// begins with a small header (see saveHeader) that Restore checks.
func (b *Backend) Save(ctx context.Context, id, path string) error {
	dir, done, err := b.beginLiveOp(id)
	if err != nil {
		return err
	}
	defer done()
	hdr, err := b.headerOf(id, dir)
	if err != nil {
		return err
	}
	f, err := createSaved(path, hdr)
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		f.Close()
		if !ok {
			os.Remove(path)
		}
	}()
	sock := filepath.Join(dir, qmpSock)
	began := time.Now()
	err = qmpDo(ctx, sock, func(q *qmpConn) error {
		if _, err := q.execute("stop", nil); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, pausedFile), nil, 0o644); err != nil {
			return err
		}
		// The default bandwidth cap (32 MiB/s) is for live migration over a
		// shared network; saving a paused VM to a local file wants all of it.
		return startMigration(q, f, int64(1)<<40)
	})
	if err != nil {
		return fmt.Errorf("qemu: save %s: %w", id, err)
	}
	if _, err := awaitMigration(ctx, sock, nil); err != nil {
		return fmt.Errorf("qemu: save %s: %w", id, err)
	}
	if err := f.Sync(); err != nil {
		return err
	}
	ok = true
	b.log.Info("saved", "id", id, "path", path, "took", time.Since(began))
	return nil
}

// Restore implements backend.Backend. The spec must have the saved VM's
// shape (vCPUs, memory, with or without a NIC); its network may name another
// tap. Restoring an ID that already runs returns the running instance.
func (b *Backend) Restore(ctx context.Context, spec backend.Spec, path string) (backend.Instance, error) {
	if path == "" {
		return backend.Instance{}, errors.New("qemu: restore: no state file")
	}
	f, hdr, err := openSaved(path)
	if err != nil {
		return backend.Instance{}, err
	}
	defer f.Close()
	return b.start(ctx, spec, &incoming{stream: f, header: hdr, origin: path})
}

// headerOf describes the VM in dir for a saved state or a live stream.
func (b *Backend) headerOf(id, dir string) (saveHeader, error) {
	m, err := readMeta(dir)
	if err != nil {
		return saveHeader{}, err
	}
	var rr readyRecord
	ready := readJSON(filepath.Join(dir, readyFile), &rr) == nil
	if !ready && !m.AgentPort { // the watcher may not have looked yet
		var sc markerScanner
		ready, _ = sc.scan(filepath.Join(dir, consoleLogFile))
	}
	h := saveHeader{
		Format: saveFormat, ID: id, Name: m.Spec.Name, CPU: m.Spec.CPU, MemoryMiB: m.Spec.MemoryMiB,
		NIC: m.Spec.Network != nil, Ready: ready, Acceleration: m.Acceleration, SavedAt: time.Now(),
		AgentPort: m.AgentPort, BootNonce: m.BootNonce,
	}
	if m.Spec.RootImage != "" {
		h.RootImage = true
		if h.RootImageSHA256, err = rootImageSum(m.Spec.RootImage); err != nil {
			return saveHeader{}, fmt.Errorf("qemu: %s: %w", id, err)
		}
	}
	return h, nil
}

// Saved state files: a fixed-size header, then QEMU's migration stream.
const (
	saveFormat     = "kairon-qemu-save/1"
	saveHeaderSize = 4096
)

// saveHeader describes a saved VM, for Restore to check and to know whether
// the guest had already been ready.
type saveHeader struct {
	Format       string    `json:"format"`
	ID           string    `json:"id"`
	Name         string    `json:"name"`
	CPU          int32     `json:"cpu"`
	MemoryMiB    int64     `json:"memoryMiB"`
	NIC          bool      `json:"nic"`
	Ready        bool      `json:"ready"`
	Acceleration string    `json:"acceleration"`
	SavedAt      time.Time `json:"savedAt"`
	// AgentPort: the saved VM has the guest agent's port (meta.AgentPort);
	// absent in states saved before the port existed.
	AgentPort bool `json:"agentPort,omitempty"`
	// BootNonce is the saved guest's boot nonce (meta.BootNonce): its
	// agent keeps reporting it after a restore.
	BootNonce string `json:"bootNonce,omitempty"`
	// RootImage: the saved VM is an image guest, with a root image on a
	// disk of its own (backend.Spec.RootImage). QEMU loads its state only
	// into the same devices, and its guest holds the image's blocks in its
	// page cache: the target must attach the very same image, whose
	// SHA-256 (hex) RootImageSHA256 is (rootimage.go).
	RootImage       bool   `json:"rootImage,omitempty"`
	RootImageSHA256 string `json:"rootImageSHA256,omitempty"`

	// clone, never written: RestoreClone loads this state as another
	// Machine, which gets its own identity and boot nonce (clone.go).
	clone bool
}

// compatible tells whether spec has the shape the saved VM had; QEMU can only
// load a state into an identical machine.
func (h saveHeader) compatible(spec backend.Spec) error {
	var diffs []string
	if h.CPU != spec.CPU {
		diffs = append(diffs, fmt.Sprintf("%d vCPUs saved, %d asked", h.CPU, spec.CPU))
	}
	if h.MemoryMiB != spec.MemoryMiB {
		diffs = append(diffs, fmt.Sprintf("%d MiB saved, %d asked", h.MemoryMiB, spec.MemoryMiB))
	}
	if h.NIC != (spec.Network != nil) {
		diffs = append(diffs, fmt.Sprintf("NIC saved %v, asked %v", h.NIC, spec.Network != nil))
	}
	if len(diffs) > 0 {
		return fmt.Errorf("qemu: restore %s: the saved VM has another shape: %s", spec.ID, strings.Join(diffs, "; "))
	}
	switch {
	case h.RootImage && spec.RootImage == "":
		return fmt.Errorf("qemu: restore %s: the saved VM booted an OCI image (a root image), and the spec to restore it into has none: restore it with the same image", spec.ID)
	case !h.RootImage && spec.RootImage != "":
		return fmt.Errorf("qemu: restore %s: the saved VM is the built-in guest, and the spec to restore it into has a root image (%s): restore it without one", spec.ID, spec.RootImage)
	case h.RootImage:
		sum, err := rootImageSum(spec.RootImage)
		if err != nil {
			return fmt.Errorf("qemu: restore %s: %w", spec.ID, err)
		}
		if sum != h.RootImageSHA256 {
			return fmt.Errorf("qemu: restore %s: root image %s (sha256 %.12s) is not the image the VM was saved with (sha256 %.12s): the guest needs the same file, byte for byte", spec.ID, spec.RootImage, sum, h.RootImageSHA256)
		}
	}
	return nil
}

// encodeHeader is h padded to saveHeaderSize: a JSON line, then zeros.
func encodeHeader(h saveHeader) ([]byte, error) {
	b, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	if len(b)+1 > saveHeaderSize {
		return nil, errors.New("qemu: save header too large")
	}
	buf := make([]byte, saveHeaderSize)
	copy(buf, b)
	buf[len(b)] = '\n'
	return buf, nil
}

// readHeader reads and checks the header at the start of a saved VM or of a
// live migration stream; source names it in errors.
func readHeader(r io.Reader, source string) (saveHeader, error) {
	var h saveHeader
	buf := make([]byte, saveHeaderSize)
	if _, err := io.ReadFull(r, buf); err != nil {
		return h, fmt.Errorf("qemu: restore %s: not a saved VM: %w", source, err)
	}
	line, _, _ := strings.Cut(string(buf), "\n")
	if err := json.Unmarshal([]byte(line), &h); err != nil || h.Format != saveFormat {
		return h, fmt.Errorf("qemu: restore %s: not a Kairon saved VM (format %q)", source, h.Format)
	}
	return h, nil
}

// createSaved creates path with h written, for the migration stream to follow.
func createSaved(path string, h saveHeader) (*os.File, error) {
	buf, err := encodeHeader(h)
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openSaved opens a saved state, checks its header and leaves the file
// positioned at the migration stream.
func openSaved(path string) (*os.File, saveHeader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, saveHeader{}, fmt.Errorf("qemu: restore: %w", err)
	}
	h, err := readHeader(f, path)
	if err != nil {
		f.Close()
		return nil, h, err
	}
	return f, h, nil
}
