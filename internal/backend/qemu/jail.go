package qemu

import (
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/zyvor/kairon/internal/backend"
)

// The VM jail. A guest that breaks out of its VM lands in QEMU, so every
// QEMU a Backend starts for a Machine runs:
//   - as a uid and gid of its own, taken from a host-wide range and recorded
//     in StateDir/<id>/jail.json, no supplementary group but /dev/kvm's;
//   - with no capability but CAP_SYS_CHROOT, which only QEMU's own -chroot
//     uses (QEMU 7.2's seccomp filter is installed before -runas would drop
//     privileges, so with elevateprivileges=deny QEMU cannot drop them
//     itself: it is killed by SIGSYS at setgid; it starts unprivileged
//     instead), and a bounding set of that one capability too, so that
//     nothing can ever give it another (capabilities.go);
//   - chrooted, once it has loaded the kernel and opened its devices, into
//     StateDir/<id>/jail: an empty directory owned by root that it can
//     neither write nor leave (nothing in it to chroot into, no directory
//     descriptor to fchdir to);
//   - under QEMU's seccomp filter with every optional group denied;
//   - in network, IPC, UTS, mount and PID namespaces of its own: its only
//     network is the tap, passed in as a descriptor; it sees no process but
//     itself (it is PID 1 of its namespace), and its mount table is a copy
//     it cannot change (jailProcAttr says what it keeps and why);
//   - in a cgroup of its own capping memory, pids and CPU, entered at the
//     fork, so not one instruction of QEMU runs outside it;
//   - with an empty environment.

const (
	// jailFile records a VM's jail, for an agent that adopts it.
	jailFile = "jail.json"
	// jailRootDir is the empty directory QEMU chroots into.
	jailRootDir = "jail"

	// DefaultJailUIDBase and DefaultJailUIDCount are the uids (and gids)
	// VMs run as: far above any range a distribution or a container runtime
	// hands out.
	DefaultJailUIDBase  = 2_000_000_000
	DefaultJailUIDCount = 65536
	// DefaultJailRegistry holds one file per uid in use on the host, so
	// that two agents on one host (kairon-local) never hand out one uid twice.
	DefaultJailRegistry = "/run/kairon/vm-uids"
	// DefaultCgroupParent is the cgroup under which each VM gets its own.
	DefaultCgroupParent = "kairon"
	// DefaultMemoryOverheadMiB is what QEMU may use beyond the guest's
	// memory: its own heap, device state and, under TCG, translated code
	// (bounded by tcgTBSizeMiB).
	DefaultMemoryOverheadMiB = 256

	capSysChroot = 18
	// sandboxOpts is QEMU's seccomp filter with every optional group denied.
	sandboxOpts = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
)

// jailRecord is jail.json.
type jailRecord struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
	// Groups are QEMU's supplementary groups: /dev/kvm's group under KVM.
	Groups []uint32 `json:"groups,omitempty"`
	// Cgroups are the VM's cgroup directories, one per hierarchy.
	Cgroups []string `json:"cgroups"`
}

// jailConfig is how a Backend jails its VMs; nil when Options.NoJail.
type jailConfig struct {
	uidBase, uidCount uint32
	registry          string
	// stateDir is the backend's own (absolute) state directory: the
	// registry is the host's, shared with every other agent on it.
	stateDir    string
	cgroups     *cgroupSetup
	overheadMiB int64
	kvmGroup    uint32 // 0: none (then /dev/kvm is unusable for VMs)
	kvmErr      error  // why jailed VMs cannot open /dev/kvm
}

func newJailConfig(opts Options) (*jailConfig, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("qemu: the VM jail needs root (a uid per VM, chroot, cgroups); run the node agent as root, or pass --qemu-no-jail to run VMs unconfined as the agent's own user")
	}
	j := &jailConfig{
		uidBase: opts.JailUIDBase, uidCount: opts.JailUIDCount, registry: opts.JailRegistry,
		overheadMiB: opts.MemoryOverheadMiB, stateDir: opts.StateDir,
	}
	if j.uidBase == 0 {
		j.uidBase = DefaultJailUIDBase
	}
	if j.uidCount == 0 {
		j.uidCount = DefaultJailUIDCount
	}
	if uint64(j.uidBase)+uint64(j.uidCount) > 1<<31 {
		return nil, fmt.Errorf("qemu: jail uid range %d+%d reaches past 2^31", j.uidBase, j.uidCount)
	}
	if j.registry == "" {
		j.registry = DefaultJailRegistry
	}
	if j.overheadMiB <= 0 {
		j.overheadMiB = DefaultMemoryOverheadMiB
	}
	if err := os.MkdirAll(j.registry, 0o700); err != nil {
		return nil, fmt.Errorf("qemu: jail uid registry: %w", err)
	}
	parent := opts.CgroupParent
	if parent == "" {
		parent = DefaultCgroupParent
	}
	cg, err := detectCgroupsIn(parent, opts.HostScope)
	if err != nil {
		return nil, err
	}
	j.cgroups = cg
	j.kvmGroup, j.kvmErr = kvmGroupFor("/dev/kvm")
	if err := j.sweepStale(); err != nil {
		return nil, err
	}
	return j, nil
}

// sweepStale removes the claims, and the cgroups, of uids whose VM directory
// no longer records them: what an agent that died while stopping a VM, or
// whose state directory was deleted under it, left behind. A VM that still
// runs is killed only if it is this backend's own: the registry is shared
// by every agent on the host, and another agent's VM directory may simply
// not be visible from here (an agent in a container sees its own mounts),
// which must not read as "gone" and get that agent's VMs killed.
func (j *jailConfig) sweepStale() error {
	unlock, err := j.lockRegistry()
	if err != nil {
		return err
	}
	defer unlock()
	ents, err := os.ReadDir(j.registry)
	if err != nil {
		return err
	}
	for _, e := range ents {
		uid, err := strconv.ParseUint(e.Name(), 10, 32)
		if err != nil {
			continue
		}
		path := filepath.Join(j.registry, e.Name())
		owner, err := os.ReadFile(path)
		if err != nil || uidHeldBy(string(owner), uint32(uid)) {
			continue
		}
		if !j.owns(string(owner)) && j.cgroups.inUse(cgroupName(uint32(uid))) {
			// Another agent's VM that runs, whose directory is out of
			// sight from here: its agent judges it. (One whose cgroup
			// is empty is a leftover whoever it was, and goes.)
			continue
		}
		for _, d := range j.cgroups.dirs(cgroupName(uint32(uid))) {
			if err := removeCgroup(d); err != nil {
				return err
			}
		}
		_ = os.Remove(path)
	}
	return nil
}

// othersCanRead checks that a uid of neither the owner nor the group of
// the file at path may read it: QEMU reopens the guest's kernel and initrd
// through the descriptors it inherits (/proc/self/fd/N), which checks the
// file's own mode, though not the directories above it.
func othersCanRead(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o004 == 0 {
		return fmt.Errorf("%s is mode %s: the VMs' own uids cannot read it (make it world-readable, 0644)", path, fi.Mode().Perm())
	}
	return nil
}

// kvmGroupFor is the group through which an unprivileged QEMU may open the
// KVM device at path. QEMU 7.2 has no option to take /dev/kvm as a
// descriptor, so each VM gets the device's group as its one supplementary
// group; a device only root may open leaves jailed VMs without KVM.
func kvmGroupFor(path string) (uint32, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	mode := fi.Mode().Perm()
	switch {
	case mode&0o006 == 0o006:
		return 0, nil
	case mode&0o060 == 0o060 && st.Gid != 0:
		return st.Gid, nil
	}
	return 0, fmt.Errorf("%s is %s owned by %d:%d: jailed VMs (own uids) cannot open it; give it a group of its own with rw (Debian: root:kvm 0660)", path, mode, st.Uid, st.Gid)
}

// prepare gives the VM in dir its jail: a uid, its directory owned by it,
// the empty chroot, a cgroup sized for spec. What it did is undone by
// teardown(dir), which works from jail.json.
func (j *jailConfig) prepare(dir string, spec backend.Spec, accel string) (*jailRecord, error) {
	for _, f := range []string{spec.Kernel, spec.Initrd} {
		if f == "" {
			continue
		}
		if err := othersCanRead(f); err != nil {
			return nil, fmt.Errorf("guest image: %w", err)
		}
	}
	uid, err := j.claimUID(dir)
	if err != nil {
		return nil, err
	}
	rec := &jailRecord{UID: uid, GID: uid}
	if accel == "kvm" && j.kvmGroup != 0 {
		rec.Groups = []uint32{j.kvmGroup}
	}
	// Written at once, under the uid's claim, so that teardown can release
	// the uid whatever fails next.
	if err := writeJSON(filepath.Join(dir, jailFile), rec); err != nil {
		j.releaseUID(uid, dir)
		return nil, err
	}
	root := filepath.Join(dir, jailRootDir)
	if err := os.Mkdir(root, 0o111); err != nil {
		return rec, err
	}
	// Root's own chmod: Mkdir's mode passes through the umask.
	if err := os.Chmod(root, 0o111); err != nil {
		return rec, err
	}
	// QEMU creates its sockets, pidfile and console log here before it
	// chroots; other VMs' uids cannot enter.
	if err := os.Chown(dir, int(uid), int(uid)); err != nil {
		return rec, err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return rec, err
	}
	memMax := (spec.MemoryMiB + j.overheadMiB) << 20
	paths, err := j.cgroups.create(cgroupName(uid), cgroupLimits{
		memoryBytes: memMax, pids: cgroupPids, cpuMilli: int64(spec.CPU)*1000 + 500,
	})
	rec.Cgroups = paths
	if werr := writeJSON(filepath.Join(dir, jailFile), rec); err == nil {
		err = werr
	}
	return rec, err
}

// cgroupPids caps QEMU's threads: a vCPU thread each, its I/O and RCU
// threads, and a worker pool of at most 64.
const cgroupPids = 256

func cgroupName(uid uint32) string { return "vm-" + strconv.FormatUint(uint64(uid), 10) }

// teardown removes the jail of the VM in dir, whose process is gone or about
// to be: whatever still runs in its cgroup is killed first, so that the uid
// is never handed out while a process of it runs.
func (j *jailConfig) teardown(dir string) error {
	var rec jailRecord
	if err := readJSON(filepath.Join(dir, jailFile), &rec); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	var errs []error
	for _, p := range rec.Cgroups {
		if err := removeCgroup(p); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 && rec.UID != 0 {
		j.releaseUID(rec.UID, dir)
	}
	return errors.Join(errs...)
}

// claimUID takes a free uid for the VM in dir from the host-wide registry:
// a file per uid naming the VM directory that holds it. A claim whose VM
// directory no longer records that uid is stale (its agent died mid-stop)
// and is taken over. The search starts at a hash of dir, so a VM usually
// gets the same uid back.
func (j *jailConfig) claimUID(dir string) (uint32, error) {
	unlock, err := j.lockRegistry()
	if err != nil {
		return 0, err
	}
	defer unlock()
	h := fnv.New32a()
	h.Write([]byte(dir))
	start := h.Sum32() % j.uidCount
	for i := uint32(0); i < j.uidCount; i++ {
		uid := j.uidBase + (start+i)%j.uidCount
		path := filepath.Join(j.registry, strconv.FormatUint(uint64(uid), 10))
		if owner, err := os.ReadFile(path); err == nil {
			if uidHeldBy(string(owner), uid) {
				continue
			}
			if err := os.Remove(path); err != nil {
				return 0, err
			}
		}
		// A registry that did not survive (a container's /run) knows
		// nothing of the VMs still running: their cgroups do.
		if j.cgroups != nil && j.cgroups.inUse(cgroupName(uid)) {
			continue
		}
		if err := os.WriteFile(path, []byte(dir), 0o600); err != nil {
			return 0, fmt.Errorf("qemu: claiming uid %d: %w", uid, err)
		}
		return uid, nil
	}
	return 0, fmt.Errorf("qemu: all %d jail uids from %d are in use", j.uidCount, j.uidBase)
}

// uidHeldBy tells whether the VM directory owner still records uid.
// owns tells whether the VM directory dir is one of this backend's.
func (j *jailConfig) owns(dir string) bool {
	if j.stateDir == "" || !filepath.IsAbs(dir) {
		return false
	}
	rel, err := filepath.Rel(j.stateDir, dir)
	return err == nil && rel != "." && !strings.HasPrefix(rel, "..")
}

func uidHeldBy(owner string, uid uint32) bool {
	var rec jailRecord
	if err := readJSON(filepath.Join(owner, jailFile), &rec); err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	return rec.UID == uid
}

func (j *jailConfig) releaseUID(uid uint32, dir string) {
	unlock, err := j.lockRegistry()
	if err != nil {
		return
	}
	defer unlock()
	path := filepath.Join(j.registry, strconv.FormatUint(uint64(uid), 10))
	if owner, err := os.ReadFile(path); err == nil && string(owner) == dir {
		_ = os.Remove(path)
	}
}

func (j *jailConfig) lockRegistry() (func(), error) {
	f, err := os.OpenFile(filepath.Join(j.registry, ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("qemu: jail uid registry: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("qemu: jail uid registry: %w", err)
	}
	return func() { f.Close() }, nil
}

// jailProcAttr is how launch starts a jailed QEMU (whose bounding set the
// forking thread empties first: capabilities.go).
//
// The namespaces: network, IPC and UTS of its own; a mount namespace, a
// copy of the agent's whose mounts stay peers of the agent's where the
// agent's are shared (so an unmount on the host reaches the copy, rather
// than the copy pinning what the host let go), in which QEMU, unprivileged,
// can mount nothing; and a PID namespace, in which QEMU is PID 1 and sees
// no other process. The agent still knows QEMU by its PID in the agent's
// namespace, which is what the fork returns and what the pidfile, an
// adopting agent and kill(2) use. As PID 1 QEMU receives from outside only
// the signals it handles (SIGTERM, SIGINT, SIGHUP) and SIGKILL, which is
// all Stop sends; and an abort() in QEMU ends it by SIGSEGV rather than
// SIGABRT (PID 1 ignores its own SIGABRT, so glibc falls back to a fault).
//
// It keeps the agent's user namespace: a user namespace of its own would
// make QEMU root of it, with every capability over the namespaces it owns,
// and open the kernel's code reachable only to such an owner (netfilter,
// mounts of some file systems) to a QEMU taken over. Its uid and its
// bounding set confine it better where it is.
func jailProcAttr(rec *jailRecord) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Setsid:      true,
		Credential:  &syscall.Credential{Uid: rec.UID, Gid: rec.GID, Groups: rec.Groups},
		AmbientCaps: []uintptr{capSysChroot},
		Cloneflags: syscall.CLONE_NEWNET | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS |
			syscall.CLONE_NEWNS | syscall.CLONE_NEWPID,
	}
}

// jailArgs are the QEMU options that confine it once it is set up.
// The chroot is relative: QEMU's uid may not search the directories above
// its working directory, the VM's.
func jailArgs() []string {
	return []string{"-sandbox", sandboxOpts, "-chroot", jailRootDir}
}

// openTap opens the tap named name (in network namespace netns, if set) the
// way QEMU would, for QEMU to take as a descriptor: a jailed QEMU has
// neither the privilege nor the network namespace to open it by name.
func openTap(name, netns string) (*os.File, error) {
	if len(name) >= syscall.IFNAMSIZ {
		return nil, fmt.Errorf("qemu: tap name %q too long", name)
	}
	type result struct {
		f   *os.File
		err error
	}
	ch := make(chan result, 1)
	go func() {
		if netns == "" {
			f, err := attachTap(name)
			ch <- result{f, err}
			return
		}
		// This thread enters the namespace and is never unlocked: it dies
		// with the goroutine rather than serve others from inside netns.
		runtime.LockOSThread()
		ns, err := os.Open(filepath.Join("/run/netns", netns))
		if err != nil {
			ch <- result{nil, fmt.Errorf("qemu: network namespace %q: %w", netns, err)}
			return
		}
		defer ns.Close()
		if err := setns(int(ns.Fd()), syscall.CLONE_NEWNET); err != nil {
			ch <- result{nil, fmt.Errorf("qemu: entering network namespace %q: %w", netns, err)}
			return
		}
		f, err := attachTap(name)
		ch <- result{f, err}
	}()
	r := <-ch
	return r.f, r.err
}

func setns(fd, nstype int) error {
	const sysSetns = 308 // x86_64
	if _, _, e := syscall.RawSyscall(sysSetns, uintptr(fd), uintptr(nstype), 0); e != 0 {
		return e
	}
	return nil
}

func attachTap(name string) (*os.File, error) {
	fd, err := syscall.Open("/dev/net/tun", syscall.O_RDWR|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("qemu: open /dev/net/tun: %w", err)
	}
	const (
		iffTap     = 0x0002
		iffNoPI    = 0x1000
		iffVnetHdr = 0x4000
		tunSetIff  = 0x400454ca
	)
	var req [40]byte // struct ifreq
	copy(req[:syscall.IFNAMSIZ-1], name)
	*(*uint16)(unsafe.Pointer(&req[syscall.IFNAMSIZ])) = iffTap | iffNoPI | iffVnetHdr
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), tunSetIff, uintptr(unsafe.Pointer(&req[0]))); e != 0 {
		syscall.Close(fd)
		return nil, fmt.Errorf("qemu: attach to tap %q: %w", name, e)
	}
	return os.NewFile(uintptr(fd), "tap:"+name), nil
}

// waitCgroupEmpty is how long teardown waits for killed processes to leave.
const waitCgroupEmpty = 10 * time.Second

// cgroupProcs lists the processes in the cgroup directory p.
func cgroupProcs(p string) ([]int, error) {
	b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids, nil
}

// removeCgroup kills what runs in the cgroup at p and removes it.
func removeCgroup(p string) error {
	deadline := time.Now().Add(waitCgroupEmpty)
	for {
		pids, err := cgroupProcs(p)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		for _, pid := range pids {
			// On v1 the agent itself is listed while the thread that
			// forked QEMU from inside the cgroup has not ended yet.
			if pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		err = syscall.Rmdir(p)
		if err == nil || errors.Is(err, syscall.ENOENT) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("qemu: removing cgroup %s: %w (processes %v)", p, err, pids)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
