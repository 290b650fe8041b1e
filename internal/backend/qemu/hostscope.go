package qemu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// HostScope: VMs whose cgroups are the host's, outside the agent's
// container (kairon-node --vm-scope=host; docs/design/node-agent-lifecycle.md).
//
// A container runtime shows a container /sys/fs/cgroup/<hierarchy> as
// bind mounts of the container's own cgroup, so a cgroup made there is
// inside the container's and goes when the runtime stops or kills it. The
// agent mounts every hierarchy it is a member of afresh at hostCgroupRoot
// instead: a new mount of a hierarchy shows it from the root of the
// mounter's cgroup namespace, which is the host's root unless the
// container has a cgroup namespace of its own (cgroup v2 hosts, usually).
// Then the agent mounts from a thread that entered PID 1's cgroup
// namespace, and forks QEMU from one too (cgroup.go), since a cgroup
// outside a namespace can be entered only from a namespace above it.
//
// VMs outlive the container only if they are not in its PID namespace
// either (whose end kills everything in it): the agent must share the
// host's (hostPID: true), which checkHostPIDNamespace checks where it can.

// hostCgroupRoot is where the agent mounts the host's hierarchies, in its
// own mount namespace; a restarted agent mounts them at the same place, so
// the VMs' recorded cgroup paths stay valid.
const hostCgroupRoot = "/run/kairon-host-cgroup"

// mountHostCgroups mounts the host's hierarchies at hostCgroupRoot, unless
// they are already, and tells whether QEMU must be forked from PID 1's
// cgroup namespace.
func mountHostCgroups() (root string, hostNS bool, err error) {
	if err := checkHostPIDNamespace(); err != nil {
		return "", false, err
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false, fmt.Errorf("qemu: --vm-scope=host: %w", err)
	}
	type hierarchy struct{ dir, fstype, opts string }
	var hs []hierarchy
	v1, inNamespace := false, true
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[2] != "/" {
			// A container without a cgroup namespace sees its cgroup's
			// path from the host's root.
			inNamespace = false
		}
		switch {
		case parts[1] == "":
			hs = append(hs, hierarchy{"unified", "cgroup2", ""})
		case strings.HasPrefix(parts[1], "name="):
			v1 = true
			hs = append(hs, hierarchy{strings.TrimPrefix(parts[1], "name="), "cgroup", "none," + parts[1]})
		default:
			v1 = true
			hs = append(hs, hierarchy{parts[1], "cgroup", parts[1]})
		}
	}
	if len(hs) == 0 {
		return "", false, errors.New("qemu: --vm-scope=host: /proc/self/cgroup names no hierarchy")
	}
	if !v1 {
		// Pure v2: the one hierarchy is the root itself.
		hs[0].dir = ""
	}
	mount := func() error {
		for _, h := range hs {
			dir := filepath.Join(hostCgroupRoot, h.dir)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			var st syscall.Statfs_t
			if syscall.Statfs(dir, &st) == nil && (st.Type == cgroup1Magic || st.Type == cgroup2Magic) {
				continue // mounted already
			}
			if err := unix.Mount("cgroup", dir, h.fstype, unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, h.opts); err != nil {
				return fmt.Errorf("mounting the %s hierarchy %q at %s: %w", h.fstype, h.opts, dir, err)
			}
			// Co-mounted controllers (cpu,cpuacct) answer to each name, as
			// on a host.
			if names := strings.Split(h.dir, ","); len(names) > 1 {
				for _, n := range names {
					_ = os.Symlink(h.dir, filepath.Join(hostCgroupRoot, n))
				}
			}
		}
		return nil
	}
	if inNamespace {
		err = onThreadInHostCgroupNS(mount)
	} else {
		err = mount()
	}
	if err != nil {
		return "", false, fmt.Errorf("qemu: --vm-scope=host: %w", err)
	}
	return hostCgroupRoot, inNamespace, nil
}

// onThreadInHostCgroupNS runs fn on a thread of its own in PID 1's cgroup
// namespace; the thread is never unlocked, so Go discards it afterwards.
func onThreadInHostCgroupNS(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := enterHostCgroupNS(); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// enterHostCgroupNS moves the calling thread into PID 1's cgroup
// namespace.
func enterHostCgroupNS() error {
	fd, err := unix.Open("/proc/1/ns/cgroup", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("qemu: --vm-scope=host: the agent is in a cgroup namespace of its own and cannot enter the host's: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWCGROUP); err != nil {
		return fmt.Errorf("qemu: --vm-scope=host: entering the host's cgroup namespace: %w", err)
	}
	return nil
}

// checkHostPIDNamespace fails if the agent does not share PID 1's PID
// namespace. Where PID 1's namespace cannot be read (a host whose init
// hides from root), it cannot tell and lets it pass.
func checkHostPIDNamespace() error {
	self, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return fmt.Errorf("qemu: --vm-scope=host: %w", err)
	}
	init, err := os.Readlink("/proc/1/ns/pid")
	if errors.Is(err, os.ErrPermission) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("qemu: --vm-scope=host: %w", err)
	}
	if self != init {
		return errors.New("qemu: --vm-scope=host: the agent does not share the host's PID namespace (run its container with hostPID: true, podman --pid=host); its VMs would die with the container")
	}
	return nil
}
