package main

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/localport"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// Commands that end before anything starts run in-process: they are about
// argument handling, not about processes.
func TestCommandsThatStartNothing(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "never-created")
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := strconv.Itoa(busy.Addr().(*net.TCPAddr).Port)
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{name: "version", args: []string{"version"}, wantStdout: "kairon-local dev go"},
		{name: "help", args: []string{"--help"}, wantStdout: "kairon-local up [flags]"},
		{name: "up help", args: []string{"up", "--help"}, wantStderr: "-data-dir string"},
		{name: "no command", args: nil, wantCode: 2, wantStderr: "Usage:"},
		{name: "unknown command", args: []string{"sideways"}, wantCode: 2, wantStderr: `unknown command "sideways"`},
		{name: "help lists down", args: []string{"help"}, wantStdout: "kairon-local down [flags]"},
		{name: "down help", args: []string{"down", "--help"}, wantStderr: "-purge"},
		{name: "down with an argument", args: []string{"down", "now"}, wantCode: 2, wantStderr: `unexpected argument "now"`},
		{name: "down on nothing", args: []string{"down", "--data-dir", dataDir}, wantStdout: "kairon-local: nothing runs on " + dataDir},
		{name: "down --purge on nothing", args: []string{"down", "--purge", "--data-dir", dataDir}, wantStdout: "does not exist; nothing to delete"},
		{name: "unknown flag", args: []string{"up", "--replicas", "3"}, wantCode: 2, wantStderr: "flag provided but not defined: -replicas"},
		{name: "bad port", args: []string{"up", "--port", "70000"}, wantCode: 2, wantStderr: "--port 70000 is not a TCP port"},
		{name: "bad ui port", args: []string{"up", "--ui-port", "0", "--data-dir", dataDir}, wantCode: 1, wantStderr: "--ui-port 0 is not a TCP port"},
		{name: "ui port taken", args: []string{"up", "--ui-port", busyPort, "--data-dir", dataDir}, wantCode: 1, wantStderr: "--ui-port " + busyPort + ": "},
		{
			name:       "unknown backend",
			args:       []string{"up", "--backend", "xen", "--data-dir", dataDir},
			wantCode:   1,
			wantStderr: "kairon-local: --backend \"xen\": must be qemu or sim\n",
		},
		{name: "too many nodes", args: []string{"up", "--nodes", "201", "--data-dir", dataDir}, wantCode: 1, wantStderr: "--nodes 201: at most 200 agents"},
		{name: "negative nodes", args: []string{"up", "--nodes", "-1", "--data-dir", dataDir}, wantCode: 1, wantStderr: "--nodes must be 0 or more"},
		{
			name:       "registry on all interfaces",
			args:       []string{"up", "--registry-address", "0.0.0.0:5000", "--data-dir", dataDir, "--ui=false"},
			wantCode:   1,
			wantStderr: `--registry-address "0.0.0.0:5000": host "0.0.0.0" is not a loopback address`,
		},
		{
			name:       "registry address taken",
			args:       []string{"up", "--registry-address", "127.0.0.1:" + busyPort, "--data-dir", dataDir, "--ui=false"},
			wantCode:   1,
			wantStderr: "--registry-address 127.0.0.1:" + busyPort + ": ",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(tt.args, &stdout, &stderr); code != tt.wantCode {
				t.Errorf("exit code %d, want %d\nstderr: %s", code, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantStdout) {
				t.Errorf("stdout %q does not contain %q", stdout.String(), tt.wantStdout)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr %q does not contain %q", stderr.String(), tt.wantStderr)
			}
		})
	}
	if _, err := os.Stat(dataDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused `up` created its data dir (%v): it must fail before touching anything", err)
	}
}

// upProcess is a running `kairon-local up` with its output in files.
type upProcess struct {
	cmd            *exec.Cmd
	stdout, stderr string
	exited         chan struct{}
}

func (p *upProcess) output() string {
	out, _ := os.ReadFile(p.stdout)
	errOut, _ := os.ReadFile(p.stderr)
	return "stdout:\n" + string(out) + "\nstderr:\n" + string(errOut)
}

// startUp runs the binary and returns once it printed that it is up. The
// test's cleanup kills it if the test ends before it was stopped.
func startUp(t *testing.T, exe string, args ...string) *upProcess {
	t.Helper()
	dir := t.TempDir()
	p := &upProcess{stdout: filepath.Join(dir, "stdout"), stderr: filepath.Join(dir, "stderr"), exited: make(chan struct{})}
	stdout, err := os.Create(p.stdout)
	if err != nil {
		t.Fatal(err)
	}
	defer stdout.Close()
	stderr, err := os.Create(p.stderr)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--ui") }) {
		// kairon-ui's default port is fixed, and other packages' tests
		// may run a kairon-local at the same time.
		args = append(args, "--ui-port", freePort(t))
	}
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--registry") }) {
		// The registry's default port is fixed too, and only
		// registry_test.go's tests are about it.
		args = append(args, "--registry=false")
	}
	p.cmd = exec.Command(exe, append([]string{"up"}, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = stdout, stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	})

	testenv.Eventually(t, 2*time.Minute, "kairon-local up to be up", func() (bool, string) {
		if out, _ := os.ReadFile(p.stdout); bytes.Contains(out, []byte("kairon-local is up")) {
			return true, ""
		}
		if p.hasExited() {
			t.Fatalf("kairon-local up exited (%v) before it was up\n%s", p.cmd.ProcessState, p.output())
		}
		return false, p.output()
	})
	return p
}

func (p *upProcess) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// waitExit waits for the process to end and expects status 0 and nothing
// of the data dir left running.
func (p *upProcess) waitExit(t *testing.T, dataDir, after string) {
	t.Helper()
	testenv.Eventually(t, 3*time.Minute, "kairon-local up to exit after "+after, func() (bool, string) {
		return p.hasExited(), "still running"
	})
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("kairon-local up exited with %d after %s, want 0\n%s", code, after, p.output())
	}
	procs, err := host.Processes(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, proc := range procs {
		t.Errorf("process %d outlived kairon-local: %s", proc.PID, proc.Cmdline)
		_ = syscall.Kill(proc.PID, syscall.SIGKILL)
	}
}

// terminate sends SIGTERM, as a service manager would, and expects a clean
// exit that leaves no process of the data dir behind.
func (p *upProcess) terminate(t *testing.T, dataDir string) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	p.waitExit(t, dataDir, "SIGTERM")
}

// jsonpath reads a field of one object of the kubeconfig's namespace, as
// kubectl get -o jsonpath prints it, without a kubectl process: the tests
// poll with it.
func jsonpath(t *testing.T, kubeconfig, resource, name, template string) string {
	t.Helper()
	out, err := testenv.JSONPath(kubeconfig, testenv.Query{Resource: resource, Name: name}, template)
	if err != nil {
		t.Fatalf("get %s %s -o jsonpath=%s: %v", resource, name, template, err)
	}
	return out
}

func TestUpServesKaironAndKeepsStateAcrossRestarts(t *testing.T) {
	binDir := host.BinDir(t)
	exe := buildKaironLocal(t)
	port := freePort(t)
	dataDir := t.TempDir()
	kubeconfig := filepath.Join(dataDir, "kubeconfig")
	args := []string{"--data-dir", dataDir, "--port", port, "--bin-dir", binDir, "--nodes", "0"}

	up := startUp(t, exe, args...)
	out, _ := os.ReadFile(up.stdout)
	for _, want := range []string{"https://127.0.0.1:" + port, "export KUBECONFIG=" + kubeconfig, "kubectl get crd"} {
		if !bytes.Contains(out, []byte(want)) {
			t.Errorf("how-to text lacks %q:\n%s", want, out)
		}
	}
	if crds := testenv.Kubectl(t, binDir, kubeconfig, "", "get", "crd", "-o", "name"); !strings.Contains(crds, "/machinepools.kairon.zyvor.dev\n") {
		t.Fatalf("machinepools.kairon.zyvor.dev not installed; CRDs:\n%s", crds)
	}
	pool := filepath.Join(t.TempDir(), "pool.yaml")
	if err := os.WriteFile(pool, []byte(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachinePool
metadata:
  name: builders
  namespace: default
spec:
  replicas: 2
  template:
    metadata:
      labels: {app: x}
    spec: {}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Kubectl(t, binDir, kubeconfig, "", "create", "-f", pool)
	up.terminate(t, dataDir)

	up = startUp(t, exe, args...)
	if got := testenv.Kubectl(t, binDir, kubeconfig, "", "get", "machinepool", "builders", "-o", "jsonpath={.spec.replicas}"); got != "2" {
		t.Errorf("MachinePool after restart: spec.replicas = %q, want 2", got)
	}
	up.terminate(t, dataDir)
}

// With agents, kairon-local is a whole Kairon: a Machine applied with kubectl
// is scheduled by kairon-controller and run by a node agent (the sim backend
// here; test/e2e boots real VMs).
func TestUpRunsControllerAndNodeAgents(t *testing.T) {
	binDir := host.BinDir(t)
	for _, bin := range []string{"kairon-controller", "kairon-node", "kaironctl", "kairon-ui"} {
		if _, err := os.Stat(filepath.Join(binDir, bin)); err != nil {
			t.Fatalf("%s missing in %s: run `make build`", bin, binDir)
		}
	}
	exe := buildKaironLocal(t)
	dataDir := t.TempDir()
	kubeconfig := filepath.Join(dataDir, "kubeconfig")
	uiPort := freePort(t)
	up := startUp(t, exe, "--data-dir", dataDir, "--port", "0", "--bin-dir", binDir, "--nodes", "2", "--backend", "sim", "--ui-port", uiPort)

	// kairon-ui runs with the rest, and up prints its URL.
	uiURL := "http://127.0.0.1:" + uiPort
	if out, _ := os.ReadFile(up.stdout); !bytes.Contains(out, []byte("Dashboard (kairon-ui, as the admin, on this machine only): "+uiURL+"\n")) {
		t.Errorf("up does not print kairon-ui's URL %s:\n%s", uiURL, out)
	}
	resp, err := http.Get(uiURL + "/api/v1/nodes")
	if err != nil {
		t.Fatalf("kairon-ui at %s: %v", uiURL, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"name":"node-1"`)) || !bytes.Contains(body, []byte(`"name":"node-2"`)) {
		t.Errorf("kairon-ui's /api/v1/nodes: %s %s", resp.Status, body)
	}

	nodes, err := exec.Command(filepath.Join(binDir, "kaironctl"), "--kubeconfig", kubeconfig, "get", "nodes").CombinedOutput()
	if err != nil {
		t.Fatalf("kaironctl get nodes: %v\n%s", err, nodes)
	}
	for _, want := range []string{"node-1", "node-2", "sim"} {
		if !strings.Contains(string(nodes), want) {
			t.Errorf("kaironctl get nodes lacks %q:\n%s", want, nodes)
		}
	}

	machine := filepath.Join(t.TempDir(), "machine.yaml")
	if err := os.WriteFile(machine, []byte("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata: {name: hello, namespace: default}\nspec: {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Kubectl(t, binDir, kubeconfig, "", "apply", "-f", machine)
	testenv.Eventually(t, time.Minute, "machine hello Running on a node", func() (bool, string) {
		phase := jsonpath(t, kubeconfig, "machine", "hello", "{.status.phase} {.spec.nodeName}")
		return strings.HasPrefix(phase, "Running node-"), phase
	})
	// Each component is itself, not the admin: the controller has its own
	// user, and the agent of the node hello is not on may not touch the
	// node hello is on, or hello.
	if who := testenv.Kubectl(t, binDir, filepath.Join(dataDir, "kairon-controller.kubeconfig"), "", "auth", "whoami", "-o", "jsonpath={.status.userInfo.username}"); who != "kairon:controller" {
		t.Errorf("kairon-controller's kubeconfig is user %q, want kairon:controller", who)
	}
	other := testenv.Kubectl(t, binDir, kubeconfig, "", "get", "machine", "hello", "-o", "jsonpath={.spec.nodeName}")
	actor := map[string]string{"node-1": "node-2", "node-2": "node-1"}[other]
	node1 := filepath.Join(dataDir, "node-"+actor+".kubeconfig")
	for _, args := range [][]string{
		{"label", "node", other, "kairon.zyvor.dev/backend=qemu", "--overwrite"},
		{"annotate", "machine", "hello", "x=y"},
		{"delete", "machine", "hello"},
	} {
		out, err := exec.Command(filepath.Join(binDir, "kubectl"), append([]string{"--kubeconfig", node1}, args...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "forbidden") || !strings.Contains(string(out), "kairon:node:"+actor) && !strings.Contains(string(out), "node agent of "+actor) {
			t.Errorf("kubectl %s as the other node's agent: %v, want forbidden\n%s", strings.Join(args, " "), err, out)
		}
	}
	testenv.Kubectl(t, binDir, kubeconfig, "", "delete", "machine", "hello", "--timeout=60s")
	up.terminate(t, dataDir)
}

// freePort is a TCP port free on 127.0.0.1 a moment ago, below the
// ephemeral range: one from port 0 was once taken by an outgoing
// connection before kairon-ui could listen on it.
func freePort(t *testing.T) string {
	t.Helper()
	port, err := localport.Free(nil)
	if err != nil {
		t.Fatal(err)
	}
	return strconv.Itoa(port)
}
