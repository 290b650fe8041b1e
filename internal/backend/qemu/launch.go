package qemu

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

// Launching QEMU: its command line and the guest kernel's, and the process
// this Backend starts and reaps.

// startTimeout bounds how long QEMU may take to open its QMP socket.
const startTimeout = 30 * time.Second

// launchSpec is one QEMU process to start.
type launchSpec struct {
	dir     string // the VM's state directory, QEMU's working directory
	name    string
	accel   string
	cpu     int32
	memMiB  int64
	kernel  string
	initrd  string
	cmdline string
	net     *backend.Network
	// incoming, if set, is a saved state positioned at the migration stream;
	// QEMU loads it (-incoming fd:3) instead of booting.
	incoming *os.File
	// jail, if set, confines QEMU (jail.go).
	jail *jailRecord
	// tapFD is the descriptor number of the tap QEMU inherits; 0 has QEMU
	// open the tap by name.
	tapFD int
	// agentPort adds the guest agent's virtio-serial port.
	agentPort bool
	// rootImage is an image guest's root image (backend.Spec.RootImage),
	// attached read-only; rootImageFD is the descriptor number a jailed
	// QEMU inherits it as (0: QEMU opens the path).
	rootImage   string
	rootImageFD int
}

// proc is a QEMU process this Backend started and reaps.
type proc struct {
	pid    int
	cmd    *exec.Cmd
	exited chan struct{} // closed once reaped
	state  *os.ProcessState
	err    error
	// oomKills and memLimit are what its memory cgroup's OOM killer did and
	// the limit it enforced, read as it was reaped (jailed VMs only).
	oomKills, memLimit int64
}

// exitDesc says how the process ended; call after exited is closed.
func (p *proc) exitDesc() string {
	select {
	case <-p.exited:
	default:
		return "still running"
	}
	st := p.state
	if st == nil {
		return fmt.Sprintf("qemu ended: %v", p.err)
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Signaled() && ws.Signal() == syscall.SIGKILL && p.oomKills > 0:
			return oomKilledDesc(p.memLimit)
		case ws.Signaled():
			return fmt.Sprintf("qemu killed by signal %d (%s)", int(ws.Signal()), signalName(ws.Signal()))
		case ws.Exited() && ws.ExitStatus() == 0:
			return "qemu exited with status 0: the guest powered off, rebooted or panicked, or QEMU was told to quit"
		case ws.Exited():
			return fmt.Sprintf("qemu exited with status %d", ws.ExitStatus())
		}
	}
	return "qemu ended: " + st.String()
}

// oomKilledDesc says that the kernel killed QEMU for reaching the memory
// limit of its cgroup, limit bytes (0: unknown).
func oomKilledDesc(limit int64) string {
	what := "its memory cap"
	if limit > 0 {
		what = fmt.Sprintf("its memory cap of %d MiB", limit>>20)
	}
	return "qemu killed by the kernel's OOM killer: the VM's cgroup reached " + what + " (the guest's memory plus QEMU's overhead)"
}

func signalName(s syscall.Signal) string {
	switch s {
	case syscall.SIGKILL:
		return "SIGKILL"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGSEGV:
		return "SIGSEGV"
	case syscall.SIGABRT:
		return "SIGABRT"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return s.String()
}

// kill ends the process at once and waits until it is reaped. A process
// already reaped is left alone: its PID may be another process's by now.
func (p *proc) kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	// Through os.Process, which knows when Wait reaped it, rather than
	// kill(2) on the bare PID.
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// qemuOpt escapes a value inside a QEMU -option list (commas double).
func qemuOpt(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// args is QEMU's command line for ls. Paths of sockets and logs are relative:
// QEMU runs in ls.dir.
//
// The machine is microvm: no PCI, no firmware, no option ROMs, virtio-mmio
// devices described by ACPI — the fastest x86 machine QEMU boots, and the
// guest needs nothing it lacks.
func (b *Backend) args(ls launchSpec) []string {
	a := []string{
		"-name", qemuOpt(ls.name),
		"-M", "microvm,x-option-roms=off",
		"-accel", accelOpt(ls.accel),
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-smp", strconv.Itoa(int(ls.cpu)),
		"-m", strconv.FormatInt(ls.memMiB, 10),
		"-kernel", ls.kernel,
		"-append", ls.cmdline,
		// The serial console: a socket for an interactive shell that also
		// logs everything the guest prints, client or not.
		"-chardev", "socket,id=console,path=" + consoleSock + ",server=on,wait=off,logfile=" + consoleLogFile + ",logappend=on",
		"-serial", "chardev:console",
		"-chardev", "socket,id=qmp,path=" + qmpSock + ",server=on,wait=off",
		"-mon", "chardev=qmp,mode=control",
	}
	if ls.jail == nil {
		// QEMU resolves the pidfile's full path (to remove it at exit),
		// which a jailed QEMU's uid may not; launch writes it instead.
		a = append(a, "-pidfile", pidFile)
	}
	if ls.accel == "kvm" {
		a = append(a, "-cpu", "host")
	}
	if ls.initrd != "" {
		a = append(a, "-initrd", ls.initrd)
	}
	if n := ls.net; n != nil {
		netdev := "tap,id=net0,ifname=" + qemuOpt(n.TapName) + ",script=no,downscript=no"
		if ls.tapFD > 0 {
			netdev = "tap,id=net0,fd=" + strconv.Itoa(ls.tapFD)
		}
		a = append(a, "-netdev", netdev, "-device", "virtio-net-device,netdev=net0"+macOpt(n.MAC))
	}
	if ls.agentPort {
		a = append(a, agentArgs()...)
	}
	if ls.rootImage != "" {
		a = append(a, rootImageArgs(ls.rootImage, ls.rootImageFD)...)
	}
	if ls.incoming != nil {
		a = append(a, "-incoming", "fd:3")
	}
	if ls.jail != nil {
		a = append(a, jailArgs()...)
	}
	return a
}

// agentArgs is the guest agent's channel: a virtio-serial device on the
// microvm's virtio-mmio bus with one port, kairon.agent, whose host end is
// agentSock in the state directory (created, like the console's, before a
// jailed QEMU chroots). It comes after the NIC, so the NIC keeps its
// transport, and its properties are fixed: a saved or migrating VM's
// target gets the same device.
func agentArgs() []string {
	return []string{
		"-chardev", "socket,id=agent,path=" + agentSock + ",server=on,wait=off",
		"-device", "virtio-serial-device,id=agentbus,max_ports=2",
		"-device", "virtserialport,bus=agentbus.0,nr=1,chardev=agent,name=kairon.agent",
	}
}

// tcgTBSizeMiB bounds TCG's translated-code cache (1 GiB by default), which
// counts against the VM's cgroup memory limit.
const tcgTBSizeMiB = 128

func accelOpt(accel string) string {
	if accel == "tcg" {
		return "tcg,tb-size=" + strconv.Itoa(tcgTBSizeMiB)
	}
	return accel
}

func macOpt(mac string) string {
	if mac == "" {
		return ""
	}
	return ",mac=" + qemuOpt(mac)
}

// launch starts QEMU for ls in its own session and returns once its QMP
// socket answers.
func (b *Backend) launch(ls launchSpec) (_ *proc, err error) {
	logf, err := os.OpenFile(filepath.Join(ls.dir, qemuLogFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child keeps its own copy
	var extra []*os.File
	if ls.incoming != nil {
		extra = append(extra, ls.incoming) // fd 3, as args says
	}
	if ls.jail != nil && ls.net != nil {
		tap, err := openTap(ls.net.TapName, b.opts.NetNS)
		if err != nil {
			return nil, err
		}
		defer tap.Close() // the child keeps its own copy
		extra = append(extra, tap)
		ls.tapFD = 3 + len(extra) - 1
	}
	if ls.jail != nil {
		// QEMU reads the guest image through descriptors: its uid may not
		// search the directories above it.
		for _, path := range []*string{&ls.kernel, &ls.initrd} {
			if *path == "" {
				continue
			}
			f, err := os.Open(*path)
			if err != nil {
				return nil, fmt.Errorf("qemu: guest image: %w", err)
			}
			defer f.Close()
			extra = append(extra, f)
			*path = "/proc/self/fd/" + strconv.Itoa(3+len(extra)-1)
		}
	}
	if ls.jail != nil && ls.rootImage != "" {
		f, err := os.Open(ls.rootImage)
		if err != nil {
			return nil, fmt.Errorf("qemu: root image: %w", err)
		}
		defer f.Close()
		extra = append(extra, f)
		ls.rootImageFD = 3 + len(extra) - 1
	}
	args := b.args(ls)
	fmt.Fprintf(logf, "==== %s %s %s\n", time.Now().Format(time.RFC3339Nano), b.qemu, strings.Join(args, " "))
	cmd := exec.Command(b.qemu, args...)
	if b.opts.NetNS != "" && ls.jail == nil {
		// The tap lives in that namespace, so QEMU must open it from there.
		// `ip netns exec` execs QEMU, so the PID is QEMU's own.
		cmd = exec.Command("ip", append([]string{"netns", "exec", b.opts.NetNS, b.qemu}, args...)...)
	}
	cmd.Dir = ls.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Nothing of the agent's environment (credentials, proxies, paths) for
	// QEMU; its messages, which exitReason matches, are in the C locale
	// without LC_ALL.
	cmd.Env = []string{}
	cmd.ExtraFiles = extra
	// Own session: no signal for the agent's terminal or process group
	// reaches the VM, and it outlives the agent.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	start := cmd.Start
	if ls.jail != nil {
		cmd.Dir = ""
		cmd.SysProcAttr = jailProcAttr(ls.jail)
		start = func() error {
			return b.jail.cgroups.spawn(cmd, ls.dir, ls.jail.Cgroups, func() error { return dropBoundingSet(jailBoundingSet) })
		}
	}
	if err := start(); err != nil {
		return nil, fmt.Errorf("qemu: start %s: %w", b.qemu, err)
	}
	p := &proc{pid: cmd.Process.Pid, cmd: cmd, exited: make(chan struct{})}
	if ls.jail != nil {
		if err := os.WriteFile(filepath.Join(ls.dir, pidFile), []byte(strconv.Itoa(p.pid)+"\n"), 0o644); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			return nil, err
		}
	}
	go func() {
		p.err = cmd.Wait()
		p.state = cmd.ProcessState
		if ls.jail != nil {
			// Now, while the cgroup still is: Stop removes it.
			p.oomKills, p.memLimit, _ = memoryOOM(ls.jail.Cgroups)
		}
		close(p.exited)
	}()
	defer func() {
		if err != nil {
			p.kill()
		}
	}()

	deadline := time.Now().Add(startTimeout)
	sock := filepath.Join(ls.dir, qmpSock)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := qmpDo(ctx, sock, func(*qmpConn) error { return nil })
		cancel()
		if err == nil {
			return p, nil
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("qemu: %s exited at start (%s): %s", ls.name, p.exitDesc(),
				lastLines(readTail(filepath.Join(ls.dir, qemuLogFile), 4096), 5))
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("qemu: %s: QMP socket not answering after %s: %v", ls.name, startTimeout, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// cmdline is the guest kernel command line: the backend's own part, the
// network keys the default guest's /init reads, then the Spec's extras.
func (b *Backend) cmdline(accel, hostname string, n *backend.Network, extra []string, bootNonce string) string {
	args := []string{
		"console=ttyS0", "reboot=t", "panic=-1",
		// Quiet boot: each console byte costs an emulated UART write.
		"quiet",
		// Nothing to gain from these on a throwaway micro-VM, and they cost
		// boot time under TCG.
		"cryptomgr.notests", "random.trust_cpu=on", "8250.nr_uarts=1",
		"i8042.noaux", "i8042.nomux", "i8042.dumbkbd", "i8042.nopnp",
	}
	if accel == "tcg" && b.tscKHz > 0 {
		// TCG's guest TSC ticks at the host's rate; telling the kernel spares
		// a calibration that can hang on microvm.
		args = append(args, "tsc_early_khz="+strconv.FormatInt(b.tscKHz, 10), "tsc=reliable")
	}
	if hostname != "" {
		args = append(args, "kairon.hostname="+hostname)
	}
	if n != nil {
		if n.Address.IsValid() {
			args = append(args, "kairon.ip="+n.Address.String())
		}
		if n.Gateway.IsValid() {
			args = append(args, "kairon.gw="+n.Gateway.String())
		}
		if n.Nameserver.IsValid() {
			args = append(args, "kairon.dns="+n.Nameserver.String())
		}
	}
	args = append(args, extra...)
	if bootNonce != "" {
		// Last, so that it wins over a kairon.boot among the extra args.
		args = append(args, "kairon.boot="+bootNonce)
	}
	return strings.Join(args, " ")
}

// hostnameFor turns "namespace/name" into a hostname: the name, restricted
// to what a hostname may hold.
func hostnameFor(name string) string {
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	var sb strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '.':
			sb.WriteRune(r)
		default:
			sb.WriteByte('-')
		}
	}
	h := strings.Trim(sb.String(), "-.")
	if len(h) > 63 {
		h = strings.Trim(h[:63], "-.")
	}
	if h == "" {
		h = "kairon"
	}
	return h
}
