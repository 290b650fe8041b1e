package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// TestJailedVMs looks at two running VMs from the host the way an attacker
// who took over their QEMU would find themselves: which uid, which
// privileges, which files, which limits. Then a new Backend adopts one and
// finds its jail as it was, and stopping them leaves nothing of the jails.
func TestJailedVMs(t *testing.T) {
	b := newTestBackend(t, Options{Log: testLogger(t)})
	if b.jail == nil {
		t.Fatal("the jail is not the default")
	}
	// As under /root or t.TempDir: the VMs' uids cannot search the state
	// directory, and need not.
	if err := os.Chmod(b.opts.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	specs := []backend.Spec{
		{ID: "ns1_a", Name: "ns1/a", CPU: 1, MemoryMiB: 160},
		{ID: "ns2_b", Name: "ns2/b", CPU: 2, MemoryMiB: 192},
	}
	pids := map[string]int{}
	for _, s := range specs {
		inst, err := b.Start(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		pids[s.ID] = inst.PID
	}
	for _, s := range specs {
		if inst := waitPhase(t, b, s.ID, backend.Running, bootTimeout); inst.PID != pids[s.ID] {
			t.Fatalf("%s: pid %d, then %d", s.ID, pids[s.ID], inst.PID)
		}
	}

	recs := map[string]jailRecord{}
	for _, s := range specs {
		rec := checkJailed(t, b, s, pids[s.ID])
		recs[s.ID] = rec
	}
	if recs["ns1_a"].UID == recs["ns2_b"].UID {
		t.Errorf("two VMs share uid %d", recs["ns1_a"].UID)
	}

	// What one VM's uid can do to the other: nothing, though it can to
	// itself (so that a refusal below is the uid's doing). The state
	// directory is opened to others' search for this, so that only the VMs'
	// own directories stand in the way.
	if err := os.Chmod(b.opts.StateDir, 0o711); err != nil {
		t.Fatal(err)
	}
	a, bb := recs["ns1_a"].UID, recs["ns2_b"].UID
	bLog := filepath.Join(b.dir("ns2_b"), consoleLogFile)
	for _, c := range []struct {
		uid    uint32
		script string
		ok     bool
	}{
		{bb, "head -c 1 " + bLog, true},
		{a, "head -c 1 " + bLog, false},
		{a, "ls " + b.dir("ns2_b"), false},
		{a, fmt.Sprintf("kill -0 %d", pids["ns1_a"]), true},
		{a, fmt.Sprintf("kill -0 %d", pids["ns2_b"]), false},
	} {
		out, err := asUID(c.uid, c.script)
		if (err == nil) != c.ok {
			t.Errorf("as uid %d: %s: %v %s; want success %v", c.uid, c.script, err, out, c.ok)
		}
	}
	if err := os.Chmod(b.opts.StateDir, 0o700); err != nil {
		t.Fatal(err)
	}

	// The agent restarts: a new Backend over the same directory.
	b2, err := New(Options{StateDir: b.opts.StateDir, GuestDir: b.opts.GuestDir, Acceleration: b.accel, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	inst, err := b2.Get(ctx, "ns1_a")
	if err != nil || inst.PID != pids["ns1_a"] || inst.Phase != backend.Running {
		t.Fatalf("adopted VM: %+v, %v; want pid %d Running", inst, err, pids["ns1_a"])
	}
	if again := checkJailed(t, b2, specs[0], inst.PID); !slices.Equal(again.Cgroups, recs["ns1_a"].Cgroups) || again.UID != recs["ns1_a"].UID {
		t.Errorf("the adopted VM's jail changed: %+v, was %+v", again, recs["ns1_a"])
	}

	// Stopped by the Backend that adopted it, and by the one that started it.
	for i, s := range specs {
		by := []*Backend{b2, b}[i]
		if err := by.Stop(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
		rec := recs[s.ID]
		// Dead is enough: the adopted VM is still the test's (b's) child, so
		// it lingers as a zombie until b's reaper collects it, as it would
		// not under a restarted kairon-node.
		if state := processState(pids[s.ID]); state != "" && state != "Z" {
			t.Errorf("%s: qemu %d still runs after Stop (state %s)", s.ID, pids[s.ID], state)
		}
		for _, cg := range rec.Cgroups {
			if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: cgroup %s left after Stop: %v", s.ID, cg, err)
			}
		}
		if owner, err := os.ReadFile(filepath.Join(b.jail.registry, strconv.FormatUint(uint64(rec.UID), 10))); err == nil && string(owner) == b.dir(s.ID) {
			t.Errorf("%s: uid %d still claimed after Stop", s.ID, rec.UID)
		}
	}
}

// checkJailed checks what the jail of the running VM s (process pid) must
// hold, and returns its record.
func checkJailed(t *testing.T, b *Backend, s backend.Spec, pid int) jailRecord {
	t.Helper()
	dir := b.dir(s.ID)
	var rec jailRecord
	if err := readJSON(filepath.Join(dir, jailFile), &rec); err != nil {
		t.Fatalf("%s: %v", s.ID, err)
	}
	if rec.UID < b.jail.uidBase || rec.UID >= b.jail.uidBase+b.jail.uidCount || rec.GID != rec.UID {
		t.Errorf("%s: uid %d gid %d, want one id from [%d, %d)", s.ID, rec.UID, rec.GID, b.jail.uidBase, b.jail.uidBase+b.jail.uidCount)
	}

	status := procStatus(t, pid)
	want := strconv.FormatUint(uint64(rec.UID), 10)
	for _, k := range []string{"Uid", "Gid"} {
		for _, v := range strings.Fields(status[k]) {
			if v != want {
				t.Errorf("%s: %s: %q, want %s everywhere (real, effective, saved, fs)", s.ID, k, status[k], want)
				break
			}
		}
	}
	if g := strings.Fields(status["Groups"]); len(g) > len(rec.Groups) {
		t.Errorf("%s: supplementary groups %v, want at most %v", s.ID, g, rec.Groups)
	}
	if status["Seccomp"] != "2" || status["NoNewPrivs"] != "1" {
		t.Errorf("%s: Seccomp %q NoNewPrivs %q, want 2 and 1", s.ID, status["Seccomp"], status["NoNewPrivs"])
	}
	// Nothing but CAP_SYS_CHROOT, which QEMU used for its own chroot: not
	// held, not inheritable, and not in the bounding set either, so that
	// nothing (a file capability, a set-uid binary) can ever add another.
	for _, k := range []string{"CapEff", "CapPrm", "CapInh", "CapAmb", "CapBnd"} {
		if status[k] != fmt.Sprintf("%016x", 1<<capSysChroot) {
			t.Errorf("%s: %s %s, want CAP_SYS_CHROOT alone (%016x)", s.ID, k, status[k], 1<<capSysChroot)
		}
	}
	// PID 1 of a PID namespace of its own: its PID as the agent knows it
	// (the one Get reports, the pidfile's), then 1.
	if got, want := strings.Fields(status["NSpid"]), []string{strconv.Itoa(pid), "1"}; !slices.Equal(got, want) {
		t.Errorf("%s: NSpid %q, want %q (PID 1 of its own PID namespace)", s.ID, status["NSpid"], want)
	}

	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err != nil || len(env) != 0 {
		t.Errorf("%s: environment %q (%v), want empty", s.ID, env, err)
	}

	// The files it sees: an empty directory, owned by root, not writable.
	jailRoot := filepath.Join(dir, jailRootDir)
	for _, l := range []string{"root", "cwd"} {
		if got, err := os.Readlink(fmt.Sprintf("/proc/%d/%s", pid, l)); err != nil || got != jailRoot {
			t.Errorf("%s: /proc/%d/%s -> %q (%v), want %s", s.ID, pid, l, got, err, jailRoot)
		}
	}
	seen := fmt.Sprintf("/proc/%d/root", pid)
	for _, host := range []string{"/etc/passwd", "/proc/self", "/dev/kvm", dir, b.opts.StateDir, "/usr/bin"} {
		if _, err := os.Lstat(filepath.Join(seen, host)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the host's %s is visible in the jail (%v)", s.ID, host, err)
		}
	}
	if ents, err := os.ReadDir(seen); err != nil || len(ents) != 0 {
		t.Errorf("%s: the jail holds %v (%v), want nothing", s.ID, ents, err)
	}
	// CAP_SYS_CHROOT plus a directory descriptor would lead out of the
	// chroot (fchdir, then ..): QEMU must hold none.
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil || len(fds) == 0 {
		t.Errorf("%s: descriptors of qemu %d: %v (%d)", s.ID, pid, err, len(fds))
	}
	for _, fd := range fds {
		p := fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			target, _ := os.Readlink(p)
			t.Errorf("%s: qemu holds directory descriptor %s -> %s", s.ID, fd.Name(), target)
		}
	}
	if fi, err := os.Stat(jailRoot); err != nil || fi.Mode().Perm()&0o222 != 0 || fi.Sys().(*syscall.Stat_t).Uid != 0 {
		t.Errorf("%s: jail root %v (%v), want root's and not writable", s.ID, fi.Mode(), err)
	}
	// Other VMs' uids cannot enter its state directory.
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 || fi.Sys().(*syscall.Stat_t).Uid != rec.UID {
		t.Errorf("%s: state directory %v (%v), want 0700 owned by %d", s.ID, fi.Mode(), err, rec.UID)
	}
	// Namespaces of its own (no network but the tap it was handed, no
	// process but itself, no mount table the agent's changes), but the
	// agent's user namespace, on purpose (jailProcAttr).
	for _, kind := range []string{"net", "ipc", "uts", "mnt", "pid"} {
		if ns, mine := nsOf(t, pid, kind), nsOf(t, os.Getpid(), kind); ns == mine {
			t.Errorf("%s: qemu shares the agent's %s namespace %s", s.ID, kind, ns)
		}
	}
	if ns, mine := nsOf(t, pid, "user"), nsOf(t, os.Getpid(), "user"); ns != mine {
		t.Errorf("%s: qemu's user namespace %s, want the agent's %s", s.ID, ns, mine)
	}

	// Its cgroups hold it and cap it.
	memMax := (s.MemoryMiB + b.jail.overheadMiB) << 20
	if len(rec.Cgroups) == 0 {
		t.Fatalf("%s: no cgroup recorded", s.ID)
	}
	for _, cg := range rec.Cgroups {
		procs, err := cgroupProcs(cg)
		if err != nil || !slices.Contains(procs, pid) {
			t.Errorf("%s: cgroup %s holds %v (%v), want qemu %d", s.ID, cg, procs, err, pid)
		}
	}
	limits := map[string]string{}
	if b.jail.cgroups.v2 {
		limits["memory.max"] = strconv.FormatInt(memMax, 10)
		limits["pids.max"] = strconv.Itoa(cgroupPids)
		limits["cpu.max"] = fmt.Sprintf("%d %d", (int64(s.CPU)*1000+500)*cpuPeriodUS/1000, cpuPeriodUS)
	} else {
		limits["memory.limit_in_bytes"] = strconv.FormatInt(memMax, 10)
		if _, err := os.Stat(filepath.Join(rec.Cgroups[0], "memory.memsw.limit_in_bytes")); err == nil {
			limits["memory.memsw.limit_in_bytes"] = strconv.FormatInt(memMax, 10)
		}
		limits["pids.max"] = strconv.Itoa(cgroupPids)
		limits["cpu.cfs_quota_us"] = strconv.FormatInt((int64(s.CPU)*1000+500)*cpuPeriodUS/1000, 10)
	}
	for file, want := range limits {
		found := false
		for _, cg := range rec.Cgroups {
			if got, err := os.ReadFile(filepath.Join(cg, file)); err == nil {
				found = true
				if strings.TrimSpace(string(got)) != want {
					t.Errorf("%s: %s/%s = %q, want %s", s.ID, cg, file, strings.TrimSpace(string(got)), want)
				}
			}
		}
		if !found {
			t.Errorf("%s: no %s in its cgroups %v", s.ID, file, rec.Cgroups)
		}
	}
	// What it uses is counted there: the guest's memory it touched at least.
	usage := "memory.usage_in_bytes"
	if b.jail.cgroups.v2 {
		usage = "memory.current"
	}
	for _, cg := range rec.Cgroups {
		if got, err := os.ReadFile(filepath.Join(cg, usage)); err == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(got)), 10, 64)
			if n < 16<<20 || n > memMax {
				t.Errorf("%s: %s = %d, want QEMU's memory (more than 16 MiB, at most %d)", s.ID, usage, n, memMax)
			}
		}
	}
	t.Logf("%s: qemu %d (NSpid %s) uid %s gid %s groups %q Seccomp %s NoNewPrivs %s CapEff %s CapBnd %s; cgroups %v", s.ID, pid,
		status["NSpid"], status["Uid"], status["Gid"], status["Groups"], status["Seccomp"], status["NoNewPrivs"], status["CapEff"], status["CapBnd"], rec.Cgroups)
	return rec
}

// asUID runs a shell script as uid (and gid) with no capabilities.
func asUID(uid uint32, script string) ([]byte, error) {
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	return cmd.CombinedOutput()
}

func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

func nsOf(t *testing.T, pid int, ns string) string {
	t.Helper()
	l, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/%s", pid, ns))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The uid registry: distinct uids, a stale claim taken over, a live one
// kept, exhaustion reported.
func TestClaimUID(t *testing.T) {
	j := &jailConfig{uidBase: 3000000, uidCount: 2, registry: t.TempDir()}
	root := t.TempDir()
	vm := func(name string) string {
		d := filepath.Join(root, name)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		return d
	}
	record := func(dir string, uid uint32) {
		if err := writeJSON(filepath.Join(dir, jailFile), jailRecord{UID: uid, GID: uid}); err != nil {
			t.Fatal(err)
		}
	}
	a, bb, c := vm("a"), vm("b"), vm("c")
	ua, err := j.claimUID(a)
	if err != nil {
		t.Fatal(err)
	}
	record(a, ua)
	ub, err := j.claimUID(bb)
	if err != nil {
		t.Fatal(err)
	}
	record(bb, ub)
	if ua == ub || ua < j.uidBase || ub < j.uidBase || ua >= j.uidBase+2 || ub >= j.uidBase+2 {
		t.Fatalf("uids %d and %d, want the two distinct uids of the range", ua, ub)
	}
	if _, err := j.claimUID(c); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("a third claim from a range of two: %v, want an error", err)
	}
	// b's agent died mid-stop: its directory is gone, its claim is stale.
	if err := os.RemoveAll(bb); err != nil {
		t.Fatal(err)
	}
	uc, err := j.claimUID(c)
	if err != nil || uc != ub {
		t.Fatalf("claim after b's directory went: %d, %v; want b's stale uid %d", uc, err, ub)
	}
	record(c, uc)
	// Releasing in another VM's name does nothing.
	j.releaseUID(ua, c)
	if owner, _ := os.ReadFile(filepath.Join(j.registry, strconv.FormatUint(uint64(ua), 10))); string(owner) != a {
		t.Errorf("uid %d now claimed by %q, want %q", ua, owner, a)
	}
	j.releaseUID(ua, a)
	if _, err := os.Stat(filepath.Join(j.registry, strconv.FormatUint(uint64(ua), 10))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("released uid still claimed: %v", err)
	}
}

func TestKVMGroupFor(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving the test files root's ownership and another group needs root")
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		name  string
		mode  os.FileMode
		gid   int
		group uint32
		err   string
	}{
		{"root only", 0o600, 0, 0, "cannot open it"},
		{"group root", 0o660, 0, 0, "cannot open it"},
		{"group kvm", 0o660, 993, 993, ""},
		{"group read only", 0o640, 993, 0, "cannot open it"},
		{"everyone", 0o666, 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, 0, tc.gid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, tc.mode); err != nil {
				t.Fatal(err)
			}
			g, err := kvmGroupFor(p)
			if g != tc.group || (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
				t.Errorf("kvmGroupFor: %d, %v; want %d, %q", g, err, tc.group, tc.err)
			}
		})
	}
}

func TestOthersCanRead(t *testing.T) {
	f := filepath.Join(t.TempDir(), "vmlinux")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := othersCanRead(f); err != nil {
		t.Fatalf("a world-readable file: %v", err)
	}
	if err := os.Chmod(f, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := othersCanRead(f); err == nil || !strings.Contains(err.Error(), "cannot read") {
		t.Errorf("a file others cannot read: %v", err)
	}
}

// An agent starting finds the claims and cgroups of uids whose VM directory
// is gone (a crashed agent's, a deleted state directory's) and removes
// them, killing what still runs there; live claims stay.
func TestSweepStaleJails(t *testing.T) {
	host.SkipIfShort(t, "root and the host's cgroups")
	parent := fmt.Sprintf("kairon-test-%d", os.Getpid())
	cg, err := detectCgroups(parent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range cg.dirs("") {
			_ = syscall.Rmdir(d)
		}
	})
	root := t.TempDir()
	j := &jailConfig{uidBase: 3100000, uidCount: 4, registry: t.TempDir(), cgroups: cg, stateDir: root}
	live, gone := filepath.Join(root, "live"), filepath.Join(root, "gone")
	// Another agent's VM, whose directory this agent cannot see (an agent
	// in a container sees its own mounts): not this sweep's to judge.
	others := t.TempDir()
	unseen := filepath.Join(others, "vm")
	for _, d := range []string{live, gone, unseen} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	claim := func(dir string) (uint32, []string) {
		uid, err := j.claimUID(dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := writeJSON(filepath.Join(dir, jailFile), jailRecord{UID: uid, GID: uid}); err != nil {
			t.Fatal(err)
		}
		dirs, err := cg.create(cgroupName(uid), cgroupLimits{memoryBytes: 64 << 20, pids: 16, cpuMilli: 500})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for _, d := range dirs {
				_ = removeCgroup(d)
			}
		})
		return uid, dirs
	}
	liveUID, liveDirs := claim(live)
	goneUID, goneDirs := claim(gone)
	unseenUID, unseenDirs := claim(unseen)
	// Something still runs in the stale cgroup, and in the other agent's.
	sleeper := exec.Command("sleep", "600")
	if err := cg.spawn(sleeper, "/", goneDirs, nil); err != nil {
		t.Fatal(err)
	}
	otherVM := exec.Command("sleep", "600")
	if err := cg.spawn(otherVM, "/", unseenDirs, nil); err != nil {
		t.Fatal(err)
	}
	otherEnded := make(chan error, 1)
	go func() { otherEnded <- otherVM.Wait() }()
	t.Cleanup(func() { _ = otherVM.Process.Kill() })
	if err := os.RemoveAll(unseen); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- sleeper.Wait() }()
	t.Cleanup(func() { _ = sleeper.Process.Kill() })
	if procs, _ := cgroupProcs(goneDirs[0]); !slices.Contains(procs, sleeper.Process.Pid) {
		t.Fatalf("the sleeper %d is not in %s: %v", sleeper.Process.Pid, goneDirs[0], procs)
	}
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}

	if err := j.sweepStale(); err != nil {
		t.Fatal(err)
	}
	for _, d := range goneDirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale cgroup %s left: %v", d, err)
		}
	}
	testenv.Eventually(t, 10*time.Second, "the process in the stale cgroup to be killed", func() (bool, string) {
		select {
		case err := <-waited:
			return err != nil, fmt.Sprintf("it ended with %v", err)
		default:
			return false, "it still runs"
		}
	})
	if _, err := os.Stat(filepath.Join(j.registry, strconv.FormatUint(uint64(goneUID), 10))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stale claim of %d left: %v", goneUID, err)
	}
	for _, d := range liveDirs {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("live cgroup %s removed: %v", d, err)
		}
	}
	if owner, err := os.ReadFile(filepath.Join(j.registry, strconv.FormatUint(uint64(liveUID), 10))); err != nil || string(owner) != live {
		t.Errorf("live claim of %d: %q, %v", liveUID, owner, err)
	}
	// The other agent's VM runs on, claimed and in its cgroup.
	select {
	case err := <-otherEnded:
		t.Errorf("another agent's VM was killed by this agent's sweep: %v", err)
	default:
	}
	if procs, _ := cgroupProcs(unseenDirs[0]); !slices.Contains(procs, otherVM.Process.Pid) {
		t.Errorf("another agent's VM cgroup %s lost its process: %v", unseenDirs[0], procs)
	}
	if owner, err := os.ReadFile(filepath.Join(j.registry, strconv.FormatUint(uint64(unseenUID), 10))); err != nil || string(owner) != unseen {
		t.Errorf("another agent's claim of %d: %q, %v", unseenUID, owner, err)
	}
}

// A registry that lost its claims (a container's /run after a restart)
// still never hands out the uid of a VM that runs: its cgroup holds a
// process. An empty leftover cgroup does not keep its uid.
func TestClaimUIDSkipsCgroupsInUse(t *testing.T) {
	host.SkipIfShort(t, "root and the host's cgroups")
	parent := fmt.Sprintf("kairon-test-%d", os.Getpid())
	cg, err := detectCgroups(parent)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range cg.dirs("") {
			_ = syscall.Rmdir(d)
		}
	})
	j := &jailConfig{uidBase: 3200000, uidCount: 2, registry: t.TempDir(), cgroups: cg}
	running, err := cg.create(cgroupName(3200000), cgroupLimits{memoryBytes: 64 << 20, pids: 16, cpuMilli: 500})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range running {
			_ = removeCgroup(d)
		}
	})
	leftover, err := cg.create(cgroupName(3200001), cgroupLimits{memoryBytes: 64 << 20, pids: 16, cpuMilli: 500})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range leftover {
			_ = removeCgroup(d)
		}
	})
	sleeper := exec.Command("sleep", "600")
	if err := cg.spawn(sleeper, "/", running, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })

	for i := 0; i < 2; i++ {
		dir := filepath.Join(t.TempDir(), "vm")
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		uid, err := j.claimUID(dir)
		if i == 0 && (err != nil || uid != 3200001) {
			t.Fatalf("first claim: %d, %v; want 3200001, the uid whose cgroup is empty", uid, err)
		}
		if i == 1 && err == nil {
			t.Fatalf("second claim: %d; want none left (3200000 runs, 3200001 is claimed)", uid)
		}
		if err == nil {
			if err := writeJSON(filepath.Join(dir, jailFile), jailRecord{UID: uid, GID: uid}); err != nil {
				t.Fatal(err)
			}
			if _, err := cg.create(cgroupName(uid), cgroupLimits{memoryBytes: 64 << 20, pids: 16, cpuMilli: 500}); err != nil {
				t.Fatalf("replacing the empty leftover cgroup: %v", err)
			}
		}
	}
	if procs, _ := cgroupProcs(running[0]); !slices.Contains(procs, sleeper.Process.Pid) {
		t.Errorf("the running VM's cgroup lost its process: %v", procs)
	}
}

// --qemu-no-jail still runs VMs (as the agent's user, with an empty
// environment), and such a Backend leaves a jailed VM alone rather than
// stop it half-way, with its cgroups and uid claim orphaned.
func TestNoJail(t *testing.T) {
	jailed := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	if _, err := jailed.Start(ctx, backend.Spec{ID: "ns1_jailed", Name: "ns1/jailed", CPU: 1, MemoryMiB: 128}); err != nil {
		t.Fatal(err)
	}
	running := waitPhase(t, jailed, "ns1_jailed", backend.Running, bootTimeout)

	free, err := New(Options{StateDir: jailed.opts.StateDir, GuestDir: jailed.opts.GuestDir, Acceleration: jailed.accel, NoJail: true, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := free.Stop(ctx, "ns1_jailed"); err == nil || !strings.Contains(err.Error(), "--qemu-no-jail") {
		t.Errorf("unjailed Stop of a jailed VM: %v, want a refusal naming --qemu-no-jail", err)
	}
	if inst, err := jailed.Get(ctx, "ns1_jailed"); err != nil || inst.PID != running.PID || inst.Phase != backend.Running {
		t.Errorf("the jailed VM after the refused Stop: %+v, %v", inst, err)
	}

	inst, err := free.Start(ctx, backend.Spec{ID: "ns1_free", Name: "ns1/free", CPU: 1, MemoryMiB: 128})
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, free, "ns1_free", backend.Running, bootTimeout)
	if st := procStatus(t, inst.PID); strings.Fields(st["Uid"])[0] != strconv.Itoa(os.Geteuid()) {
		t.Errorf("unjailed qemu runs as uid %q, want the agent's %d", st["Uid"], os.Geteuid())
	}
	if env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", inst.PID)); err != nil || len(env) != 0 {
		t.Errorf("unjailed qemu's environment %q (%v), want empty", env, err)
	}
	if err := free.Stop(ctx, "ns1_free"); err != nil {
		t.Fatal(err)
	}
}

// processState is the state letter of process pid ("R", "S", "Z", ...), or
// "" when there is no such process.
func processState(pid int) string {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return "?"
	}
	return string(stat[i+2])
}
