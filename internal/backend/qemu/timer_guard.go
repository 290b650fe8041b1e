package qemu

import (
	"context"
	"encoding/json"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// The timer guard. On microvm the guest kernel has exactly one clock event
// device, the local APIC timer: microvm's ACPI tables describe a
// hardware-reduced platform, for which Linux sets up no PIT (and microvm has
// no HPET). Linux measures that timer's frequency early in boot against the
// TSC. If the host leaves the vCPU off the CPU for about 100 ms just as the
// measurement starts (seen under TCG on a loaded 2-core host), the kernel
// measures almost no APIC ticks, logs "APIC frequency too slow, disabling
// apic timer" and from then on gets no timer interrupt at all: init runs
// until its first sleep, and the guest stays Booting forever.
//
// The kernel leaves the timer as it set it up for the measurement: its LVT
// entry masked and periodic, its initial count 0xffffffff/16. A guard per
// freshly booted VM reads that state through QMP every timerGuardInterval
// until the guest is ready. Seen on two looks in a row (the measurement
// itself takes 100 ms), the guard resets the guest: same QEMU process,
// devices, command line and boot nonce, so the readiness watcher simply
// sees the guest come up later. VMs run with -no-reboot, so the guard turns
// QEMU's reboot action to reset for the moment of the reset.

// timerGuardInterval is how often the guard looks at a booting guest's
// APIC timer.
const timerGuardInterval = time.Second

// maxTimerResets is how many times the guard resets one boot before it
// leaves the VM to the node's boot timeout: a guest that disables its timer
// every time has another problem.
const maxTimerResets = 3

// timerGuardSeen, set only by tests, sees every reset the guard makes
// (gaveUp false) and its giving up (gaveUp true).
var timerGuardSeen atomic.Pointer[func(id string, gaveUp bool)]

// guardTimer runs the guard for the VM id, described by m, until ctx ends.
// A restored VM is not guarded: its timer was measured before its save.
func (b *Backend) guardTimer(ctx context.Context, id string, m meta) {
	if m.RestoredFrom != "" {
		return
	}
	v := b.vm(id)
	sock := filepath.Join(b.dir(id), qmpSock)
	seen, resets := 0, 0
	for sleepCtx(ctx, timerGuardInterval) {
		if v.busy.Load() {
			seen = 0 // paused, saved or stopped meanwhile: start over
			continue
		}
		disabled, err := b.timerDisabled(ctx, sock)
		if err != nil || !disabled {
			seen = 0
			continue
		}
		if seen++; seen < 2 {
			continue
		}
		seen = 0
		if resets == maxTimerResets {
			b.log.Error("the guest kept disabling its APIC timer; leaving it to the boot timeout", "id", id, "resets", resets)
			if hook := timerGuardSeen.Load(); hook != nil {
				(*hook)(id, true)
			}
			return
		}
		if !v.op.TryLock() {
			continue // a lifecycle operation runs: look again later
		}
		v.busy.Store(true)
		err = b.resetGuest(ctx, sock)
		v.busy.Store(false)
		v.op.Unlock()
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn("resetting a guest without a timer", "id", id, "err", err)
			}
			continue
		}
		resets++
		b.log.Warn("the guest kernel disabled its only timer while booting (host too busy while it measured the APIC timer); reset the guest", "id", id, "reset", resets)
		if hook := timerGuardSeen.Load(); hook != nil {
			(*hook)(id, false)
		}
	}
}

// timerDisabled reports whether the running guest's APIC timer is in the
// state a failed measurement leaves.
func (b *Backend) timerDisabled(ctx context.Context, sock string) (bool, error) {
	qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var disabled bool
	err := qmpDo(qctx, sock, func(q *qmpConn) error {
		st, err := q.status()
		if err != nil || !st.Running {
			return err
		}
		text, err := q.infoLapic()
		disabled = err == nil && apicTimerLeftMeasuring(text)
		return err
	})
	return disabled, err
}

// infoLapic is HMP's "info lapic" of the guest's CPU 0.
func (q *qmpConn) infoLapic() (string, error) {
	raw, err := q.execute("human-monitor-command", map[string]string{"command-line": "info lapic"})
	if err != nil {
		return "", err
	}
	var text string
	err = json.Unmarshal(raw, &text)
	return text, err
}

// resetGuest resets the guest in place: QEMU's reboot action is reset while
// it does, then back to shutdown (-no-reboot) whatever happened.
func (b *Backend) resetGuest(ctx context.Context, sock string) error {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return qmpDo(qctx, sock, func(q *qmpConn) error {
		if _, err := q.execute("set-action", map[string]string{"reboot": "reset"}); err != nil {
			return err
		}
		_, resetErr := q.execute("system_reset", nil)
		_, restoreErr := q.execute("set-action", map[string]string{"reboot": "shutdown"})
		if resetErr != nil {
			return resetErr
		}
		return restoreErr
	})
}

var (
	lvttLine         = regexp.MustCompile(`(?m)^LVTT\s+0x([0-9a-fA-F]+)`)
	timerInitialLine = regexp.MustCompile(`(?m)^Timer\s.*initial_count = (\d+)`)
)

// The APIC timer's LVT entry: masked (bit 16), mode (bits 17-18).
const lvtMasked, lvtModeMask, lvtPeriodic = 1 << 16, 3 << 17, 1 << 17

// apicTimerLVT reads the timer's LVT entry out of "info lapic".
func apicTimerLVT(infoLapic string) (uint64, bool) {
	m := lvttLine.FindStringSubmatch(infoLapic)
	if m == nil {
		return 0, false
	}
	lvt, err := strconv.ParseUint(m[1], 16, 32)
	return lvt, err == nil
}

// apicMeasuringInitialCount is the initial count Linux gives the APIC
// timer while it measures it: the largest count, 0xffffffff, over its
// divisor 16.
const apicMeasuringInitialCount = 0xffffffff / 16

// apicTimerLeftMeasuring reports whether HMP's "info lapic" shows the timer
// as Linux sets it up to measure it: LVT entry masked (bit 16) and periodic
// (bits 17-18 = 01), initial count 0xffffffff/16. Anything it cannot read
// counts as not.
func apicTimerLeftMeasuring(infoLapic string) bool {
	infoLapic = strings.ReplaceAll(infoLapic, "\r\n", "\n")
	lvt, ok := apicTimerLVT(infoLapic)
	if !ok || lvt&lvtMasked == 0 || lvt&lvtModeMask != lvtPeriodic {
		return false
	}
	t := timerInitialLine.FindStringSubmatch(infoLapic)
	if t == nil {
		return false
	}
	initial, err := strconv.ParseUint(t[1], 10, 32)
	return err == nil && initial == apicMeasuringInitialCount
}
