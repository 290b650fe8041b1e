// Package e2e runs Kairon end to end: a real API server, the real
// kairon-controller and kairon-node binaries, real QEMU VMs, and a network
// namespace the test creates so guest traffic never leaves it.
package e2e

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
	"github.com/zyvor/kairon/internal/testenv/netlab"
)

func TestMain(m *testing.M) {
	os.Exit(testenv.Run(m))
}

// netns creates a network namespace for the test and removes it afterwards.
func netns(t testing.TB) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "kairon-e2e-" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name
}

// getInNetNS fetches url from inside the namespace.
func getInNetNS(ns, url string) (string, error) { return netlab.Get(ns, url) }

// agent is one kairon-node process.
type agent struct {
	cmd      *exec.Cmd
	stateDir string
	log      string
}

// startAgent runs bin/kairon-node for nodeName with 2 vCPUs and 2Gi, its
// network in ns.
func startAgent(t testing.TB, env *testenv.Env, nodeName, stateDir, ns string) *agent {
	t.Helper()
	return startAgentWithCapacity(t, env, nodeName, stateDir, ns, 2, "2Gi")
}

// poolNode is one QEMU node, in a network namespace of its own, with
// kairon-controller running: what the tests of pools on real guests stand
// on.
type poolNode struct {
	netNS string // the node network's namespace
	state string // the agent's state dir, where its VMs' files are
}

// startPoolNode starts kairon-controller and node name offering cpu vCPUs
// and memory. When the test ends its VMs are killed and its Node deleted;
// when it failed, the agent's log and ns's pool objects are logged first.
func startPoolNode(t *testing.T, env *testenv.Env, ns, name string, cpu int, memory string) poolNode {
	t.Helper()
	n := poolNode{netNS: netns(t), state: t.TempDir()}
	t.Cleanup(func() { killVMs(t, n.state) })
	startController(t, env)
	a := startAgentWithCapacity(t, env, name, n.state, n.netNS, cpu, memory)
	deleteNodeAtEnd(t, env, name)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := os.ReadFile(a.log)
			t.Logf("kairon-node log:\n%s", tail(string(out), 60))
			t.Logf("objects:\n%s", kubectlQuiet(env, "-n", ns, "get", "machinepools,machineclaims,machines", "-o", "wide"))
		}
	})
	return n
}

// startAgentWithCapacity runs bin/kairon-node offering cpu vCPUs and memory.
func startAgentWithCapacity(t testing.TB, env *testenv.Env, nodeName, stateDir, ns string, cpu int, memory string) *agent {
	t.Helper()
	return startAgentWith(t, env, nodeName, stateDir, ns, cpu, memory)
}

// startAgentWith runs bin/kairon-node with extra flags; later flags
// override the defaults.
func startAgentWith(t testing.TB, env *testenv.Env, nodeName, stateDir, ns string, cpu int, memory string, flags ...string) *agent {
	t.Helper()
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(stateDir, "agent.log")
	f, err := os.OpenFile(log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(env.BinDir, "kairon-node"),
		"--kubeconfig", env.Kubeconfig, "--node-name", nodeName, "--register",
		"--state-dir", stateDir, "--guest-dir", filepath.Join(env.BinDir, "guest"),
		"--cpu", strconv.Itoa(cpu), "--memory", memory, "--netns", ns, "--network-cidr", "10.88.40.0/24",
		"--listen", "127.0.0.1:0", "--interval", "2s",
		// kaironctl logs presents the admin's certificate.
		"--client-ca-file", filepath.Join(env.DataDir, "pki", "ca.crt"))
	cmd.Args = append(cmd.Args, flags...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	a := &agent{cmd: cmd, stateDir: stateDir, log: log}
	t.Cleanup(func() { a.kill() })
	return a
}

func (a *agent) kill() {
	if a.cmd.ProcessState == nil {
		_ = a.cmd.Process.Kill()
		_ = a.cmd.Wait()
	}
}

// startController runs bin/kairon-controller against the test API server.
func startController(t testing.TB, env *testenv.Env) {
	t.Helper()
	startControllerWith(t, env)
}

// startControllerWith runs bin/kairon-controller with extra flags; later
// flags override the defaults.
func startControllerWith(t testing.TB, env *testenv.Env, flags ...string) {
	t.Helper()
	// KAIRON_E2E_LOGS=DIR keeps the controller's log there, for reading a
	// benchmark's bind steps after the run.
	dir := os.Getenv("KAIRON_E2E_LOGS")
	if dir == "" {
		dir = t.TempDir()
	}
	log, err := os.CreateTemp(dir, "controller-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(env.BinDir, "kairon-controller"), append([]string{
		"-kubeconfig", env.Kubeconfig, "-interval", "2s",
		"-metrics-bind-address", "0", "-health-probe-bind-address", "0"}, flags...)...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
		if t.Failed() {
			out, _ := os.ReadFile(log.Name())
			t.Logf("kairon-controller log:\n%s", tail(string(out), 40))
		}
	})
}

// vmProcesses finds the QEMU processes running in a directory below dir (the
// backend runs each VM in its own state directory), keyed by their -name
// (namespace/machine).
func vmProcesses(t testing.TB, dir string) map[string]int {
	t.Helper()
	found := map[string]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd"))
		if err != nil || !strings.HasPrefix(cwd, dir+"/") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(raw), "\x00")
		if !strings.Contains(args[0], "qemu-system") {
			continue
		}
		for i, a := range args {
			if a == "-name" && i+1 < len(args) {
				found[strings.SplitN(args[i+1], ",", 2)[0]] = pid
			}
		}
	}
	return found
}

// accelProbeVM is the name of the short VM an agent boots at start to
// see whether KVM really works (vmProcesses lists it while it runs).
const accelProbeVM = "kairon/accel-probe"

// killVMs is the last-resort cleanup: no VM may outlive a test. The agents
// that could still start one must be gone first: they die with what
// started them (Pdeathsig), but not at once, and a VM started after the
// scan would outlive the test in its own session.
func killVMs(t testing.TB, dir string) {
	testenv.Eventually(t, time.Minute, "every process of "+dir+" to exit before its VMs are killed", func() (bool, string) {
		procs, err := host.Processes(dir)
		return err == nil && len(procs) == 0, fmt.Sprint(procs, err)
	})
	for _, pid := range vmProcesses(t, dir) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	testenv.Eventually(t, time.Minute, "the VMs of "+dir+" to exit", func() (bool, string) {
		vms := vmProcesses(t, dir)
		return len(vms) == 0, fmt.Sprint(vms)
	})
}

// waitPhase waits for a real guest's Machine: booting one takes minutes.
func waitPhase(t testing.TB, env *testenv.Env, key client.ObjectKey, want kaironv1.MachinePhase) *kaironv1.Machine {
	t.Helper()
	return env.WaitMachinePhase(t, key, want, 3*time.Minute)
}

func tail(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
