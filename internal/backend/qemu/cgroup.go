package qemu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
)

// Per-VM cgroups. With cgroup v2 as the unified hierarchy at /sys/fs/cgroup
// a VM gets <root>/<parent>/vm-<uid> with memory.max, pids.max and cpu.max,
// and QEMU is cloned straight into it (CLONE_INTO_CGROUP). Otherwise (v1,
// whatever v2 mount sits beside it, as on this project's test hosts) it gets
// <controller>/<parent>/vm-<uid> in each of the memory, pids and cpu
// hierarchies, and QEMU is forked from a thread that was first moved into
// them, so it is born there as well. Either way QEMU never runs outside its
// cgroup.
//
// QEMU also leaves the agent's cgroups in every other hierarchy: on v1 it
// is born in <parent> of each (freezer, devices, cpuset, name=systemd, ...)
// and, on a v1 host with a v2 hierarchy beside it, in <parent> there too.
// Whoever stops or freezes the agent by its cgroup (a container runtime
// stopping or pausing the agent's container, systemd stopping its unit)
// then does not reach the VMs.
//
// With HostScope (kairon-node --vm-scope=host, the agent in a container
// that shares the host's PID namespace) the hierarchies are the host's
// whole ones, which the agent mounts afresh (hostscope.go), rather than the
// container's view of /sys/fs/cgroup, which a runtime bind-mounts from the
// container's own cgroup. See docs/design/node-agent-lifecycle.md.

const cgroupRoot = "/sys/fs/cgroup"

const (
	cgroup2Magic = 0x63677270
	cgroup1Magic = 0x27e0eb
)

// cgroupSetup is the host's cgroup layout as a Backend uses it.
type cgroupSetup struct {
	v2     bool
	root   string // cgroupRoot, or hostCgroupRoot (HostScope)
	hostNS bool   // fork QEMU from PID 1's cgroup namespace (HostScope in a cgroup namespace)
	// hostScope makes leaving the agent's cgroups in every hierarchy a
	// must rather than a best effort.
	hostScope bool
	parent    string // relative to each hierarchy's root
	// v1Roots are the memory, pids and cpu hierarchies' mount points.
	v1Roots []string
	// others are the mount points of the v1 hierarchies without limits
	// (QEMU enters <parent> in each), and unified a v2 hierarchy beside
	// them ("" if none).
	others  []string
	unified string
}

var v1Controllers = []string{"memory", "pids", "cpu"}

type cgroupLimits struct {
	memoryBytes int64
	pids        int64
	cpuMilli    int64 // thousandths of a CPU
}

const cpuPeriodUS = 100000

// detectCgroups finds out which cgroup version manages the controllers.
func detectCgroups(parent string) (*cgroupSetup, error) { return detectCgroupsIn(parent, false) }

// detectCgroupsIn is detectCgroups in the host's hierarchies with host
// (HostScope), in the agent's view of /sys/fs/cgroup without.
func detectCgroupsIn(parent string, host bool) (*cgroupSetup, error) {
	if strings.Contains(parent, "..") || filepath.IsAbs(parent) {
		return nil, fmt.Errorf("qemu: --cgroup-parent %q: must be a relative path without \"..\"", parent)
	}
	root, hostNS := cgroupRoot, false
	if host {
		var err error
		if root, hostNS, err = mountHostCgroups(); err != nil {
			return nil, err
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err != nil {
		return nil, fmt.Errorf("qemu: cgroups: %w", err)
	}
	if st.Type == cgroup2Magic {
		s := &cgroupSetup{v2: true, root: root, hostNS: hostNS, hostScope: host, parent: parent}
		if err := s.enableV2(); err != nil {
			return nil, err
		}
		return s, nil
	}
	s := &cgroupSetup{root: root, hostNS: hostNS, hostScope: host, parent: parent}
	for _, c := range v1Controllers {
		r := filepath.Join(root, c)
		if err := syscall.Statfs(r, &st); err != nil || st.Type != cgroup1Magic {
			return nil, fmt.Errorf("qemu: cgroups: neither a cgroup v2 hierarchy at %s nor a v1 %s controller at %s", root, c, r)
		}
		s.v1Roots = append(s.v1Roots, r)
	}
	if err := s.findOthers(); err != nil {
		return nil, err
	}
	return s, nil
}

// findOthers lists the hierarchies mounted under s.root besides memory,
// pids and cpu (a directory shared by several controllers, "cpu,cpuacct",
// counts once).
func (s *cgroupSetup) findOthers() error {
	entries, err := os.ReadDir(s.root)
	if err != nil {
		return fmt.Errorf("qemu: cgroups: %w", err)
	}
	var limited []os.FileInfo
	for _, r := range s.v1Roots {
		fi, err := os.Stat(r)
		if err != nil {
			return fmt.Errorf("qemu: cgroups: %w", err)
		}
		limited = append(limited, fi)
	}
	seen := map[string]bool{}
	for _, e := range entries {
		p := filepath.Join(s.root, e.Name())
		fi, err := os.Stat(p) // through symlinks (cpu -> cpu,cpuacct)
		if err != nil || !fi.IsDir() {
			continue
		}
		var st syscall.Statfs_t
		if syscall.Statfs(p, &st) != nil || (st.Type != cgroup1Magic && st.Type != cgroup2Magic) {
			continue
		}
		same := false
		for _, l := range limited {
			same = same || os.SameFile(fi, l)
		}
		target, err := filepath.EvalSymlinks(p)
		if same || err != nil || seen[target] {
			continue
		}
		seen[target] = true
		if st.Type == cgroup2Magic {
			s.unified = p
		} else {
			s.others = append(s.others, p)
		}
	}
	return nil
}

// otherDir makes <parent> in the v1 hierarchy h ready to take a task: a
// new cpuset has neither CPUs nor memory nodes until given its parent's.
func (s *cgroupSetup) otherDir(h string) (string, error) {
	dir := h
	for _, part := range strings.Split(s.parent, "/") {
		parentDir := dir
		dir = filepath.Join(dir, part)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return "", fmt.Errorf("qemu: cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			cur, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil || strings.TrimSpace(string(cur)) != "" {
				continue // not a cpuset, or set already
			}
			v, err := os.ReadFile(filepath.Join(parentDir, f))
			if err != nil {
				return "", err
			}
			if err := os.WriteFile(filepath.Join(dir, f), v, 0); err != nil {
				return "", fmt.Errorf("qemu: cgroup %s: %w", filepath.Join(dir, f), err)
			}
		}
	}
	return dir, nil
}

// enableV2 makes the memory, pids and cpu controllers available to the
// VMs' cgroups, from the root down to parent.
func (s *cgroupSetup) enableV2() error {
	dir := s.root
	for _, part := range append([]string{""}, strings.Split(s.parent, "/")...) {
		if part != "" {
			dir = filepath.Join(dir, part)
			if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("qemu: cgroup %s: %w", dir, err)
			}
		}
		err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0)
		if errors.Is(err, syscall.EBUSY) && dir == cgroupRoot && s.root == cgroupRoot {
			// A container's own cgroup seen as the root (cgroup namespace)
			// holds the agent, and a v2 cgroup with processes cannot hand
			// controllers down. The agent moves into a leaf beside the VMs,
			// as kind and systemd in containers do.
			if err = evacuateRoot(); err == nil {
				err = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +pids +cpu"), 0)
			}
		}
		if err != nil {
			return fmt.Errorf("qemu: enabling the memory, pids and cpu controllers in %s: %w (the agent's own cgroup cannot delegate them; give it a cgroup parent outside it with --cgroup-parent)", dir, err)
		}
	}
	return nil
}

// agentLeaf is where evacuateRoot moves the processes of the root cgroup.
const agentLeaf = "kairon-agent"

// evacuateRoot moves every process of the (namespaced) root cgroup into
// agentLeaf.
func evacuateRoot() error {
	leaf := filepath.Join(cgroupRoot, agentLeaf)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	pids, err := cgroupProcs(cgroupRoot)
	if err != nil {
		return err
	}
	for _, pid := range pids {
		err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
		if err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("moving process %d into %s: %w", pid, leaf, err)
		}
	}
	return nil
}

// dirs are the directories of the VM cgroup called name.
func (s *cgroupSetup) dirs(name string) []string {
	if s.v2 {
		return []string{filepath.Join(s.root, s.parent, name)}
	}
	var out []string
	for _, root := range s.v1Roots {
		out = append(out, filepath.Join(root, s.parent, name))
	}
	return out
}

// inUse tells whether a cgroup called name holds a process in any hierarchy.
func (s *cgroupSetup) inUse(name string) bool {
	for _, d := range s.dirs(name) {
		if procs, err := cgroupProcs(d); err == nil && len(procs) > 0 {
			return true
		}
	}
	return false
}

// create makes the VM's cgroup(s) called name with limits, and returns
// their directories. An empty leftover of the same name (a crashed agent's)
// is replaced; one that holds processes is an error.
func (s *cgroupSetup) create(name string, l cgroupLimits) ([]string, error) {
	var dirs []string
	roots := s.v1Roots
	if s.v2 {
		roots = []string{s.root}
	}
	for _, root := range roots {
		parent := filepath.Join(root, s.parent)
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return dirs, err
		}
		d := filepath.Join(parent, name)
		// claimUID passed over names whose cgroup holds processes: an
		// empty one is a crashed agent's leftover.
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, syscall.ENOENT) {
			return dirs, fmt.Errorf("qemu: cgroup %s exists and cannot be removed: %w", d, err)
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			return dirs, fmt.Errorf("qemu: cgroup %s: %w", d, err)
		}
		dirs = append(dirs, d)
	}
	quota := l.cpuMilli * cpuPeriodUS / 1000
	var files [][2]string
	if s.v2 {
		d := dirs[0]
		files = [][2]string{
			{filepath.Join(d, "memory.max"), strconv.FormatInt(l.memoryBytes, 10)},
			{filepath.Join(d, "memory.swap.max"), "0"},
			{filepath.Join(d, "pids.max"), strconv.FormatInt(l.pids, 10)},
			{filepath.Join(d, "cpu.max"), fmt.Sprintf("%d %d", quota, cpuPeriodUS)},
		}
	} else {
		files = [][2]string{
			{filepath.Join(dirs[0], "memory.limit_in_bytes"), strconv.FormatInt(l.memoryBytes, 10)},
			// Memory plus swap: no swapping past the cap.
			{filepath.Join(dirs[0], "memory.memsw.limit_in_bytes"), strconv.FormatInt(l.memoryBytes, 10)},
			{filepath.Join(dirs[1], "pids.max"), strconv.FormatInt(l.pids, 10)},
			{filepath.Join(dirs[2], "cpu.cfs_period_us"), strconv.Itoa(cpuPeriodUS)},
			{filepath.Join(dirs[2], "cpu.cfs_quota_us"), strconv.FormatInt(quota, 10)},
		}
	}
	for _, f := range files {
		if err := os.WriteFile(f[0], []byte(f[1]), 0); err != nil {
			if errors.Is(err, os.ErrNotExist) && (strings.HasSuffix(f[0], "memory.swap.max") || strings.HasSuffix(f[0], "memory.memsw.limit_in_bytes")) {
				continue // no swap accounting on this host: nothing to cap
			}
			return dirs, fmt.Errorf("qemu: cgroup limit %s: %w", f[0], err)
		}
	}
	return dirs, nil
}

// spawn starts cmd in the cgroups dirs (as create returned them), in
// working directory wd. It forks from a thread of its own that it gives
// both first, and that ends with it, so QEMU is born in its cgroups (v1
// cannot clone into a cgroup, but a single thread may move through the
// tasks file, and a child is born in its parent thread's cgroups) and in
// its directory: Go would chdir only after dropping to the VM's uid, which
// may not search the directories above. cmd.Dir must be empty.
//
// onThread, if set, runs on that thread just before the fork, for more of
// what a thread hands down to a child (the capability bounding set).
func (s *cgroupSetup) spawn(cmd *exec.Cmd, wd string, dirs []string, onThread func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the runtime ends the thread with this goroutine
		// rather than run others with this working directory and cgroups.
		runtime.LockOSThread()
		errc <- s.spawnOnThread(cmd, wd, dirs, onThread)
	}()
	return <-errc
}

func (s *cgroupSetup) spawnOnThread(cmd *exec.Cmd, wd string, dirs []string, onThread func() error) error {
	start := func() error {
		if onThread != nil {
			if err := onThread(); err != nil {
				return err
			}
		}
		return cmd.Start()
	}
	if err := syscall.Unshare(syscall.CLONE_FS); err != nil {
		return fmt.Errorf("qemu: unshare CLONE_FS: %w", err)
	}
	if err := syscall.Chdir(wd); err != nil {
		return fmt.Errorf("qemu: chdir %s: %w", wd, err)
	}
	if s.hostNS {
		// The host's cgroup namespace, for this thread only: a cgroup
		// outside the container's may be entered only from a namespace
		// whose root is above both.
		if err := enterHostCgroupNS(); err != nil {
			return err
		}
	}
	if s.v2 {
		fd, err := syscall.Open(dirs[0], syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("qemu: cgroup %s: %w", dirs[0], err)
		}
		defer syscall.Close(fd)
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = fd
		return start()
	}
	tid := strconv.Itoa(syscall.Gettid())
	home, err := threadCgroups(tid)
	if err != nil {
		return err
	}
	// Back home after the fork, so that the agent leaves the VM's cgroups
	// at once rather than when the runtime gets to end this thread.
	defer func() {
		for i, c := range v1Controllers {
			if p, ok := home[c]; ok {
				_ = os.WriteFile(filepath.Join(s.v1Roots[i], p, "tasks"), []byte(tid), 0)
			}
		}
	}()
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "tasks"), []byte(tid), 0); err != nil {
			return fmt.Errorf("qemu: entering cgroup %s: %w", d, err)
		}
	}
	// The hierarchies without limits: QEMU leaves the agent's cgroups there
	// too. Required with HostScope, where it is the point; elsewhere (a
	// read-only hierarchy, say) QEMU may stay in the agent's.
	done, err := s.leaveAgentCgroups(cmd, tid)
	if err != nil && s.hostScope {
		return err
	}
	defer done()
	return start()
}

// leaveAgentCgroups moves thread tid into <parent> of every v1 hierarchy
// without limits (the thread ends with the fork, so it need not go back),
// and has cmd cloned into <parent> of a v2 hierarchy beside them, whose
// cgroups take whole processes, never one thread. Call done after the fork.
func (s *cgroupSetup) leaveAgentCgroups(cmd *exec.Cmd, tid string) (done func(), err error) {
	done = func() {}
	for _, h := range s.others {
		d, err := s.otherDir(h)
		if err != nil {
			return done, err
		}
		if err := os.WriteFile(filepath.Join(d, "tasks"), []byte(tid), 0); err != nil {
			return done, fmt.Errorf("qemu: entering cgroup %s: %w", d, err)
		}
	}
	if s.unified == "" {
		return done, nil
	}
	d := filepath.Join(s.unified, s.parent)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return done, fmt.Errorf("qemu: cgroup %s: %w", d, err)
	}
	fd, err := syscall.Open(d, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return done, fmt.Errorf("qemu: cgroup %s: %w", d, err)
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = fd
	return func() { syscall.Close(fd) }, nil
}

// threadCgroups reads a thread's v1 cgroup paths, by controller.
func threadCgroups(tid string) (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/task/" + tid + "/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

// memoryOOM reads, from a VM's cgroup directories (as create returned
// them), how many processes its memory cgroup's OOM killer killed and the
// memory limit it enforces. ok is false where neither can be read (the
// cgroup is gone, or the kernel does not count its kills).
func memoryOOM(dirs []string) (kills, limit int64, ok bool) {
	for _, d := range dirs {
		// v2 counts kills in memory.events, v1 in memory.oom_control.
		for _, f := range [][2]string{{"memory.events", "memory.max"}, {"memory.oom_control", "memory.limit_in_bytes"}} {
			b, err := os.ReadFile(filepath.Join(d, f[0]))
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(b), "\n") {
				if v, found := strings.CutPrefix(line, "oom_kill "); found {
					kills, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					ok = err == nil
				}
			}
			if l, err := os.ReadFile(filepath.Join(d, f[1])); err == nil {
				limit, _ = strconv.ParseInt(strings.TrimSpace(string(l)), 10, 64)
			}
			return kills, limit, ok
		}
	}
	return 0, 0, false
}
