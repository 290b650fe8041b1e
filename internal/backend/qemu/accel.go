package qemu

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// probeTimeout bounds the KVM probe boot. A stock kernel under real KVM is
// ready in well under a second; under a software hypervisor exposing
// /dev/kvm (kvm_pvm) it crawls or dies.
const probeTimeout = 20 * time.Second

// ProbeResult is what the acceleration probe saw.
type ProbeResult struct {
	// DeviceErr is the error opening /dev/kvm; nil if it opened.
	DeviceErr error
	// Ready: the probe guest printed its ready marker under KVM.
	Ready bool
	// TimedOut: the probe guest was not ready within the probe's timeout.
	TimedOut bool
	// Err: QEMU could not start, or exited, before the guest was ready.
	Err error
	// Output is QEMU's own output followed by the guest console, as far as
	// it got.
	Output string
	// Took is how long the probe boot ran.
	Took time.Duration
}

// kvmFailure matches what QEMU prints when KVM cannot run the guest.
var kvmFailure = regexp.MustCompile(`(?i)(KVM internal error[^\n]*|emulation failure[^\n]*|kvm_init_vcpu failed[^\n]*|failed to initialize kvm[^\n]*|KVM_[A-Z_]+ failed[^\n]*)`)

// DecideAcceleration turns a probe's outcome into "kvm" or "tcg" and says why.
// It is a pure function so every outcome is unit-tested.
func DecideAcceleration(r ProbeResult) (accel, reason string) {
	switch {
	case r.DeviceErr != nil:
		return "tcg", fmt.Sprintf("/dev/kvm unusable (%v)", r.DeviceErr)
	case r.Ready:
		return "kvm", fmt.Sprintf("probe guest ready under KVM in %s", r.Took.Round(time.Millisecond))
	}
	// A failure QEMU printed wins over a timeout: after "KVM internal error"
	// the VM stays stopped, so the probe also runs out of time.
	if m := kvmFailure.FindString(r.Output); m != "" {
		return "tcg", fmt.Sprintf("KVM cannot run the guest: %q (a software hypervisor such as kvm_pvm?)", strings.TrimSpace(m))
	}
	if r.TimedOut {
		return "tcg", fmt.Sprintf("probe guest not ready under KVM within %s (a software hypervisor such as kvm_pvm?)", r.Took.Round(time.Second))
	}
	if r.Err != nil {
		return "tcg", fmt.Sprintf("KVM probe boot failed: %v", r.Err)
	}
	return "tcg", "KVM probe boot ended without the guest becoming ready"
}

// probeKVM opens /dev/kvm and, if that works, boots the default guest under
// KVM once with a timeout.
func (b *Backend) probeKVM(ctx context.Context) ProbeResult {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return ProbeResult{DeviceErr: err}
	}
	f.Close()
	if b.jail != nil && b.jail.kvmErr != nil {
		return ProbeResult{DeviceErr: b.jail.kvmErr}
	}

	kernel, initrd := b.imagePaths(DefaultImage)
	if _, err := os.Stat(kernel); err != nil {
		return ProbeResult{Err: fmt.Errorf("no guest image to probe with: %w", err)}
	}
	dir, err := os.MkdirTemp(b.opts.StateDir, ".probe-")
	if err != nil {
		return ProbeResult{Err: err}
	}
	defer os.RemoveAll(dir)

	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	start := time.Now()
	spec := launchSpec{
		dir: dir, name: "kairon/accel-probe", accel: "kvm", cpu: 1, memMiB: 256,
		kernel: kernel, initrd: initrd, cmdline: b.cmdline("kvm", "accel-probe", nil, nil, ""),
	}
	p, err := b.launch(spec)
	if err != nil {
		return ProbeResult{Err: err, Output: readTail(filepath.Join(dir, qemuLogFile), 4096)}
	}
	defer p.kill()
	res := ProbeResult{}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !res.Ready {
		if found, _ := fileContains(filepath.Join(dir, consoleLogFile), readyMarker); found {
			res.Ready = true
			break
		}
		select {
		case <-p.exited:
			res.Err = fmt.Errorf("qemu exited: %s", p.exitDesc())
		case <-ctx.Done():
			res.TimedOut = true
		case <-tick.C:
			// A KVM internal error leaves QEMU running but stopped: look early.
			if kvmFailure.MatchString(readTail(filepath.Join(dir, qemuLogFile), 8192)) {
				res.Err = fmt.Errorf("qemu reported a KVM failure")
			}
		}
		if res.Err != nil || res.TimedOut {
			break
		}
	}
	res.Took = time.Since(start)
	res.Output = readTail(filepath.Join(dir, qemuLogFile), 8192) + "\n" + readTail(filepath.Join(dir, consoleLogFile), 4096)
	return res
}

// hostTSCkHz is the host's TSC frequency in kHz, or 0 if unknown. Under TCG
// the guest's TSC ticks at the host's rate, and giving the guest kernel that
// rate (tsc_early_khz=) spares it a calibration that sometimes hangs on
// microvm. Sources, best first: the kernel's own figure in sysfs (some
// kernels), its boot log ("tsc: Refined TSC clocksource calibration" or
// "tsc: Detected ... MHz"), then /proc/cpuinfo's "cpu MHz" when the CPU
// declares a constant TSC.
func hostTSCkHz() int64 {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
		if v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 {
			return v
		}
	}
	if v := tscFromKmsg(); v > 0 {
		return v
	}
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	var mhz float64
	constant := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) == "" && mhz > 0 {
			break // first CPU is enough
		}
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case k == "cpu MHz" && mhz == 0:
			mhz, _ = strconv.ParseFloat(v, 64)
		case k == "flags" && !constant:
			for _, fl := range strings.Fields(v) {
				if fl == "constant_tsc" {
					constant = true
				}
			}
		}
	}
	if !constant || mhz <= 0 {
		return 0
	}
	return int64(mhz * 1000)
}

var tscLine = regexp.MustCompile(`tsc: (?:Refined TSC clocksource calibration: |Detected )([0-9]+\.[0-9]+) MHz`)

// tscFromKmsg reads the kernel log (non-blocking) for its TSC frequency.
// Raw syscalls: through os.File, Go's poller would wait at the end of the
// log for the next message instead of returning EAGAIN.
func tscFromKmsg() int64 {
	fd, err := syscall.Open("/dev/kmsg", syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0
	}
	defer syscall.Close(fd)
	var best int64
	buf := make([]byte, 8192)
	for i := 0; i < 100000; i++ {
		n, err := syscall.Read(fd, buf)
		if err == syscall.EPIPE { // records overwritten while reading: go on
			continue
		}
		if err != nil || n <= 0 {
			break
		}
		m := tscLine.FindSubmatch(buf[:n])
		if m == nil {
			continue
		}
		if v, err := strconv.ParseFloat(string(m[1]), 64); err == nil {
			best = int64(v * 1000) // Refined comes after Detected and wins
		}
	}
	return best
}
