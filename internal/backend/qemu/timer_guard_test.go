package qemu

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/testenv"
)

// HMP "info lapic" as QEMU 7.2 prints it, trimmed to the lines the guard
// reads, for the states a guest's APIC timer goes through.
const (
	// A guest whose kernel gave up on the timer ("APIC frequency too
	// slow"): left as it was set up for the measurement.
	lapicLeftMeasuring = "dumping local APIC state for CPU 0 \r\n\r\n" +
		"LVT0\t 0x00010700 active-hi edge  masked                      ExtINT (vec 0)\r\n" +
		"LVTTHMR\t 0x00010000 active-hi edge  masked                      Fixed  (vec 0)\r\n" +
		"LVTT\t 0x000300ec active-hi edge  masked         periodic     Fixed  (vec 236)\r\n" +
		"Timer\t DCR=0x3 (divide by 16) initial_count = 268435455 current_count = 173240645\r\n"
	// A healthy guest: the timer ticks, unmasked.
	lapicTicking = "LVTTHMR\t 0x00010000 active-hi edge  masked                      Fixed  (vec 0)\r\n" +
		"LVTT\t 0x000200ec active-hi edge                 periodic     Fixed  (vec 236)\r\n" +
		"Timer\t DCR=0x3 (divide by 16) initial_count = 1109548 current_count = 163373\r\n"
	// Before the kernel touched it (reset state).
	lapicUntouched = "LVTTHMR\t 0x00010000 active-hi edge  masked                      Fixed  (vec 0)\r\n" +
		"LVTT\t 0x00010000 active-hi edge  masked         one-shot     Fixed  (vec 0)\r\n" +
		"Timer\t DCR=0x0 (divide by 2) initial_count = 0 current_count = 0\r\n"
)

func TestAPICTimerLeftMeasuring(t *testing.T) {
	for _, tc := range []struct {
		name, info string
		want       bool
	}{
		{"left as measured", lapicLeftMeasuring, true},
		{"ticking", lapicTicking, false},
		{"untouched", lapicUntouched, false},
		{"masked one-shot, measuring count", "LVTT\t 0x000100ec masked one-shot\nTimer\t DCR=0x3 (divide by 16) initial_count = 268435455 current_count = 1\n", false},
		{"masked periodic, another count", "LVTT\t 0x000300ec masked periodic\nTimer\t DCR=0x3 (divide by 16) initial_count = 268435454 current_count = 1\n", false},
		{"tsc-deadline mode", "LVTT\t 0x000500ec masked tsc-deadline\nTimer\t DCR=0x3 (divide by 16) initial_count = 268435455 current_count = 1\n", false},
		{"no timer line", "LVTT\t 0x000300ec masked periodic\n", false},
		{"no LVTT line", "Timer\t DCR=0x3 (divide by 16) initial_count = 268435455 current_count = 1\n", false},
		{"garbage", "LVTT\t 0xzz\nTimer initial_count = x", false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := apicTimerLeftMeasuring(tc.info); got != tc.want {
				t.Errorf("apicTimerLeftMeasuring = %v, want %v for\n%s", got, tc.want, tc.info)
			}
		})
	}
}

// TestTimerGuardResetsAGuestWithoutATimer makes the guest kernel's APIC
// timer measurement fail on every boot: told its TSC runs at 2 MHz (it runs
// at the host's rate under TCG), the kernel's 100 ms of TSC pass in 0.1 ms
// and it measures almost no APIC ticks, as when a busy host stalls the
// vCPU. The guard resets the guest in place (same QEMU process) each time,
// gives up after maxTimerResets, and the VM is never reported Running.
func TestTimerGuardResetsAGuestWithoutATimer(t *testing.T) {
	b := newTestBackend(t, Options{Log: testLogger(t)})
	if b.Acceleration() != "tcg" {
		// KVM guests get a TSC-deadline timer, which Linux does not measure.
		t.Skipf("acceleration %s: the measurement this test makes fail happens under TCG only", b.Acceleration())
	}
	const id = "ns1_notimer"
	var resets atomic.Int32
	var gaveUp atomic.Bool
	hook := func(got string, done bool) {
		switch {
		case got != id:
		case done:
			gaveUp.Store(true)
		default:
			resets.Add(1)
		}
	}
	timerGuardSeen.Store(&hook)
	t.Cleanup(func() { timerGuardSeen.Store(nil) })

	ctx := context.Background()
	spec := backend.Spec{ID: id, Name: "ns1/notimer", CPU: 1, MemoryMiB: 256, KernelArgs: []string{"tsc_early_khz=2000"}}
	// The fault is the guest's own measurement, and a loaded host can undo
	// it: a vCPU stall inside the measurement's 0.1 ms window lets real
	// APIC ticks pass, and that boot measures some frequency (a wrong one)
	// and arms its timer, which the guard rightly leaves alone. So each
	// boot is waited on until the give-up or an armed timer, and a VM
	// whose very first boot armed it is started again: it showed nothing.
	var (
		started backend.Instance
		m       meta
		err     error
	)
	for attempt := 1; ; attempt++ {
		if started, err = b.Start(ctx, spec); err != nil {
			t.Fatal(err)
		}
		if m, err = readMeta(b.dir(id)); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 3*bootTimeout, "the guard to reset the guest and give up", func() (bool, string) {
			if gaveUp.Load() {
				return true, ""
			}
			return apicTimerArmed(t, b.QMPSocket(id)), fmt.Sprintf("%d resets, the timer not armed", resets.Load())
		})
		if gaveUp.Load() || resets.Load() > 0 {
			break
		}
		if attempt == 5 {
			t.Skipf("the injected fault did not take on any of %d first boots on this loaded host", attempt)
		}
		t.Logf("boot %d measured its timer before any reset; starting the VM again", attempt)
		if err := b.Stop(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if !gaveUp.Load() {
		t.Logf("after %d in-place resets a boot measured its timer after all (the loaded host stalled it in the measurement's window): the give-up is not exercised in this run", resets.Load())
	} else if got := resets.Load(); got != maxTimerResets {
		t.Errorf("%d resets before giving up, want %d", got, maxTimerResets)
	}
	inst, err := b.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if gaveUp.Load() && inst.Phase != backend.Booting {
		t.Errorf("a guest without a timer is %s, want Booting", inst.Phase)
	}
	now, err := readMeta(b.dir(id))
	if err != nil {
		t.Fatal(err)
	}
	if now.PID != m.PID || !inst.StartedAt.Equal(started.StartedAt) {
		t.Errorf("the guard replaced the VM (pid %d → %d, started %s → %s); it should reset the guest in place", m.PID, now.PID, started.StartedAt, inst.StartedAt)
	}
	// The guard put -no-reboot back: a reset now ends the VM.
	if err := qmpDo(ctx, b.QMPSocket(id), func(q *qmpConn) error { _, err := q.execute("system_reset", nil); return err }); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, b, id, backend.Exited, bootTimeout)
}

// apicTimerArmed says whether the guest behind sock has its APIC timer
// unmasked, as a kernel that measured its frequency leaves it.
func apicTimerArmed(t *testing.T, sock string) bool {
	t.Helper()
	var text string
	err := qmpDo(context.Background(), sock, func(q *qmpConn) (err error) {
		text, err = q.infoLapic()
		return err
	})
	lvt, ok := apicTimerLVT(text)
	return err == nil && ok && lvt&lvtMasked == 0
}
