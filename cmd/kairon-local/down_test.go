package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// fakeVMEnv makes the test binary, started by startFakeVM, wait to be
// killed instead of running the tests: a process that looks like a VM.
const fakeVMEnv = "KAIRON_LOCAL_TEST_FAKE_VM"

func TestMain(m *testing.M) {
	if os.Getenv(fakeVMEnv) != "" {
		select {} // until killed
	}
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// startFakeVM runs a process that kairon-local takes for the QEMU of
// Machine name: its argv[0] is qemu-system-x86_64 and its working
// directory dir, as the qemu backend runs VMs. It is killed when the test
// ends, and with the test process.
func startFakeVM(t *testing.T, dir, name string) *exec.Cmd {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := &exec.Cmd{
		Path:        exe,
		Args:        []string{"qemu-system-x86_64", "-name", name + ",debug-threads=on", "-M", "microvm"},
		Dir:         dir,
		Env:         append(os.Environ(), fakeVMEnv+"=1"),
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	testenv.Eventually(t, 10*time.Second, "the fake VM to run", func() (bool, string) {
		argv := readArgv(cmd.Process.Pid)
		return len(argv) > 0 && argv[0] == "qemu-system-x86_64", strings.Join(argv, " ")
	})
	return cmd
}

func TestParseVMProcess(t *testing.T) {
	qemu := []string{"/usr/bin/qemu-system-x86_64", "-name", "default/hello", "-M", "microvm,x-option-roms=off"}
	tests := []struct {
		name   string
		argv   []string
		cwd    string
		want   vmProcess
		wantOK bool
	}{
		{
			name: "VM of a data dir", argv: qemu, cwd: "/home/me/kairon/.kairon/nodes/node-1/instances/default_hello",
			want:   vmProcess{PID: 7, Name: "default/hello", Dir: "/home/me/kairon/.kairon/nodes/node-1/instances/default_hello", DataDir: "/home/me/kairon/.kairon"},
			wantOK: true,
		},
		{
			name: "VM of a deleted data dir", argv: qemu, cwd: "/tmp/d/nodes/node-2/instances/default_hello (deleted)",
			want:   vmProcess{PID: 7, Name: "default/hello", Dir: "/tmp/d/nodes/node-2/instances/default_hello", DataDir: "/tmp/d", Deleted: true},
			wantOK: true,
		},
		{
			name: "jailed VM", argv: qemu, cwd: "/home/me/kairon/.kairon/nodes/node-1/instances/default_hello/jail",
			want:   vmProcess{PID: 7, Name: "default/hello", Dir: "/home/me/kairon/.kairon/nodes/node-1/instances/default_hello", DataDir: "/home/me/kairon/.kairon"},
			wantOK: true,
		},
		{
			name: "jailed VM of a deleted data dir", argv: qemu, cwd: "/tmp/d/nodes/node-2/instances/default_hello/jail (deleted)",
			want:   vmProcess{PID: 7, Name: "default/hello", Dir: "/tmp/d/nodes/node-2/instances/default_hello", DataDir: "/tmp/d", Deleted: true},
			wantOK: true,
		},
		{
			name: "name with QEMU options", argv: []string{"qemu-system-x86_64", "-name", "ns/web-1,debug-threads=on"}, cwd: "/d/nodes/node-1/instances/ns_web-1",
			want:   vmProcess{PID: 7, Name: "ns/web-1", Dir: "/d/nodes/node-1/instances/ns_web-1", DataDir: "/d"},
			wantOK: true,
		},
		{name: "a kairon-node agent's VM (Helm layout)", argv: qemu, cwd: "/var/lib/kairon-node/instances/default_hello"},
		{name: "not QEMU", argv: []string{"/usr/bin/sleep", "100"}, cwd: "/d/nodes/node-1/instances/default_x"},
		{name: "QEMU elsewhere", argv: qemu, cwd: "/home/me"},
		{name: "QEMU in the instances dir itself", argv: qemu, cwd: "/d/nodes/node-1/instances"},
		{name: "no argv", argv: nil, cwd: "/d/nodes/node-1/instances/default_x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseVMProcess(7, tt.argv, tt.cwd)
			if ok != tt.wantOK || got != tt.want {
				t.Errorf("parseVMProcess = %+v, %v; want %+v, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestOrphans(t *testing.T) {
	vm := func(pid int, dataDir string, deleted bool) vmProcess {
		return vmProcess{PID: pid, Name: "default/vm" + strconv.Itoa(pid), DataDir: dataDir, Dir: dataDir + "/nodes/node-1/instances/x", Deleted: deleted}
	}
	existing := map[string]bool{"/live": true, "/recreated": true}
	exists := func(dir string) bool { return existing[dir] }
	tests := []struct {
		name string
		vms  []vmProcess
		want []orphanGroup
	}{
		{name: "none", vms: nil, want: nil},
		{name: "VMs of a live data dir are adopted, not orphans", vms: []vmProcess{vm(1, "/live", false), vm(2, "/live", false)}, want: nil},
		{
			name: "data dir gone",
			vms:  []vmProcess{vm(1, "/gone", true), vm(2, "/live", false), vm(3, "/gone", true)},
			want: []orphanGroup{{DataDir: "/gone", VMs: []vmProcess{vm(1, "/gone", true), vm(3, "/gone", true)}}},
		},
		{
			name: "data dir deleted and made anew",
			vms:  []vmProcess{vm(4, "/recreated", true), vm(5, "/recreated", false)},
			want: []orphanGroup{{DataDir: "/recreated", Recreated: true, VMs: []vmProcess{vm(4, "/recreated", true)}}},
		},
		{
			name: "a missing data dir whose VM's directory the kernel still shows",
			vms:  []vmProcess{vm(6, "/moved", false)},
			want: []orphanGroup{{DataDir: "/moved", VMs: []vmProcess{vm(6, "/moved", false)}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := orphans(tt.vms, exists); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("orphans = %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestFlockHolders(t *testing.T) {
	const locks = `1: FLOCK  ADVISORY  WRITE 4242 08:02:1835018 0 EOF
1: -> FLOCK  ADVISORY  WRITE 5151 08:02:1835018 0 EOF
2: POSIX  ADVISORY  WRITE 6161 08:02:1835018 0 EOF
3: FLOCK  ADVISORY  WRITE 7171 fd:01:99 0 EOF
4: OFDLCK ADVISORY  READ  -1 00:05:1234 0 EOF
`
	tests := []struct {
		name         string
		major, minor uint32
		ino          uint64
		want         []int
	}{
		{name: "holder, not the waiter nor a POSIX lock", major: 8, minor: 2, ino: 1835018, want: []int{4242}},
		{name: "hex device numbers", major: 0xfd, minor: 1, ino: 99, want: []int{7171}},
		{name: "device reported differently by stat (btrfs)", major: 0, minor: 0x2d, ino: 99, want: []int{7171}},
		{name: "not locked", major: 8, minor: 2, ino: 5, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := flockHolders(locks, tt.major, tt.minor, tt.ino); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("flockHolders = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestIsKaironLocalUp(t *testing.T) {
	for _, tt := range []struct {
		argv []string
		want bool
	}{
		{[]string{"/work/bin/kairon-local", "up", "--data-dir", ".kairon"}, true},
		{[]string{"bin/kairon-local", "up"}, true},
		{[]string{"kairon-local", "--v", "up"}, true},
		{[]string{"/work/bin/kairon-local", "down"}, false},
		{[]string{"/usr/bin/vim", "kairon-local", "up"}, false},
		{[]string{"/usr/bin/kairon-local-old", "up"}, false},
		{nil, false},
	} {
		if got := isKaironLocalUp(tt.argv); got != tt.want {
			t.Errorf("isKaironLocalUp(%q) = %v, want %v", tt.argv, got, tt.want)
		}
	}
}

func TestIsLeftover(t *testing.T) {
	for _, tt := range []struct {
		argv []string
		want bool
	}{
		{[]string{"/b/kairon-node", "--state-dir", "/d/nodes/node-1"}, true},
		{[]string{"/b/etcd", "--data-dir=/d/etcd"}, true},
		{[]string{"/b/kube-apiserver", "--tls-cert-file=/d/pki/apiserver.crt"}, true},
		{[]string{"/b/kairon-controller", "-kubeconfig", "/d/kubeconfig"}, true},
		{[]string{"/b/kairon-ui", "--kubeconfig", "/d/kubeconfig", "--listen", "127.0.0.1:8090"}, true},
		{[]string{"/b/kairon-node", "--state-dir", "/dd/nodes/node-1"}, false},
		{[]string{"/usr/bin/less", "/d/logs/etcd.log"}, false},
		{[]string{"/b/etcd", "--data-dir=/other/etcd"}, false},
	} {
		if got := isLeftover(tt.argv, "/d"); got != tt.want {
			t.Errorf("isLeftover(%q) = %v, want %v", tt.argv, got, tt.want)
		}
	}
}

// runningUp trusts only the kernel's lock table: a pid in the lock file
// means nothing unless that process holds the lock and is a kairon-local.
func TestRunningUp(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T, dir string)
		wantErr error
	}{
		{name: "no data dir", setup: func(t *testing.T, dir string) { os.RemoveAll(dir) }},
		{name: "never started", setup: func(t *testing.T, dir string) {}},
		{
			// What a kill -9 leaves: the lock file with a pid that now
			// names something else (here: this test, and init).
			name: "stale pid of a live process",
			setup: func(t *testing.T, dir string) {
				writeFile(t, filepath.Join(dir, "lock"), strconv.Itoa(os.Getpid())+"\n")
			},
		},
		{name: "stale pid of init", setup: func(t *testing.T, dir string) { writeFile(t, filepath.Join(dir, "lock"), "1\n") }},
		{
			name: "locked by something that is not kairon-local",
			setup: func(t *testing.T, dir string) {
				path := filepath.Join(dir, "lock")
				writeFile(t, path, "1\n")
				f, err := os.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: errNotKaironLocal,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.setup(t, dir)
			pid, err := runningUp(dir)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("runningUp: %d, %v; want error %v", pid, err, tt.wantErr)
			}
			if err == nil && pid != 0 {
				t.Errorf("runningUp found pid %d, want none", pid)
			}
			// down acts on what runningUp says: it must refuse, or find
			// nothing, and kill nothing.
			var stdout, stderr bytes.Buffer
			code := run([]string{"down", "--data-dir", dir}, &stdout, &stderr)
			if tt.wantErr != nil && (code != 1 || !strings.Contains(stderr.String(), "not stopping it")) {
				t.Errorf("down: exit %d, stderr %q; want 1 and a refusal", code, stderr.String())
			}
			if tt.wantErr == nil && (code != 0 || !strings.Contains(stdout.String(), "nothing runs")) {
				t.Errorf("down: exit %d, stdout %q, stderr %q; want 0 and nothing stopped", code, stdout.String(), stderr.String())
			}
		})
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// down --purge deletes only what looks like a data dir.
func TestDownPurgeRefusesOtherDirectories(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "precious"), "x")
	var stdout, stderr bytes.Buffer
	if code := run([]string{"down", "--purge", "--data-dir", dir}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "is not a kairon-local data dir") {
		t.Errorf("exit %d, stderr %q; want 1 and a refusal", code, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "precious")); err != nil {
		t.Errorf("the directory was touched: %v", err)
	}
}

// built is this package's kairon-local, built once for every test that
// runs it: each link of the 40 MB binary took seconds of CPU, and no test
// changes the binary. TestMain removes dir.
var built struct {
	once     sync.Once
	dir, exe string
	err      error
}

// buildKaironLocal returns the path of kairon-local built from this
// package's source.
func buildKaironLocal(t *testing.T) string {
	t.Helper()
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "kairon-local-test-")
		if built.err != nil {
			return
		}
		exe := filepath.Join(built.dir, "kairon-local")
		if out, err := exec.Command("go", "build", "-o", exe, ".").CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		built.exe = exe
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.exe
}

func runBinary(t *testing.T, exe string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// `up` warns about VMs whose data dir was deleted under them, and `down`
// on that dir stops them.
func TestUpWarnsAboutVMsOfDeletedDataDirs(t *testing.T) {
	binDir := host.BinDir(t)
	exe := buildKaironLocal(t)
	old := filepath.Join(t.TempDir(), "old-data")
	ghost := startFakeVM(t, filepath.Join(old, "nodes", "node-1", "instances", "default_ghost"), "default/ghost")
	if err := os.RemoveAll(old); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(ghost.Process.Pid)

	dataDir := t.TempDir()
	up := startUp(t, exe, "--data-dir", dataDir, "--port", "0", "--bin-dir", binDir, "--nodes", "0")
	errOut, _ := os.ReadFile(up.stderr)
	for _, want := range []string{
		"warning: 1 VM is still running from data dir " + old + ", which no longer exists: pid " + pid + " (default/ghost)",
		"kill " + pid,
	} {
		if !strings.Contains(string(errOut), want) {
			t.Errorf("up's output lacks %q:\n%s", want, errOut)
		}
	}
	up.terminate(t, dataDir)

	stdout, stderr, code := runBinary(t, exe, "down", "--data-dir", old)
	if code != 0 || !strings.Contains(stdout, "stopping VM default/ghost (pid "+pid+")") {
		t.Errorf("down --data-dir %s: exit %d\nstdout: %s\nstderr: %s", old, code, stdout, stderr)
	}
	if alive(ghost.Process.Pid) {
		t.Errorf("the VM of the deleted data dir still runs after down")
	}
}

// `down` stops the kairon-local of a data dir (its agents save their VMs)
// and what a killed one left running; `down --purge` also deletes the dir.
func TestDownStopsUpAndWhatItLeft(t *testing.T) {
	binDir := host.BinDir(t)
	exe := buildKaironLocal(t)
	dataDir := t.TempDir()
	kubeconfig := filepath.Join(dataDir, "kubeconfig")
	up := startUp(t, exe, "--data-dir", dataDir, "--port", "0", "--bin-dir", binDir, "--nodes", "1", "--backend", "sim")
	testenv.Kubectl(t, binDir, kubeconfig, "", "apply", "-f", writeTemp(t, "apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata: {name: hello, namespace: default}\nspec: {}\n"))
	testenv.Eventually(t, time.Minute, "machine hello Running", func() (bool, string) {
		phase := jsonpath(t, kubeconfig, "machine", "hello", "{.status.phase}")
		return phase == "Running", phase
	})
	// A VM an earlier, killed kairon-local left in this data dir.
	left := startFakeVM(t, filepath.Join(dataDir, "nodes", "node-9", "instances", "default_left"), "default/left")

	stdout, stderr, code := runBinary(t, exe, "down", "--data-dir", dataDir)
	if code != 0 {
		t.Fatalf("down: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	up.waitExit(t, dataDir, "down")
	for _, want := range []string{
		"stopping kairon-local (pid " + strconv.Itoa(up.cmd.Process.Pid) + ") on " + dataDir,
		"stopping VM default/left (pid " + strconv.Itoa(left.Process.Pid) + ")",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("down's output lacks %q:\n%s", want, stdout)
		}
	}
	if alive(left.Process.Pid) {
		t.Error("the VM left in the data dir still runs after down")
	}
	if out := up.output(); !strings.Contains(out, "1 VM(s) saved") {
		t.Errorf("up did not report the saved VM:\n%s", out)
	}
	if saved, _ := filepath.Glob(filepath.Join(dataDir, "nodes", "node-1", "suspended", "default_hello.*")); len(saved) != 2 {
		t.Errorf("the agent's saved VM: %v, want its record and state", saved)
	}

	stdout, stderr, code = runBinary(t, exe, "down", "--data-dir", dataDir)
	if code != 0 || !strings.Contains(stdout, "nothing runs on "+dataDir) {
		t.Errorf("a second down: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	stdout, stderr, code = runBinary(t, exe, "down", "--purge", "--data-dir", dataDir)
	if code != 0 || !strings.Contains(stdout, "deleted "+dataDir) {
		t.Errorf("down --purge: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the data dir is still there after down --purge: %v", err)
	}
}

func writeTemp(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	writeFile(t, path, content)
	return path
}
