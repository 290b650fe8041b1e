package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/testenv"
)

// TestBootNetworkPauseResumeStop boots the default guest on a tap inside a
// network namespace this test makes, talks to its services from inside
// that namespace, pauses and resumes it, and stops it.
func TestBootNetworkPauseResumeStop(t *testing.T) {
	vmPrereqs(t)
	ns := newTestNetns(t)
	const tap = "ktap0"
	ns.ip(t, "tuntap", "add", "dev", tap, "mode", "tap")
	ns.ip(t, "addr", "add", "10.88.0.1/24", "dev", tap)
	ns.ip(t, "link", "set", tap, "up")

	b := newTestBackend(t, Options{NetNS: ns.name})
	ctx := context.Background()
	spec := backend.Spec{
		ID: "ns1_web", Name: "ns1/web", CPU: 1, MemoryMiB: 256,
		Network: &backend.Network{
			TapName: tap, MAC: "52:54:00:12:34:56",
			Address: netip.MustParsePrefix("10.88.0.5/24"), Gateway: netip.MustParseAddr("10.88.0.1"),
		},
	}
	inst, err := b.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Phase != backend.Booting && inst.Phase != backend.Running {
		t.Fatalf("after Start: %+v", inst)
	}
	if inst.PID <= 0 || inst.Acceleration != b.Acceleration() {
		t.Fatalf("after Start: %+v", inst)
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", inst.PID))
	if !strings.Contains(string(cmdline), "\x00-name\x00ns1/web\x00") {
		t.Errorf("ps does not show the machine's name: %q", cmdline)
	}
	if sid, _ := getsid(inst.PID); sid != inst.PID {
		t.Errorf("qemu %d is not in its own session (sid %d)", inst.PID, sid)
	}
	inst = waitPhase(t, b, spec.ID, backend.Running, bootTimeout)
	t.Logf("ready after %s (%s)", inst.ReadyAfter, inst.Acceleration)
	if inst.ReadyAfter <= 0 {
		t.Errorf("ReadyAfter not measured: %+v", inst)
	}
	if again, err := b.Start(ctx, spec); err != nil || again.PID != inst.PID {
		t.Errorf("Start of a running ID: %+v, %v; want the running instance", again, err)
	}

	t.Run("network", func(t *testing.T) {
		page, echo, err := talkToGuest(t, ns, "10.88.0.5")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(page, "kairon guest web") {
			t.Errorf("HTTP page %q does not name the host", page)
		}
		if echo != "ping kairon\n" {
			t.Errorf("echo answered %q", echo)
		}
	})

	t.Run("pause-resume", func(t *testing.T) {
		if err := b.Pause(ctx, spec.ID); err != nil {
			t.Fatal(err)
		}
		if st := qmpStatusOf(t, b, spec.ID); st != "paused" {
			t.Errorf("QMP status after Pause: %q", st)
		}
		if got, _ := b.Get(ctx, spec.ID); got.Phase != backend.Paused {
			t.Errorf("Get after Pause: %+v", got)
		}
		if err := b.Resume(ctx, spec.ID); err != nil {
			t.Fatal(err)
		}
		if st := qmpStatusOf(t, b, spec.ID); st != "running" {
			t.Errorf("QMP status after Resume: %q", st)
		}
		if got, _ := b.Get(ctx, spec.ID); got.Phase != backend.Running {
			t.Errorf("Get after Resume: %+v", got)
		}
		if _, _, err := talkToGuest(t, ns, "10.88.0.5"); err != nil {
			t.Errorf("guest after resume: %v", err)
		}
	})

	t.Run("stop", func(t *testing.T) {
		pid := inst.PID
		if err := b.Stop(ctx, spec.ID); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("qemu %d still exists after Stop (kill 0: %v)", pid, err)
		}
		if _, err := os.Stat(filepath.Join(b.opts.StateDir, spec.ID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("state dir remains after Stop: %v", err)
		}
		if _, err := b.Get(ctx, spec.ID); !errors.Is(err, backend.ErrNotFound) {
			t.Errorf("Get after Stop: %v, want ErrNotFound", err)
		}
		if err := b.Stop(ctx, spec.ID); err != nil {
			t.Errorf("second Stop: %v", err)
		}
	})
}

// talkToGuest fetches the HTTP page on 8080 and echoes a line on port 7.
// It dials from inside the test's namespace; a socket stays in the
// namespace it was made in, whichever thread uses it afterwards.
func talkToGuest(t *testing.T, ns *testNetns, addr string) (page, echo string, err error) {
	t.Helper()
	var c net.Conn
	// The guest's ARP answer and httpd may take a moment under TCG.
	testenv.Eventually(t, 20*time.Second, "the guest's web server on "+addr+":8080 to accept", func() (bool, string) {
		var derr error
		ns.do(t, func() { c, derr = net.DialTimeout("tcp", addr+":8080", 2*time.Second) })
		if derr != nil {
			return false, derr.Error()
		}
		return true, ""
	})
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: guest\r\n\r\n")
	b, err := io.ReadAll(c)
	c.Close()
	if err != nil {
		return "", "", fmt.Errorf("read page: %w", err)
	}
	page = string(b)

	ns.do(t, func() { c, err = net.DialTimeout("tcp", addr+":7", 5*time.Second) })
	if err != nil {
		return page, "", fmt.Errorf("dial %s:7: %w", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "ping kairon\n")
	buf := make([]byte, 64)
	n, err := io.ReadAtLeast(c, buf, len("ping kairon\n"))
	if err != nil {
		err = fmt.Errorf("echo: %w", err)
	}
	return page, string(buf[:n]), err
}

func getsid(pid int) (int, error) {
	sid, _, errno := syscall.RawSyscall(syscall.SYS_GETSID, uintptr(pid), 0, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(sid), nil
}

// TestReadoptAndKill starts two VMs, re-adopts them with a new Backend over
// the same state directory, then kills one with SIGKILL.
func TestReadoptAndKill(t *testing.T) {
	b1 := newTestBackend(t, Options{})
	ctx := context.Background()
	ids := []string{"ns1_a", "ns2_b"}
	pids := map[string]int{}
	for _, id := range ids {
		inst, err := b1.Start(ctx, backend.Spec{ID: id, Name: strings.Replace(id, "_", "/", 1), CPU: 1, MemoryMiB: 128})
		if err != nil {
			t.Fatal(err)
		}
		pids[id] = inst.PID
	}
	// Readers run concurrently with the boots, with the watchers and with
	// the wait: each time the wait asks, a reader lists and gets too.
	poke := make(chan struct{}, 1)
	readers := make(chan error, 1)
	go func() {
		defer close(readers)
		for range poke {
			if _, err := b1.List(ctx); err != nil {
				readers <- err
				return
			}
			if _, err := b1.Get(ctx, ids[0]); err != nil {
				readers <- err
				return
			}
		}
	}()
	testenv.Eventually(t, bootTimeout, "both VMs to be Running while others read", func() (bool, string) {
		select {
		case poke <- struct{}{}:
		default: // the reader has not taken the last one yet
		}
		var phases []string
		done := true
		for _, id := range ids {
			inst, err := b1.Get(ctx, id)
			phases = append(phases, fmt.Sprintf("%s: %s (err %v)", id, inst.Phase, err))
			// An exited VM ends the wait too; waitPhase below says why.
			done = done && err == nil && (inst.Phase == backend.Running || inst.Phase == backend.Exited)
		}
		return done, strings.Join(phases, ", ")
	})
	close(poke)
	if err := <-readers; err != nil {
		t.Fatalf("concurrent List/Get: %v", err)
	}
	for _, id := range ids {
		waitPhase(t, b1, id, backend.Running, bootTimeout)
	}
	before := qemuProcesses(b1.opts.StateDir)
	if len(before) != 2 {
		t.Fatalf("qemu processes under the state dir: %v, want 2", before)
	}

	t.Run("readopt", func(t *testing.T) {
		b2, err := New(Options{StateDir: b1.opts.StateDir, GuestDir: b1.opts.GuestDir})
		if err != nil {
			t.Fatal(err)
		}
		list, err := b2.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 2 {
			t.Fatalf("List after re-adoption: %+v", list)
		}
		for _, inst := range list {
			if inst.PID != pids[inst.ID] || inst.Phase != backend.Running || inst.ReadyAfter <= 0 || inst.StartedAt.IsZero() {
				t.Errorf("re-adopted %+v; want PID %d, Running, ReadyAfter set", inst, pids[inst.ID])
			}
		}
		if after := qemuProcesses(b1.opts.StateDir); len(after) != 2 || !samePIDs(before, after) {
			t.Errorf("qemu processes after re-adoption %v, before %v", after, before)
		}
	})

	t.Run("kill-9", func(t *testing.T) {
		id := ids[1]
		pid := readPIDFile(filepath.Join(b1.opts.StateDir, id, pidFile))
		if pid != pids[id] {
			t.Fatalf("pidfile says %d, Start said %d", pid, pids[id])
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// Seen by the Backend that started it, and by one that did not. The
		// starter reaps the process and records how it ended (exit.json);
		// an adopter opened after that learns the signal from the record.
		waitPhase(t, b1, id, backend.Exited, 10*time.Second)
		record := filepath.Join(b1.opts.StateDir, id, exitFile)
		testenv.Eventually(t, 5*time.Second, "the starter to write "+record, func() (bool, string) {
			_, err := os.Stat(record)
			return err == nil, fmt.Sprint(err)
		})
		b2, err := New(Options{StateDir: b1.opts.StateDir, GuestDir: b1.opts.GuestDir})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []struct {
			name string
			b    *Backend
		}{{"starter", b1}, {"adopter", b2}} {
			name, b := s.name, s.b
			inst := waitPhase(t, b, id, backend.Exited, 10*time.Second)
			if !strings.Contains(inst.Reason, "SIGKILL") {
				t.Errorf("%s: Reason %q does not say SIGKILL", name, inst.Reason)
			}
			if !strings.Contains(inst.ConsoleTail, readyMarker) || strings.Count(inst.ConsoleTail, "\n") >= consoleTailLines {
				t.Errorf("%s: ConsoleTail %q", name, inst.ConsoleTail)
			}
			t.Logf("%s: reason %q, console tail:\n%s", name, inst.Reason, inst.ConsoleTail)
		}
		list, _ := b2.List(ctx)
		if len(list) != 2 || list[0].Phase != backend.Running || list[1].Phase != backend.Exited {
			t.Errorf("List: %+v", list)
		}
		if err := b2.Stop(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(b1.opts.StateDir, id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("Stop of an exited VM left its state: %v", err)
		}
		// Stopping through the adopter a VM the first Backend started.
		if err := b2.Stop(ctx, ids[0]); err != nil {
			t.Fatal(err)
		}
		if left := qemuProcesses(b1.opts.StateDir); len(left) != 0 {
			t.Errorf("qemu processes left: %v", left)
		}
	})
}

func samePIDs(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[int]bool{}
	for _, p := range a {
		m[p] = true
	}
	for _, p := range b {
		if !m[p] {
			return false
		}
	}
	return true
}

// TestSaveRestore writes into guest memory over the console, saves the VM,
// stops it, restores it from the file and reads the value back.
func TestSaveRestore(t *testing.T) {
	b := newTestBackend(t, Options{Log: testLogger(t)})
	ctx := context.Background()
	spec := backend.Spec{ID: "ns1_saved", Name: "ns1/saved", CPU: 1, MemoryMiB: 256}
	if _, err := b.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	orig := waitPhase(t, b, spec.ID, backend.Running, bootTimeout)

	token := rand.IntN(1_000_000) + 1000
	con := testenv.DialConsole(t, b.ConsoleSocket(spec.ID))
	con.ExpectText(t, fmt.Sprintf("echo $((%d+1)) > /tmp/x; echo wrote-$((%d+1))", token, token), fmt.Sprintf("wrote-%d", token+1), 30*time.Second)

	saved := filepath.Join(t.TempDir(), "vm.state")
	start := time.Now()
	if err := b.Save(ctx, spec.ID, saved); err != nil {
		t.Fatal(err)
	}
	t.Logf("save took %s", time.Since(start))
	if st := qmpStatusOf(t, b, spec.ID); st != "postmigrate" && st != "paused" {
		t.Errorf("QMP status after Save: %q, want the VM paused", st)
	}
	if got, _ := b.Get(ctx, spec.ID); got.Phase != backend.Paused {
		t.Errorf("Get after Save: %+v", got)
	}
	if fi, err := os.Stat(saved); err != nil || fi.Size() < saveHeaderSize+1024 {
		t.Fatalf("saved file: %v %v", fi, err)
	} else {
		t.Logf("saved file: %d bytes", fi.Size())
	}
	// The saved VM can go on where it was.
	if err := b.Resume(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}
	if st := qmpStatusOf(t, b, spec.ID); st != "running" {
		t.Errorf("QMP status after Save and Resume: %q", st)
	}
	if err := b.Stop(ctx, spec.ID); err != nil {
		t.Fatal(err)
	}

	bad := spec
	bad.MemoryMiB = 512
	if _, err := b.Restore(ctx, bad, saved); err == nil || !strings.Contains(err.Error(), "shape") {
		t.Errorf("Restore into another shape: %v", err)
	}

	start = time.Now()
	inst, err := b.Restore(ctx, spec, saved)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("restore took %s", time.Since(start))
	if inst.Phase != backend.Running || inst.PID == orig.PID {
		t.Errorf("after Restore: %+v, want Running at once in a new process", inst)
	}
	con = testenv.DialConsole(t, b.ConsoleSocket(spec.ID))
	con.ExpectText(t, "cat /tmp/x", fmt.Sprint(token+1), 30*time.Second)
	if got := qmpStatusOf(t, b, spec.ID); got != "running" {
		t.Errorf("QMP status after Restore: %q", got)
	}
}

func TestDecideAcceleration(t *testing.T) {
	for _, tc := range []struct {
		name      string
		in        ProbeResult
		want, why string
	}{
		{"no /dev/kvm", ProbeResult{DeviceErr: &os.PathError{Op: "open", Path: "/dev/kvm", Err: syscall.ENOENT}}, "tcg", "/dev/kvm unusable"},
		{"no permission", ProbeResult{DeviceErr: &os.PathError{Op: "open", Path: "/dev/kvm", Err: syscall.EACCES}}, "tcg", "permission denied"},
		{"success", ProbeResult{Ready: true, Took: 700 * time.Millisecond}, "kvm", "ready under KVM"},
		{"emulation failure", ProbeResult{Err: errors.New("qemu reported a KVM failure"), Output: "KVM internal error. Suberror: 1\nemulation failure\nEAX=00000000 EBX=00000000\n"}, "tcg", "KVM internal error"},
		{"emulation failure and timeout", ProbeResult{TimedOut: true, Output: "error: kvm run failed Bad address\nKVM internal error. Suberror: 1\n"}, "tcg", "KVM cannot run the guest"},
		{"timeout", ProbeResult{TimedOut: true, Took: 20 * time.Second, Output: "[    0.000000] Linux version 6.1\n"}, "tcg", "not ready under KVM within 20s"},
		{"qemu failed", ProbeResult{Err: errors.New("qemu exited at start (qemu exited with status 1)")}, "tcg", "probe boot failed"},
		{"nothing", ProbeResult{}, "tcg", "without the guest becoming ready"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := DecideAcceleration(tc.in)
			if got != tc.want || !strings.Contains(why, tc.why) {
				t.Errorf("DecideAcceleration = %q, %q; want %q, containing %q", got, why, tc.want, tc.why)
			}
		})
	}
}

func TestCmdline(t *testing.T) {
	b := &Backend{tscKHz: 2096007}
	got := b.cmdline("tcg", "web", &backend.Network{
		Address: netip.MustParsePrefix("10.88.0.5/24"), Gateway: netip.MustParseAddr("10.88.0.1"), Nameserver: netip.MustParseAddr("192.0.2.53"),
	}, []string{"foo=bar", "kairon.boot=forged"}, "n0nce")
	for _, want := range []string{"console=ttyS0", "tsc_early_khz=2096007", "kairon.hostname=web", "kairon.ip=10.88.0.5/24", "kairon.gw=10.88.0.1", "kairon.dns=192.0.2.53"} {
		if !strings.Contains(got, want) {
			t.Errorf("cmdline %q lacks %q", got, want)
		}
	}
	// The spec's arguments, then the boot nonce, which wins over theirs.
	if !strings.HasSuffix(got, " foo=bar kairon.boot=forged kairon.boot=n0nce") {
		t.Errorf("cmdline %q does not end with the spec's arguments and then the boot nonce", got)
	}
	if kvm := b.cmdline("kvm", "", nil, nil, ""); strings.Contains(kvm, "tsc_early_khz") || strings.Contains(kvm, "kairon.ip") {
		t.Errorf("kvm cmdline %q", kvm)
	}
	if none := b.cmdline("kvm", "", &backend.Network{Address: netip.MustParsePrefix("10.88.0.5/24")}, nil, ""); strings.Contains(none, "kairon.dns") {
		t.Errorf("cmdline %q names a nameserver the network has not", none)
	}
	for in, want := range map[string]string{"ns/web": "web", "ns/Web_1": "web-1", "x": "x", "ns/": "kairon", "ns/" + strings.Repeat("a", 70): strings.Repeat("a", 63)} {
		if got := hostnameFor(in); got != want {
			t.Errorf("hostnameFor(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMarkerScannerAndTail(t *testing.T) {
	p := filepath.Join(t.TempDir(), "console.log")
	var sc markerScanner
	if found, err := sc.scan(p); found || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v %v", found, err)
	}
	f, _ := os.Create(p)
	defer f.Close()
	f.WriteString("[ 0.1] booting\nKAIRON-RE")
	if found, _ := sc.scan(p); found {
		t.Fatal("found a partial marker")
	}
	f.WriteString("ADY host=x\n\x1b[6nvm:/# ")
	if found, _ := sc.scan(p); !found {
		t.Fatal("marker split across reads not found")
	}
	var lines []string
	for i := 0; i < 30; i++ {
		lines = append(lines, fmt.Sprintf("line %d\r", i))
	}
	got := lastLines(strings.Join(lines, "\n")+"\n\n\x1b[6nprompt# ", 3)
	if got != "line 28\nline 29\nprompt# " {
		t.Errorf("lastLines = %q", got)
	}
}

func TestSaveHeader(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s")
	h := saveHeader{Format: saveFormat, ID: "a", CPU: 2, MemoryMiB: 256, NIC: true, Ready: true}
	f, err := createSaved(p, h)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("QEVM")
	f.Close()
	g, got, err := openSaved(p)
	if err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(g)
	g.Close()
	if string(rest) != "QEVM" || !got.Ready || got.CPU != 2 {
		t.Errorf("openSaved: %+v, stream %q", got, rest)
	}
	if err := got.compatible(backend.Spec{ID: "a", CPU: 2, MemoryMiB: 256, Network: &backend.Network{TapName: "t"}}); err != nil {
		t.Error(err)
	}
	if err := got.compatible(backend.Spec{ID: "a", CPU: 1, MemoryMiB: 256}); err == nil {
		t.Error("different shape accepted")
	}
	os.WriteFile(p, []byte("garbage"), 0o600)
	if _, _, err := openSaved(p); err == nil {
		t.Error("garbage accepted")
	}
}
