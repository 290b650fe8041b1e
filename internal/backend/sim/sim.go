package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

const (
	recordSuffix  = ".json"
	consoleSuffix = ".console.log"
	saveFormat    = "kairon-sim-save/1"
	readyMarker   = "KAIRON-READY"
)

// Options configure a sim Backend.
type Options struct {
	// StateDir holds one directory per instance. Required.
	StateDir string
	// BootDelay is how long an instance stays Booting after Start.
	BootDelay time.Duration
}

// Backend is the hollow backend. Every method is safe for concurrent use.
type Backend struct {
	opts Options
	mu   sync.Mutex
	// records: the records this Backend decoded, by instance
	// (record_cache.go).
	records map[string]cachedRecord
}

var (
	_ backend.Backend      = (*Backend)(nil)
	_ backend.LiveMigrator = (*Backend)(nil)
)

// record is StateDir/<id>/instance.json.
type record struct {
	Spec      backend.Spec `json:"spec"`
	StartedAt time.Time    `json:"startedAt"`
	// BootDelay is the delay this instance boots with (the Backend's at Start).
	BootDelay time.Duration `json:"bootDelay"`
	// Ready: Running without waiting (a restore of a ready instance), with
	// ReadyAfter as recorded.
	Ready      bool          `json:"ready,omitempty"`
	ReadyAfter time.Duration `json:"readyAfter,omitempty"`
	Paused     bool          `json:"paused,omitempty"`
	// ExitReason, when set, makes the instance Exited (see Crash).
	ExitReason string `json:"exitReason,omitempty"`
	// Marked: the console has its ready marker.
	Marked bool `json:"marked,omitempty"`
}

// saved is the file Save writes.
type saved struct {
	Format string       `json:"format"`
	Spec   backend.Spec `json:"spec"`
	Ready  bool         `json:"ready"`
}

// New returns a sim Backend over opts.StateDir.
func New(opts Options) (*Backend, error) {
	if opts.StateDir == "" {
		return nil, errors.New("sim: StateDir is required")
	}
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, err
	}
	return &Backend{opts: opts}, nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "sim" }

// Acceleration implements backend.Backend.
func (b *Backend) Acceleration() string { return "sim" }

// ConsoleLog implements backend.Backend.
func (b *Backend) ConsoleLog(id string) string {
	return filepath.Join(b.opts.StateDir, id+consoleSuffix)
}

func (b *Backend) recordPath(id string) string {
	return filepath.Join(b.opts.StateDir, id+recordSuffix)
}

func validID(id string) error {
	if id == "" || id == "." || id == ".." || strings.HasPrefix(id, ".") || strings.ContainsAny(id, "/\x00") {
		return fmt.Errorf("sim: invalid instance ID %q", id)
	}
	return nil
}

// Start implements backend.Backend.
func (b *Backend) Start(ctx context.Context, spec backend.Spec) (backend.Instance, error) {
	return b.start(spec, record{})
}

func (b *Backend) start(spec backend.Spec, r record) (backend.Instance, error) {
	if err := validID(spec.ID); err != nil {
		return backend.Instance{}, err
	}
	if spec.Name == "" {
		spec.Name = spec.ID
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, err := b.load(spec.ID); err == nil && old.ExitReason == "" {
		return b.instance(spec.ID, &old), nil
	}
	r.Spec, r.StartedAt, r.BootDelay = spec, time.Now(), b.opts.BootDelay
	if r.Ready {
		r.ReadyAfter = max(time.Since(r.StartedAt), time.Microsecond)
	}
	if err := os.WriteFile(b.ConsoleLog(spec.ID), []byte("sim: "+spec.Name+" is a hollow VM\n"), 0o644); err != nil {
		return backend.Instance{}, err
	}
	if err := b.save(spec.ID, r); err != nil {
		return backend.Instance{}, err
	}
	return b.instance(spec.ID, &r), nil
}

// Stop implements backend.Backend.
func (b *Backend) Stop(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.records, id)
	for _, p := range []string{b.recordPath(id), b.ConsoleLog(id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Pause implements backend.Backend.
func (b *Backend) Pause(ctx context.Context, id string) error {
	return b.update(id, func(r *record) { r.Paused = true })
}

// Resume implements backend.Backend.
func (b *Backend) Resume(ctx context.Context, id string) error {
	return b.update(id, func(r *record) { r.Paused = false })
}

// Crash makes an instance Exited with reason, as if its VM had died: for
// tests of how the control plane handles a lost VM.
func (b *Backend) Crash(id, reason string) error {
	return b.update(id, func(r *record) { r.ExitReason = reason })
}

func (b *Backend) update(id string, fn func(*record)) error {
	if err := validID(id); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := b.load(id)
	if err != nil {
		return err
	}
	if r.ExitReason != "" {
		return fmt.Errorf("sim: %s has exited", id)
	}
	fn(&r)
	return b.save(id, r)
}

// Save implements backend.Backend: a small file naming the instance; the
// instance is left paused.
func (b *Backend) Save(ctx context.Context, id, path string) error {
	return b.handOver(id, func(data []byte) error { return os.WriteFile(path, data, 0o600) })
}

// SendLive implements backend.LiveMigrator: the same record as Save, one
// JSON line written to w while the instance runs; then it is paused. The
// record is one write with no memory behind it, so opts (bandwidth,
// timeouts, auto-converge) have nothing to shape.
func (b *Backend) SendLive(ctx context.Context, id string, w io.Writer, _ backend.LiveOptions) (time.Duration, error) {
	err := b.handOver(id, func(data []byte) error {
		_, err := w.Write(append(data, '\n'))
		return err
	})
	return time.Millisecond, err
}

// handOver gives the instance's saved record to deliver, then pauses it.
func (b *Backend) handOver(id string, deliver func([]byte) error) error {
	if err := validID(id); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := b.load(id)
	if err != nil {
		return err
	}
	if r.ExitReason != "" {
		return fmt.Errorf("sim: %s has exited", id)
	}
	inst := b.instance(id, &r)
	data, err := json.Marshal(saved{Format: saveFormat, Spec: r.Spec, Ready: inst.Phase == backend.Running || (inst.Phase == backend.Paused && inst.ReadyAfter > 0)})
	if err != nil {
		return err
	}
	if err := deliver(data); err != nil {
		return err
	}
	r.Paused = true
	return b.save(id, r)
}

// Restore implements backend.Backend: Running at once if the saved instance
// was ready, else Booting for BootDelay.
func (b *Backend) Restore(ctx context.Context, spec backend.Spec, path string) (backend.Instance, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return backend.Instance{}, fmt.Errorf("sim: restore: %w", err)
	}
	return b.takeOver(spec, data, path)
}

// ReceiveLive implements backend.LiveMigrator.
func (b *Backend) ReceiveLive(ctx context.Context, spec backend.Spec, r io.Reader) (backend.Instance, error) {
	data, err := bufio.NewReader(r).ReadBytes('\n')
	if err != nil {
		return backend.Instance{}, fmt.Errorf("sim: receiving %s: %w", spec.ID, err)
	}
	return b.takeOver(spec, data, "live migration stream")
}

// takeOver starts spec from a record handOver gave; source names it in errors.
func (b *Backend) takeOver(spec backend.Spec, data []byte, source string) (backend.Instance, error) {
	var s saved
	if err := json.Unmarshal(data, &s); err != nil || s.Format != saveFormat {
		return backend.Instance{}, fmt.Errorf("sim: restore %s: not a sim saved instance", source)
	}
	// As the QEMU backend: a guest that booted an image is restored only
	// with one, and the built-in guest only without.
	if had, has := s.Spec.RootImage != "", spec.RootImage != ""; had != has {
		return backend.Instance{}, fmt.Errorf("sim: restore %s: the saved instance had a root image %v, the spec to restore it into %v", spec.ID, had, has)
	}
	return b.start(spec, record{Ready: s.Ready})
}

// Get implements backend.Backend.
func (b *Backend) Get(ctx context.Context, id string) (backend.Instance, error) {
	if validID(id) != nil {
		return backend.Instance{}, backend.ErrNotFound
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := b.load(id)
	if err != nil {
		return backend.Instance{}, err
	}
	return b.instance(id, &r), nil
}

// List implements backend.Backend.
func (b *Backend) List(ctx context.Context) ([]backend.Instance, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ents, err := os.ReadDir(b.opts.StateDir)
	if err != nil {
		return nil, err
	}
	var out []backend.Instance
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), recordSuffix)
		if !ok || e.IsDir() || validID(id) != nil {
			continue
		}
		r, err := b.load(id)
		if errors.Is(err, backend.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, b.instance(id, &r))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// instance reports r; the first time it is Running, the console gets the
// ready marker (callers hold b.mu).
func (b *Backend) instance(id string, r *record) backend.Instance {
	inst := backend.Instance{ID: id, Name: r.Spec.Name, StartedAt: r.StartedAt, Acceleration: "sim"}
	ready := r.Ready || time.Since(r.StartedAt) >= r.BootDelay
	if ready {
		inst.ReadyAfter = r.BootDelay
		if r.Ready {
			inst.ReadyAfter = r.ReadyAfter
		}
	}
	switch {
	case r.ExitReason != "":
		inst.Phase, inst.Reason = backend.Exited, r.ExitReason
		console, _ := os.ReadFile(b.ConsoleLog(id))
		inst.ConsoleTail = strings.TrimSpace(string(console))
	case r.Paused:
		inst.Phase = backend.Paused
	case ready:
		inst.Phase = backend.Running
	default:
		inst.Phase = backend.Booting
	}
	if ready && !r.Marked && r.ExitReason == "" {
		if f, err := os.OpenFile(b.ConsoleLog(id), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644); err == nil {
			_, werr := f.WriteString(readyMarker + "\n")
			if f.Close() == nil && werr == nil {
				r.Marked = true
				_ = b.save(id, *r)
			}
		}
	}
	return inst
}

func (b *Backend) load(id string) (record, error) {
	var r record
	gone := func() (record, error) {
		delete(b.records, id)
		return r, backend.ErrNotFound
	}
	p := b.recordPath(id)
	fi, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return gone()
	}
	if err != nil {
		return r, err
	}
	if r, ok := b.cached(id, fi); ok {
		return r, nil
	}
	// Replaced between the Stat and the read, the file is read again
	// next time: its identity is not the one remembered.
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return gone()
	}
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, err
	}
	b.remember(id, fi, r)
	return r, nil
}

// save writes the record atomically.
func (b *Backend) save(id string, r record) error {
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	p := b.recordPath(id)
	if err := os.WriteFile(p+".tmp", data, 0o644); err != nil {
		return err
	}
	// The file's identity before the rename, which keeps it: a Stat
	// after could see another Backend's record already.
	fi, statErr := os.Stat(p + ".tmp")
	if err := os.Rename(p+".tmp", p); err != nil {
		return err
	}
	if statErr == nil {
		b.remember(id, fi, r)
	}
	return nil
}

var _ backend.Cloner = (*Backend)(nil)

// RestoreClone implements backend.Cloner. A hollow instance has no guest
// to give an identity: it is Restore under the clone's spec.
func (b *Backend) RestoreClone(ctx context.Context, spec backend.Spec, path string) (backend.Instance, error) {
	return b.Restore(ctx, spec, path)
}
