package qemu

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// bootTimeout is generous: the suite runs on two loaded cores under TCG.
const bootTimeout = 90 * time.Second

// vmPrereqs returns the guest directory and QEMU binary, failing the test
// with what to run when either is missing (skipping only with
// KAIRON_SKIP_VM_TESTS=1, and under make test-unit's -short).
func vmPrereqs(tb testing.TB) (guestDir, qemuPath string) {
	tb.Helper()
	host.SkipIfShort(tb, "QEMU and the guest image")
	missing := func(format string, args ...any) {
		tb.Helper()
		if os.Getenv("KAIRON_SKIP_VM_TESTS") == "1" {
			tb.Skipf("KAIRON_SKIP_VM_TESTS=1: "+format, args...)
		}
		tb.Fatalf(format, args...)
	}
	qemuPath, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		missing("qemu-system-x86_64 not found: run `make deps` (Debian package qemu-system-x86)")
	}
	guestDir, ok := LocateGuestDir()
	if !ok {
		missing("guest image not found (%q): run `make guest`, or set KAIRON_GUEST_DIR", guestDir)
	}
	for _, f := range []string{"vmlinux", "initramfs.cpio.gz"} {
		if _, err := os.Stat(filepath.Join(guestDir, DefaultImage, f)); err != nil {
			missing("guest image incomplete: %v: run `make guest`", err)
		}
	}
	return guestDir, qemuPath
}

// newTestBackend returns a Backend over a fresh state directory whose VMs
// are all stopped, and killed by pidfile if need be, when the test ends.
func newTestBackend(tb testing.TB, opts Options) *Backend {
	tb.Helper()
	guestDir, _ := vmPrereqs(tb)
	if opts.StateDir == "" {
		opts.StateDir = shortTempDir(tb)
	}
	if opts.GuestDir == "" {
		opts.GuestDir = guestDir
	}
	b, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cleanupVMs(tb, b) })
	return b
}

// testLogger sends the backend's log to the test's.
func testLogger(tb testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tbWriter{tb}, nil))
}

type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// shortTempDir is a temporary directory with a short path (unix socket
// paths are limited to 108 bytes, and test names are long).
// It names the test process in .owner, so that a later run can kill the VMs
// of a test binary that died before its cleanups ran (see TestMain).
func shortTempDir(tb testing.TB) string {
	tb.Helper()
	d, err := os.MkdirTemp("", tempPrefix)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, ".owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(d) })
	return d
}

const tempPrefix = "kairon-qemu-test-"

// fakeMonitor listens where a VM's QMP socket would be, in a new state
// dir, for tests that play QEMU's monitor; it returns the dir and the
// listener, closed when the test ends.
func fakeMonitor(tb testing.TB) (string, net.Listener) {
	tb.Helper()
	dir := shortTempDir(tb)
	ln, err := net.Listen("unix", filepath.Join(dir, qmpSock))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	return dir, ln
}

// greetQMP sends a new monitor connection QEMU's greeting and returns a
// reader of what the client sends.
func greetQMP(c net.Conn) *bufio.Reader {
	_, _ = c.Write([]byte(`{"QMP": {"version": {}, "capabilities": []}}` + "\n"))
	return bufio.NewReader(c)
}

func TestMain(m *testing.M) {
	reapOrphans()
	os.Exit(m.Run())
}

// reapOrphans kills QEMU processes left by earlier runs of these tests whose
// test binary is gone (killed by a timeout, say), and removes their state.
// VMs of a test binary that still runs, here or in another checkout, are left
// alone.
func reapOrphans() {
	// Namespaces of dead test runs (named kairon-qt-<pid>-<n>).
	if nss, err := os.ReadDir("/run/netns"); err == nil {
		for _, e := range nss {
			rest, ok := strings.CutPrefix(e.Name(), "kairon-qt-")
			if !ok {
				continue
			}
			pidStr, _, _ := strings.Cut(rest, "-")
			if pid, err := strconv.Atoi(pidStr); err == nil && syscall.Kill(pid, 0) != nil {
				_ = exec.Command("ip", "netns", "del", e.Name()).Run()
			}
		}
	}
	tmp := os.TempDir()
	ents, _ := os.ReadDir(tmp)
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), tempPrefix) {
			continue
		}
		root := filepath.Join(tmp, e.Name())
		owner := readPIDFile(filepath.Join(root, ".owner"))
		if owner > 0 && syscall.Kill(owner, 0) == nil {
			continue
		}
		if fi, err := e.Info(); owner == 0 && (err != nil || time.Since(fi.ModTime()) < time.Minute) {
			continue // just made, its owner not written yet
		}
		for _, pid := range qemuProcesses(root) {
			fmt.Fprintf(os.Stderr, "killing qemu %d left by a dead test run in %s\n", pid, root)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		// Their jails too: cgroups and uid claims outlive the test binary.
		vms, _ := os.ReadDir(root)
		for _, vm := range vms {
			if err := (&jailConfig{registry: DefaultJailRegistry}).teardown(filepath.Join(root, vm.Name())); err != nil {
				fmt.Fprintf(os.Stderr, "removing the jail left by a dead test run in %s: %v\n", root, err)
			}
		}
		os.RemoveAll(root)
	}
}

// cleanupVMs stops every VM under b's state directory, then kills whatever
// a pidfile still names, so no QEMU outlives a test.
func cleanupVMs(tb testing.TB, b *Backend) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ents, _ := os.ReadDir(b.opts.StateDir)
	for _, e := range ents {
		if !e.IsDir() || validID(e.Name()) != nil {
			continue
		}
		dir := filepath.Join(b.opts.StateDir, e.Name())
		pid := readPIDFile(filepath.Join(dir, pidFile))
		if m, err := readMeta(dir); err == nil && m.PID != 0 {
			pid = m.PID
		}
		if err := b.Stop(ctx, e.Name()); err != nil {
			tb.Logf("cleanup: stop %s: %v", e.Name(), err)
		}
		if pid > 0 && processAlive(pid, dir) {
			tb.Logf("cleanup: killing leftover qemu %d", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// qemuProcesses counts live QEMU processes whose working directory lies
// under stateDir.
func qemuProcesses(stateDir string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if !strings.Contains(exe, "qemu-system") {
			continue
		}
		cwd, _ := os.Readlink(fmt.Sprintf("/proc/%d/cwd", pid))
		if strings.HasPrefix(cwd, stateDir+"/") && processAlive(pid, cwd) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// waitPhase waits until Get reports the instance in phase, and fails at
// once if it exited instead.
func waitPhase(tb testing.TB, b backend.Backend, id string, phase backend.Phase, timeout time.Duration) backend.Instance {
	tb.Helper()
	var inst backend.Instance
	var err error
	seen := func() string {
		return fmt.Sprintf("%+v (err %v)\nconsole:\n%s", inst, err, lastLines(readTail(b.ConsoleLog(id), 8192), 30))
	}
	testenv.Eventually(tb, timeout, fmt.Sprintf("%s to be %s", id, phase), func() (bool, string) {
		inst, err = b.Get(context.Background(), id)
		if err != nil {
			return false, seen()
		}
		// An exited VM reaches no other phase: stop waiting.
		return inst.Phase == phase || inst.Phase == backend.Exited, seen()
	})
	if inst.Phase != phase {
		tb.Fatalf("%s: want phase %s, have %s", id, phase, seen())
	}
	return inst
}

func qmpStatusOf(tb testing.TB, b *Backend, id string) string {
	tb.Helper()
	var st qmpStatus
	err := qmpDo(context.Background(), b.QMPSocket(id), func(q *qmpConn) error {
		var err error
		st, err = q.status()
		return err
	})
	if err != nil {
		tb.Fatalf("query-status %s: %v", id, err)
	}
	return st.Status
}

// testNetns is a network namespace made by a test, deleted when it ends.
type testNetns struct{ name string }

func newTestNetns(tb testing.TB) *testNetns {
	tb.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		tb.Fatalf("ip not found: run `make deps` (Debian package iproute2)")
	}
	ns := &testNetns{name: fmt.Sprintf("kairon-qt-%d-%d", os.Getpid(), time.Now().UnixNano()%100000)}
	run(tb, "ip", "netns", "add", ns.name)
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns.name).Run() })
	ns.ip(tb, "link", "set", "lo", "up")
	return ns
}

func (ns *testNetns) ip(tb testing.TB, args ...string) {
	tb.Helper()
	run(tb, "ip", append([]string{"-n", ns.name}, args...)...)
}

// do runs fn on an OS thread that has entered the namespace, so sockets fn
// opens live there.
func (ns *testNetns) do(tb testing.TB, fn func()) {
	tb.Helper()
	done := make(chan struct{})
	var failure string
	go func() {
		defer close(done)
		runtime.LockOSThread()
		// Never unlocked: the thread is thrown away with the goroutine, so it
		// never goes back to the pool inside the namespace.
		f, err := os.Open("/run/netns/" + ns.name)
		if err != nil {
			failure = err.Error()
			return
		}
		defer f.Close()
		const sysSetns = 308 // x86_64
		if _, _, errno := syscall.RawSyscall(sysSetns, f.Fd(), syscall.CLONE_NEWNET, 0); errno != 0 {
			failure = "setns: " + errno.Error()
			return
		}
		fn()
	}()
	<-done
	if failure != "" {
		tb.Fatal(failure)
	}
}

func run(tb testing.TB, name string, args ...string) {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}
