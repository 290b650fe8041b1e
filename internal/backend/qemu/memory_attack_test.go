package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/guestagent/wire"
	"github.com/zyvor/kairon/internal/testenv"
)

// hogScript grows one process's memory in the guest without end, a
// kilobyte at a time, touching all of it: an array of distinct strings.
// Nothing but the guest's OOM killer (or a failed allocation) stops it.
const hogScript = `awk 'BEGIN { pad = sprintf("%1000s", ""); for (i = 0; ; i++) a[i] = pad i }'`

// oomKillLine is what the guest kernel logs when its OOM killer kills.
const oomKillLine = "Out of memory: Killed process"

// vmMemory reads the memory cgroup of the jailed VM whose record is rec:
// the most it ever held, its limit, and how many processes its OOM killer
// killed (cgroup v2 or v1, as cgroup.go makes them).
func vmMemory(t *testing.T, rec jailRecord) (peak, limit, oomKills int64) {
	t.Helper()
	for _, d := range rec.Cgroups {
		for _, f := range [][2]string{{"memory.peak", "memory.max"}, {"memory.max_usage_in_bytes", "memory.limit_in_bytes"}} {
			p, err := os.ReadFile(filepath.Join(d, f[0]))
			if err != nil {
				continue
			}
			l, err := os.ReadFile(filepath.Join(d, f[1]))
			if err != nil {
				t.Fatal(err)
			}
			peak, _ = strconv.ParseInt(strings.TrimSpace(string(p)), 10, 64)
			limit, _ = strconv.ParseInt(strings.TrimSpace(string(l)), 10, 64)
			kills, _, ok := memoryOOM(rec.Cgroups)
			if !ok {
				t.Fatalf("the OOM kills of %v cannot be read", rec.Cgroups)
			}
			return peak, limit, kills
		}
	}
	t.Fatalf("no memory cgroup among %v", rec.Cgroups)
	return
}

func jailOf(t *testing.T, b *Backend, id string) jailRecord {
	t.Helper()
	var rec jailRecord
	if err := readJSON(filepath.Join(b.dir(id), jailFile), &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// A guest that allocates past its memory meets its own OOM killer: the
// hog dies, QEMU, which held every page the guest touched, stays within
// its cgroup's cap and runs on, and the guest's agent still answers.
func TestGuestAllocatesPastItsMemory(t *testing.T) {
	b := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	spec := backend.Spec{ID: "ns1_hog", Name: "ns1/hog", CPU: 1, MemoryMiB: 160}
	inst, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, spec.ID, backend.Running, bootTimeout)
	c := dialAgent(t, b, spec.ID)
	rec := jailOf(t, b, spec.ID)
	booted, _, _ := vmMemory(t, rec)

	start := time.Now()
	res, out, errOut := guestExec(t, c, nil, "sh", "-c", hogScript+"; echo status $?; free -m")
	t.Logf("the hog ended after %s: %+v\n%s%s", time.Since(start), res, out, errOut)
	_, dmesg, _ := guestExec(t, c, nil, "dmesg")
	killed := strings.Contains(dmesg, oomKillLine)
	failed := strings.Contains(errOut, "memory") // busybox: "awk: out of memory"
	if !killed && !failed {
		t.Fatalf("the hog ended neither by the guest's OOM killer nor by a failed allocation: %q %q\ndmesg:\n%s", out, errOut, lastLines(dmesg, 20))
	}
	if killed {
		i := strings.Index(dmesg, oomKillLine)
		line, _, _ := strings.Cut(dmesg[i:], "\n")
		t.Logf("the guest's OOM killer: %s", line)
	}

	// QEMU runs on, within its cap, having held (nearly) all of the guest's
	// memory: the attack did press on the host.
	if !processAlive(inst.PID, b.dir(spec.ID)) {
		t.Fatalf("qemu %d died of its guest's allocation", inst.PID)
	}
	peak, limit, kills := vmMemory(t, rec)
	t.Logf("the VM's cgroup: peak %d MiB, limit %d MiB, OOM kills %d", peak>>20, limit>>20, kills)
	if want := (spec.MemoryMiB + b.jail.overheadMiB) << 20; limit != want {
		t.Errorf("the VM's memory limit is %d, want %d", limit, want)
	}
	if peak > limit || kills != 0 {
		t.Errorf("the VM's cgroup peaked at %d bytes (limit %d), its OOM killer killed %d: the guest's allocation was not contained by the guest", peak, limit, kills)
	}
	if peak-booted < 32<<20 {
		t.Errorf("the VM's cgroup peaked at %d MiB, %d MiB after its boot: the hog did not make QEMU hold the guest's memory", peak>>20, booted>>20)
	}
	if got := waitPhase(t, b, spec.ID, backend.Running, 30*time.Second); got.PID != inst.PID {
		t.Errorf("the VM's process changed: %d, was %d", got.PID, inst.PID)
	}
	if _, out, _ := guestExec(t, c, nil, "echo", "still", "here"); out != "still here\n" {
		t.Errorf("the guest agent after the hog: %q", out)
	}
}

// A VM whose cgroup caps its memory below what its guest touches: the
// cgroup, not the guest, stops it. The kernel kills QEMU for the cap, and
// only QEMU, and the backend reports the VM exited for that reason.
func TestCgroupCapBelowGuestKillsQEMU(t *testing.T) {
	// 32 MiB for QEMU beside 192 MiB of guest memory: enough to boot, far
	// too little for QEMU (its code cache, its devices) once the guest has
	// touched all of its memory.
	b := newTestBackend(t, Options{Log: testLogger(t), MemoryOverheadMiB: 32})
	ctx := context.Background()
	spec := backend.Spec{ID: "ns1_capped", Name: "ns1/capped", CPU: 1, MemoryMiB: 192}
	inst, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, spec.ID, backend.Running, bootTimeout)
	c := dialAgent(t, b, spec.ID)
	rec := jailOf(t, b, spec.ID)
	before, limit, _ := vmMemory(t, rec)
	t.Logf("booted: the VM's cgroup peaked at %d MiB of its %d MiB", before>>20, limit>>20)

	// The exec ends with the channel: QEMU is killed under it.
	_, err = c.Exec(ctx, &wire.Exec{Args: []string{"sh", "-c", hogScript}}, nil, nil, nil)
	t.Logf("the hog's exec ended: %v", err)
	var got backend.Instance
	testenv.Eventually(t, 2*time.Minute, "the VM to exit", func() (bool, string) {
		got, err = b.Get(ctx, spec.ID)
		return err == nil && got.Phase == backend.Exited, fmt.Sprintf("%+v %v", got, err)
	})
	t.Logf("exited: %s", got.Reason)
	if !strings.Contains(got.Reason, "OOM killer") || !strings.Contains(got.Reason, strconv.FormatInt(limit>>20, 10)+" MiB") {
		t.Errorf("exit reason %q, want the cgroup's OOM killer and its cap of %d MiB", got.Reason, limit>>20)
	}
	peak, _, kills := vmMemory(t, rec)
	if kills < 1 || peak > limit {
		t.Errorf("the VM's cgroup: peak %d, limit %d, OOM kills %d; want its OOM killer to have acted within the limit", peak, limit, kills)
	}
	// The kill stayed in the cgroup: nothing of it is left running, and
	// the process that started it (the agent, here the test) runs on.
	if procs, err := cgroupProcs(rec.Cgroups[0]); err != nil || len(procs) != 0 {
		t.Errorf("the VM's cgroup holds %v (%v) after QEMU was killed", procs, err)
	}
	if processAlive(inst.PID, b.dir(spec.ID)) {
		t.Errorf("qemu %d still runs", inst.PID)
	}
	if err := c.Ping(ctx); err == nil {
		t.Error("the guest agent still answers a VM whose QEMU was killed")
	}
	// An agent started since (not QEMU's parent, so without its exit
	// status) tells the same from the VM's cgroup.
	b2, err := New(Options{StateDir: b.opts.StateDir, GuestDir: b.opts.GuestDir, Acceleration: b.accel})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(b.dir(spec.ID), exitFile)); err != nil {
		t.Fatal(err)
	}
	if adopted, err := b2.Get(ctx, spec.ID); err != nil || adopted.Phase != backend.Exited || !strings.Contains(adopted.Reason, "OOM killer") {
		t.Errorf("a new agent's view: %+v %v; want Exited by the OOM killer", adopted, err)
	}
}
