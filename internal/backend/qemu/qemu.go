package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

// DefaultImage is the guest image used when a Spec names no kernel.
const DefaultImage = "default"

// Options configure a Backend.
type Options struct {
	// StateDir holds one directory per VM. Required.
	StateDir string
	// GuestDir holds guest images as <image>/vmlinux and
	// <image>/initramfs.cpio.gz; Specs without a kernel boot "default".
	// Empty: LocateGuestDir().
	GuestDir string
	// Acceleration is "auto" (default), "kvm" or "tcg".
	Acceleration string
	// QEMUPath is the qemu-system-x86_64 binary; empty looks it up in PATH.
	QEMUPath string
	// NetNS runs every VM in this network namespace, where the node agent
	// keeps the bridge and taps.
	NetNS string
	// Log receives the backend's decisions (acceleration) and anomalies.
	Log *slog.Logger

	// NoJail runs VMs as the agent's own user, unconfined: only for an agent
	// that is not root (development), which cannot jail. See jail.go.
	NoJail bool
	// JailUIDBase and JailUIDCount are the range of uids (and gids) VMs run
	// as; zero: DefaultJailUIDBase and DefaultJailUIDCount.
	JailUIDBase, JailUIDCount uint32
	// JailRegistry is the host-wide directory recording which uids are in
	// use; empty: DefaultJailRegistry.
	JailRegistry string
	// CgroupParent is the cgroup, relative to each hierarchy's root, under
	// which every VM gets one of its own; empty: DefaultCgroupParent.
	CgroupParent string
	// HostScope places the VMs' cgroups in the host's whole hierarchies,
	// which the agent mounts afresh, rather than in its own view of
	// /sys/fs/cgroup: for an agent in a container sharing the host's PID
	// namespace, whose VMs must outlive the container (kairon-node
	// --vm-scope=host). See hostscope.go.
	HostScope bool
	// MemoryOverheadMiB is what a VM's cgroup allows beyond guest memory;
	// zero: DefaultMemoryOverheadMiB.
	MemoryOverheadMiB int64
}

// Backend runs each VM as its own QEMU process. See the package comment.
type Backend struct {
	opts        Options
	qemu        string
	accel       string
	accelReason string
	tscKHz      int64
	log         *slog.Logger
	jail        *jailConfig // nil with NoJail

	mu  sync.Mutex
	vms map[string]*vmState
}

var _ backend.Backend = (*Backend)(nil)

// vmState is what this Backend holds in memory about one VM ID; the truth is
// on disk and in the process table.
type vmState struct {
	// op serializes lifecycle operations (Start, Stop, Pause, Resume, Save,
	// Restore) on this ID.
	op sync.Mutex
	// busy is set while an operation runs, so that Get does not queue
	// behind it on QEMU's single QMP session.
	busy atomic.Bool

	mu   sync.Mutex
	proc *proc // set when this Backend started the process
	gen  int   // bumped at every start and stop; stale watchers check it
}

// New returns a Backend over opts.StateDir. It starts nothing: VMs already
// running under StateDir are reported by Get and List as they are. With
// Acceleration "auto" it decides once between kvm and tcg (see probeKVM).
func New(opts Options) (*Backend, error) {
	if opts.StateDir == "" {
		return nil, errors.New("qemu: StateDir is required")
	}
	sd, err := filepath.Abs(opts.StateDir)
	if err != nil {
		return nil, err
	}
	opts.StateDir = sd
	if err := os.MkdirAll(opts.StateDir, 0o755); err != nil {
		return nil, err
	}
	if opts.GuestDir == "" {
		opts.GuestDir, _ = LocateGuestDir()
	}
	if opts.GuestDir != "" {
		if opts.GuestDir, err = filepath.Abs(opts.GuestDir); err != nil {
			return nil, err
		}
	}
	b := &Backend{opts: opts, vms: map[string]*vmState{}, log: opts.Log}
	if b.log == nil {
		b.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	b.qemu = opts.QEMUPath
	if b.qemu == "" {
		if b.qemu, err = exec.LookPath("qemu-system-x86_64"); err != nil {
			return nil, errors.New("qemu: qemu-system-x86_64 not found in PATH; install Debian's qemu-system-x86 (make deps)")
		}
	}
	b.tscKHz = hostTSCkHz()
	if opts.NoJail && opts.HostScope {
		return nil, errors.New("qemu: --vm-scope=host places each VM's jail cgroups on the host, and --qemu-no-jail has none: drop one of them")
	}
	if !opts.NoJail {
		if b.jail, err = newJailConfig(opts); err != nil {
			return nil, err
		}
	}
	switch opts.Acceleration {
	case "", "auto":
		b.accel, b.accelReason = DecideAcceleration(b.probeKVM(context.Background()))
	case "kvm":
		if f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0); err != nil {
			return nil, fmt.Errorf("qemu: acceleration kvm requested: %w", err)
		} else {
			f.Close()
		}
		if b.jail != nil && b.jail.kvmErr != nil {
			return nil, fmt.Errorf("qemu: acceleration kvm requested: %w", b.jail.kvmErr)
		}
		b.accel, b.accelReason = "kvm", "requested"
	case "tcg":
		b.accel, b.accelReason = "tcg", "requested"
	default:
		return nil, fmt.Errorf("qemu: unknown acceleration %q (auto, kvm or tcg)", opts.Acceleration)
	}
	b.log.Info("qemu backend", "acceleration", b.accel, "why", b.accelReason, "stateDir", opts.StateDir, "tscKHz", b.tscKHz, "jail", b.jail != nil)
	return b, nil
}

// LocateGuestDir finds the built guest images: $KAIRON_GUEST_DIR, else
// bin/guest in the repository (the nearest directory above the working
// directory holding go.mod). It returns the path and whether it exists.
func LocateGuestDir() (string, bool) {
	if d := os.Getenv("KAIRON_GUEST_DIR"); d != "" {
		_, err := os.Stat(d)
		return d, err == nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			g := filepath.Join(d, "bin", "guest")
			_, err := os.Stat(g)
			return g, err == nil
		}
		if filepath.Dir(d) == d {
			return "", false
		}
	}
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "qemu" }

// Acceleration implements backend.Backend.
func (b *Backend) Acceleration() string { return b.accel }

// AccelerationReason says why Acceleration is what it is.
func (b *Backend) AccelerationReason() string { return b.accelReason }

func (b *Backend) imagePaths(image string) (kernel, initrd string) {
	d := filepath.Join(b.opts.GuestDir, image)
	return filepath.Join(d, "vmlinux"), filepath.Join(d, "initramfs.cpio.gz")
}

func (b *Backend) vm(id string) *vmState {
	b.mu.Lock()
	defer b.mu.Unlock()
	v := b.vms[id]
	if v == nil {
		v = &vmState{}
		b.vms[id] = v
	}
	return v
}

func validID(id string) error {
	if id == "" || id == "." || id == ".." || strings.HasPrefix(id, ".") || strings.ContainsAny(id, "/\x00") || len(id) > 255 {
		return fmt.Errorf("qemu: invalid instance ID %q", id)
	}
	return nil
}

// Start implements backend.Backend.
func (b *Backend) Start(ctx context.Context, spec backend.Spec) (backend.Instance, error) {
	return b.start(ctx, spec, nil)
}

// start boots spec, or loads in into it. Whatever it did is undone when it
// fails (see the deferred undo), so a failed start leaves no QEMU process,
// socket or state file behind.
func (b *Backend) start(ctx context.Context, spec backend.Spec, in *incoming) (_ backend.Instance, err error) {
	if err := validID(spec.ID); err != nil {
		return backend.Instance{}, err
	}
	if spec.CPU <= 0 {
		spec.CPU = 1
	}
	if spec.MemoryMiB <= 0 {
		spec.MemoryMiB = 256
	}
	if spec.Name == "" {
		spec.Name = spec.ID
	}
	if spec.Kernel == "" {
		if b.opts.GuestDir == "" {
			return backend.Instance{}, errors.New("qemu: no kernel in spec and no guest directory (run make guest, or set KAIRON_GUEST_DIR)")
		}
		spec.Kernel, spec.Initrd = b.imagePaths(DefaultImage)
	}
	if _, err := os.Stat(spec.Kernel); err != nil {
		return backend.Instance{}, fmt.Errorf("qemu: kernel: %w (run make guest)", err)
	}
	if spec.Network != nil && spec.Network.TapName == "" {
		return backend.Instance{}, errors.New("qemu: network without a tap name")
	}
	if spec.RootImage != "" {
		if fi, err := os.Stat(spec.RootImage); err != nil {
			return backend.Instance{}, fmt.Errorf("qemu: root image: %w", err)
		} else if !fi.Mode().IsRegular() {
			return backend.Instance{}, fmt.Errorf("qemu: root image %s: not a regular file", spec.RootImage)
		}
	}

	v := b.vm(spec.ID)
	v.op.Lock()
	defer v.op.Unlock()
	v.busy.Store(true)
	defer v.busy.Store(false)

	if inst, err := b.get(ctx, spec.ID, v, false); err == nil {
		if inst.Phase != backend.Exited {
			return inst, nil
		}
		b.log.Info("replacing exited VM", "id", spec.ID, "reason", inst.Reason)
	}

	var (
		stream *os.File
		hdr    saveHeader
		origin string
	)
	if in != nil {
		stream, hdr, origin = in.stream, in.header, in.origin
		if err := hdr.compatible(spec); err != nil {
			return backend.Instance{}, err
		}
	}

	// From here on the directory is this start's, and then a process too.
	// Every error return below ends in this one undo.
	dir := b.dir(spec.ID)
	var p *proc
	defer func() {
		if err == nil {
			return
		}
		if p != nil {
			b.abandon(v, p)
		}
		if rerr := b.removeVMDir(dir); rerr != nil {
			b.log.Warn("cleaning up a failed start", "id", spec.ID, "err", rerr)
		}
	}()

	if err := b.removeVMDir(dir); err != nil {
		return backend.Instance{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return backend.Instance{}, err
	}
	m := meta{Spec: spec, Acceleration: b.accel, StartedAt: time.Now(), RestoredFrom: origin, RestoredReady: hdr.Ready && !hdr.clone,
		AgentPort: in == nil || hdr.AgentPort, BootNonce: hdr.BootNonce, Clone: hdr.clone}
	if in == nil || hdr.clone {
		m.BootNonce = newBootNonce()
	}
	if err := writeJSON(filepath.Join(dir, specFile), m); err != nil {
		return backend.Instance{}, err
	}
	var jail *jailRecord
	if b.jail != nil {
		if jail, err = b.jail.prepare(dir, spec, b.accel); err != nil {
			return backend.Instance{}, fmt.Errorf("qemu: jail for %s: %w", spec.ID, err)
		}
	}
	kargs := spec.KernelArgs
	if spec.RootImage != "" {
		// After the spec's own arguments: the guest's init takes the last.
		kargs = append(slices.Clone(kargs), "kairon.image="+rootImageDevice)
	}
	ls := launchSpec{
		dir: dir, name: spec.Name, accel: b.accel, cpu: spec.CPU, memMiB: spec.MemoryMiB,
		kernel: spec.Kernel, initrd: spec.Initrd, net: spec.Network, incoming: stream,
		cmdline:   b.cmdline(b.accel, hostnameFor(spec.Name), spec.Network, kargs, m.BootNonce),
		jail:      jail,
		agentPort: m.AgentPort,
		rootImage: spec.RootImage,
	}
	m.StartedAt = time.Now()
	if p, err = b.launch(ls); err != nil {
		return backend.Instance{}, err
	}
	if hook := launchedHook.Load(); hook != nil {
		(*hook)(spec.ID)
	}
	m.PID = p.pid
	if err := writeJSON(filepath.Join(dir, specFile), m); err != nil {
		return backend.Instance{}, err
	}
	v.mu.Lock()
	v.gen++
	gen := v.gen
	v.proc = p
	v.mu.Unlock()
	go b.reap(spec.ID, v, p)

	if in != nil {
		if err := b.finishRestore(ctx, dir, p); err != nil {
			return backend.Instance{}, err
		}
		if hdr.clone {
			// Its own identity and nonce before anything counts it ready.
			readyAt, err := b.configureClone(ctx, spec, m.BootNonce)
			if err != nil {
				return backend.Instance{}, err
			}
			if !readyAt.IsZero() {
				_ = writeJSON(filepath.Join(dir, readyFile), readyRecord{ReadyAfter: readyAt.Sub(m.StartedAt), At: readyAt})
			}
		} else if hdr.Ready {
			_ = writeJSON(filepath.Join(dir, readyFile), readyRecord{ReadyAfter: time.Since(m.StartedAt), At: time.Now()})
		}
	}
	if _, err := os.Stat(filepath.Join(dir, readyFile)); err != nil {
		go b.watchReady(spec.ID, v, gen, p, m)
	}
	if startFailpoint != nil {
		if err := startFailpoint(spec.ID); err != nil {
			return backend.Instance{}, err
		}
	}
	return b.get(ctx, spec.ID, v, false)
}

// launchedHook, set only by tests, runs as soon as a start launched QEMU,
// before the Backend records the process as its own.
var launchedHook atomic.Pointer[func(id string)]

// startFailpoint, set only by tests, runs once a start has done everything
// but report the instance, and fails the start with its error: the latest a
// start can fail, when there is the most to undo.
var startFailpoint func(id string) error

// abandon kills p, a process a failed start launched, after detaching it from
// v so that neither reap nor watchReady records anything about it in the
// directory being removed.
func (b *Backend) abandon(v *vmState, p *proc) {
	v.mu.Lock()
	if v.proc == p {
		v.proc = nil
		v.gen++
	}
	v.mu.Unlock()
	p.kill()
}

// reap records how a process this Backend started ended.
func (b *Backend) reap(id string, v *vmState, p *proc) {
	<-p.exited
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.proc != p {
		return
	}
	// exit.json carries the PID, so a stale record never describes a later VM.
	_ = writeJSON(filepath.Join(b.dir(id), exitFile), exitRecord{PID: p.pid, Reason: p.exitDesc(), At: time.Now()})
}

// Stop implements backend.Backend: QMP quit, then SIGTERM, then SIGKILL,
// until the process is gone; then StateDir/<id> is removed.
func (b *Backend) Stop(ctx context.Context, id string) error {
	if err := validID(id); err != nil {
		return err
	}
	v := b.vm(id)
	v.op.Lock()
	defer v.op.Unlock()
	v.busy.Store(true)
	defer v.busy.Store(false)

	dir := b.dir(id)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err := b.canRemove(dir); err != nil {
		return err
	}
	m, _ := readMeta(dir)
	pid := m.PID
	if pid == 0 {
		pid = readPIDFile(filepath.Join(dir, pidFile))
	}
	v.mu.Lock()
	p := v.proc
	v.mu.Unlock()
	if p != nil && p.pid != pid {
		p = nil
	}
	if pid > 0 && processAlive(pid, dir) {
		gone := func(d time.Duration) bool { return waitGone(pid, dir, p, d) }
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := qmpDo(qctx, filepath.Join(dir, qmpSock), func(q *qmpConn) error { _, err := q.execute("quit", nil); return err })
		cancel()
		if err != nil {
			b.log.Info("qmp quit failed, signalling", "id", id, "err", err)
		}
		if err != nil || !gone(5*time.Second) {
			_ = syscall.Kill(pid, syscall.SIGTERM)
			if !gone(3 * time.Second) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				if !gone(10 * time.Second) {
					return fmt.Errorf("qemu: stop %s: process %d does not go away", id, pid)
				}
			}
		}
	}
	v.mu.Lock()
	v.gen++
	v.proc = nil
	v.mu.Unlock()
	if err := b.removeVMDir(dir); err != nil {
		return fmt.Errorf("qemu: stop %s: %w", id, err)
	}
	return nil
}

// removeVMDir removes a VM's jail (its cgroups, killing what still runs
// in them, and its uid) and then its directory.
func (b *Backend) removeVMDir(dir string) error {
	if err := b.canRemove(dir); err != nil {
		return err
	}
	if b.jail != nil {
		if err := b.jail.teardown(dir); err != nil {
			return err
		}
	}
	return removeAll(dir)
}

// canRemove refuses, to a Backend without the jail, a directory that holds
// a jailed VM: it could neither remove its cgroups nor release its uid.
func (b *Backend) canRemove(dir string) error {
	if b.jail != nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(dir, jailFile)); err == nil {
		return fmt.Errorf("qemu: %s holds a jailed VM, which an agent run with --qemu-no-jail cannot clean up", dir)
	}
	return nil
}

// waitGone waits up to d for pid to be gone (reaped, when it is our child).
func waitGone(pid int, dir string, p *proc, d time.Duration) bool {
	if p != nil {
		select {
		case <-p.exited:
			return true
		case <-time.After(d):
			return false
		}
	}
	deadline := time.Now().Add(d)
	for processAlive(pid, dir) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// Pause implements backend.Backend (QMP stop).
func (b *Backend) Pause(ctx context.Context, id string) error {
	return b.vcpus(ctx, id, "stop")
}

// Resume implements backend.Backend (QMP cont).
func (b *Backend) Resume(ctx context.Context, id string) error {
	return b.vcpus(ctx, id, "cont")
}

func (b *Backend) vcpus(ctx context.Context, id, cmd string) error {
	dir, done, err := b.beginLiveOp(id)
	if err != nil {
		return err
	}
	defer done()
	if err := qmpDo(ctx, filepath.Join(dir, qmpSock), func(q *qmpConn) error { _, err := q.execute(cmd, nil); return err }); err != nil {
		return fmt.Errorf("qemu: %s %s: %w", cmd, id, err)
	}
	if cmd == "stop" {
		return os.WriteFile(filepath.Join(dir, pausedFile), nil, 0o644)
	}
	if err := os.Remove(filepath.Join(dir, pausedFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// beginLiveOp starts an operation on a running VM: it takes the VM's
// operation lock, marks it busy and returns its directory. Call done when the
// operation is over.
func (b *Backend) beginLiveOp(id string) (dir string, done func(), err error) {
	if err := validID(id); err != nil {
		return "", nil, err
	}
	v := b.vm(id)
	v.op.Lock()
	v.busy.Store(true)
	done = func() {
		v.busy.Store(false)
		v.op.Unlock()
	}
	if dir, err = b.liveDir(id); err != nil {
		done()
		return "", nil, err
	}
	return dir, done, nil
}

// liveDir returns the VM's directory if its process runs.
func (b *Backend) liveDir(id string) (string, error) {
	dir := b.dir(id)
	m, err := readMeta(dir)
	if err != nil {
		return "", err
	}
	if !processAlive(m.PID, dir) {
		return "", fmt.Errorf("qemu: %s: VM process %d is not running", id, m.PID)
	}
	return dir, nil
}

// processAlive tells whether pid is a live (not zombie) process running in
// dir — the identity check against PID reuse.
func processAlive(pid int, dir string) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
		return false
	}
	cwd, err := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// A jailed QEMU's working directory is its chroot, once it chrooted.
	return cwd == dir || cwd == filepath.Join(dir, jailRootDir)
}
