package qemu

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// QEMU's capability bounding set. A jailed QEMU holds CAP_SYS_CHROOT and
// nothing else, but the bounding set is what limits every capability a
// process could ever gain (a file capability, a set-uid-root binary): left
// full, as a process inherits it, it is one kernel bug or one executable
// away from all of them. So the bounding set is emptied of all but what
// QEMU holds.
//
// Go's SysProcAttr cannot drop from the bounding set, but the bounding set
// is a property of a thread, and a child gets its parent thread's. QEMU is
// forked from a thread of its own (cgroupSetup.spawn), which drops the
// bounding set before the fork and is thrown away after it, so no other
// goroutine ever runs with it, and the Go runtime starts no thread from a
// locked one (it asks a clean thread to). Dropping only limits: the thread
// keeps its effective capabilities for the little it still does as root
// (moving back to its cgroups), and CAP_SYS_CHROOT stays in the bounding
// set so that the fork can raise it as QEMU's ambient capability.

// jailBoundingSet is all a jailed QEMU's bounding set holds: QEMU's own
// -chroot needs CAP_SYS_CHROOT. It cannot be done for QEMU before the exec:
// QEMU chroots only once it has loaded its libraries, the guest's kernel
// (through /proc/self/fd) and opened its sockets and logs, none of which
// the empty jail holds.
var jailBoundingSet = []int{capSysChroot}

// lastCap is the highest capability the running kernel knows.
func lastCap() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return 0, fmt.Errorf("qemu: the kernel's last capability: %w", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0, fmt.Errorf("qemu: the kernel's last capability %q: %w", b, err)
	}
	return n, nil
}

// dropBoundingSet removes every capability but keep from the calling
// thread's bounding set (and so from that of every process it forks). The
// caller must be on a locked OS thread it never unlocks.
func dropBoundingSet(keep []int) error {
	last, err := lastCap()
	if err != nil {
		return err
	}
	for c := 0; c <= last; c++ {
		if slices.Contains(keep, c) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
			return fmt.Errorf("qemu: dropping capability %d from the bounding set: %w", c, err)
		}
	}
	return nil
}
