package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// What kairon-local finds of its own processes in /proc: the VMs of a data
// dir, and the kairon-local that holds a data dir.
//
// A VM is a QEMU process (qemu-system-*) whose working directory is its
// state directory, DATA_DIR/nodes/<node>/instances/<namespace>_<machine>
// (the qemu backend runs it there), or the jail/ directory in it when QEMU
// is jailed (chrooted there, as an agent run as root does by default; see
// docs/guides/vm-isolation.md). Its command line names the Machine
// (-name namespace/machine) but not the data dir, so the working directory
// is what ties it to one. When that directory has been deleted, the kernel
// reports it with " (deleted)" appended.

// procRoot is where the process table is read; tests point it elsewhere.
var procRoot = "/proc"

// vmDirPattern matches a VM's state directory and captures its data dir.
var vmDirPattern = regexp.MustCompile(`^(/.*)/nodes/[^/]+/instances/[^/]+$`)

const deletedSuffix = " (deleted)"

// jailDir is the directory in a VM's state directory that a jailed QEMU
// runs in (internal/backend/qemu's jailRootDir).
const jailDir = "jail"

// vmProcess is one QEMU process of a kairon-local data dir.
type vmProcess struct {
	PID int
	// Name is the Machine, "namespace/name".
	Name string
	// Dir is the VM's state directory; DataDir the data dir it is in.
	Dir, DataDir string
	// Deleted: Dir was deleted while the VM ran (with its data dir, as a
	// rule), so no agent can adopt it again.
	Deleted bool
}

// parseVMProcess says whether a process, by its arguments and working
// directory, is a kairon-local VM, and which.
func parseVMProcess(pid int, argv []string, cwd string) (vmProcess, bool) {
	if len(argv) == 0 || !strings.HasPrefix(filepath.Base(argv[0]), "qemu-system") {
		return vmProcess{}, false
	}
	vm := vmProcess{PID: pid, Dir: cwd}
	if dir, ok := strings.CutSuffix(cwd, deletedSuffix); ok {
		vm.Dir, vm.Deleted = dir, true
	}
	vm.Dir = strings.TrimSuffix(vm.Dir, "/"+jailDir)
	m := vmDirPattern.FindStringSubmatch(vm.Dir)
	if m == nil {
		return vmProcess{}, false
	}
	vm.DataDir = m[1]
	for i, a := range argv {
		if a == "-name" && i+1 < len(argv) {
			// QEMU options double their commas; a Machine's name has none.
			vm.Name, _, _ = strings.Cut(argv[i+1], ",")
		}
	}
	return vm, true
}

// readArgv is a process's arguments, or nil if it is gone, a zombie or a
// kernel thread.
func readArgv(pid int) []string {
	dir := filepath.Join(procRoot, strconv.Itoa(pid))
	raw, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil || len(raw) == 0 {
		return nil
	}
	if stat, err := os.ReadFile(filepath.Join(dir, "stat")); err == nil {
		if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
			return nil
		}
	}
	return strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
}

// eachProcess calls fn with the PID and arguments of every process on
// this host but this one (zombies and kernel threads left out), until fn
// says stop.
func eachProcess(fn func(pid int, argv []string) (stop bool)) error {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if argv := readArgv(pid); argv != nil && fn(pid, argv) {
			return nil
		}
	}
	return nil
}

// findVMs lists the kairon-local VMs running on this host, by PID.
func findVMs() ([]vmProcess, error) {
	var vms []vmProcess
	err := eachProcess(func(pid int, argv []string) bool {
		cwd, err := os.Readlink(filepath.Join(procRoot, strconv.Itoa(pid), "cwd"))
		if err != nil {
			return false // gone, or not ours to look at
		}
		if vm, ok := parseVMProcess(pid, argv, cwd); ok {
			vms = append(vms, vm)
		}
		return false
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(vms, func(i, j int) bool { return vms[i].PID < vms[j].PID })
	return vms, nil
}

// vmsOf are the VMs of dataDir, deleted or not.
func vmsOf(vms []vmProcess, dataDir string) []vmProcess {
	var out []vmProcess
	for _, vm := range vms {
		if vm.DataDir == dataDir {
			out = append(out, vm)
		}
	}
	return out
}

// orphanGroup is the VMs of one data dir that no agent can adopt again.
type orphanGroup struct {
	DataDir string
	// Recreated: a data dir exists at that path again, but not the one
	// these VMs were started from.
	Recreated bool
	VMs       []vmProcess
}

// orphans groups the VMs whose data dir no longer exists, or was deleted
// and made anew (their own directory is gone), by data dir.
func orphans(vms []vmProcess, exists func(string) bool) []orphanGroup {
	var groups []orphanGroup
	index := map[string]int{}
	for _, vm := range vms {
		there := exists(vm.DataDir)
		if there && !vm.Deleted {
			continue
		}
		i, ok := index[vm.DataDir]
		if !ok {
			i = len(groups)
			index[vm.DataDir] = i
			groups = append(groups, orphanGroup{DataDir: vm.DataDir, Recreated: there})
		}
		groups[i].VMs = append(groups[i].VMs, vm)
	}
	return groups
}

func dirExists(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// warnOrphans tells about the VMs of data dirs that no longer exist:
// nothing manages them, and they cost memory and CPU until killed.
func warnOrphans(w io.Writer, groups []orphanGroup) {
	for _, g := range groups {
		var pids, names []string
		for _, vm := range g.VMs {
			pids = append(pids, strconv.Itoa(vm.PID))
			names = append(names, vm.Name)
		}
		what := "which no longer exists"
		if g.Recreated {
			what = "which was deleted since (the one there now is another)"
		}
		vms := "VM is"
		if len(g.VMs) > 1 {
			vms = "VMs are"
		}
		fmt.Fprintf(w, "kairon-local: warning: %d %s still running from data dir %s, %s: pid %s (%s).\n"+
			"  Nothing manages them and they use memory and CPU until stopped: kill %s\n",
			len(g.VMs), vms, g.DataDir, what, strings.Join(pids, ", "), strings.Join(names, ", "), strings.Join(pids, " "))
	}
}

// lockFile is the file `up` holds an flock on while it runs, with its pid
// in it (internal/controlplane).
func lockFile(dataDir string) string { return filepath.Join(dataDir, "lock") }

// flockHolders parses /proc/locks and returns the PIDs holding a FLOCK on
// the file with inode ino on device major:minor (waiters, "->" lines, are
// not holders). A device that does not match (btrfs subvolumes report
// another one to stat) is accepted when nothing matches exactly.
func flockHolders(locks string, major, minor uint32, ino uint64) []int {
	var exact, inodeOnly []int
	sc := bufio.NewScanner(strings.NewReader(locks))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// "1: FLOCK ADVISORY WRITE 1234 08:02:1835018 0 EOF"
		if len(fields) < 6 || fields[1] != "FLOCK" {
			continue
		}
		pid, err := strconv.Atoi(fields[4])
		if err != nil {
			continue
		}
		parts := strings.Split(fields[5], ":")
		if len(parts) != 3 {
			continue
		}
		n, err := strconv.ParseUint(parts[2], 10, 64)
		if err != nil || n != ino {
			continue
		}
		maj, err1 := strconv.ParseUint(parts[0], 16, 32)
		min, err2 := strconv.ParseUint(parts[1], 16, 32)
		if err1 == nil && err2 == nil && uint32(maj) == major && uint32(min) == minor {
			exact = append(exact, pid)
		} else {
			inodeOnly = append(inodeOnly, pid)
		}
	}
	if len(exact) > 0 {
		return exact
	}
	return inodeOnly
}

// errNotKaironLocal: the data dir's lock is held, but not by a kairon-local.
var errNotKaironLocal = errors.New("not a kairon-local")

// runningUp finds the `kairon-local up` running on dataDir: 0 when none
// holds its lock. The PID comes from the kernel's table of locks, not from
// a file, so a stale PID never names an unrelated process; and it must be a
// kairon-local up as well.
func runningUp(dataDir string) (int, error) {
	path := lockFile(dataDir)
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err == nil {
		// Nobody holds it exclusively: nothing runs on this data dir.
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return 0, nil
	} else if !errors.Is(err, syscall.EWOULDBLOCK) {
		return 0, fmt.Errorf("checking %s: %w", path, err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return 0, err
	}
	locks, err := os.ReadFile(filepath.Join(procRoot, "locks"))
	if err != nil {
		return 0, fmt.Errorf("%s is locked, and finding by whom: %w", path, err)
	}
	holders := flockHolders(string(locks), unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	for _, pid := range holders {
		if isKaironLocalUp(readArgv(pid)) {
			return pid, nil
		}
	}
	if len(holders) > 0 {
		return holders[0], fmt.Errorf("%s is locked by pid %d (%s): %w", path, holders[0], strings.Join(readArgv(holders[0]), " "), errNotKaironLocal)
	}
	return 0, fmt.Errorf("%s is locked, but by no process in %s/locks", path, procRoot)
}

// isKaironLocalUp says whether argv is a `kairon-local up`.
func isKaironLocalUp(argv []string) bool {
	if len(argv) < 2 || filepath.Base(argv[0]) != "kairon-local" {
		return false
	}
	for _, a := range argv[1:] {
		if a == "up" {
			return true
		}
	}
	return false
}

// alive reports whether pid runs (and is not a zombie).
func alive(pid int) bool { return readArgv(pid) != nil }

// waitGone waits up to d for pid to end.
func waitGone(pid int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for alive(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}
