package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/testenv"
)

// What `make up` runs: kairon-local with the control plane, kairon-controller
// and a QEMU-backed agent. Its kubeconfig lists the eight CRDs, and a Machine
// applied with kubectl boots a real VM that answers on its address. The
// agent's network lives in a namespace the test creates.
func TestKaironLocalRunsRealVMs(t *testing.T) {
	binDir := testenv.BinDir(t)
	netNS := netns(t)
	dataDir := t.TempDir()
	t.Cleanup(func() { killVMs(t, dataDir) })
	kubeconfig := filepath.Join(dataDir, "kubeconfig")
	out := filepath.Join(t.TempDir(), "out")
	log, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	up := exec.Command(filepath.Join(binDir, "kairon-local"), "up", "--data-dir", dataDir, "--port", "0",
		"--nodes", "1", "--netns", netNS, "--node-cpu", "2", "--node-memory", "1Gi")
	up.Stdout, up.Stderr = log, log
	up.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- up.Wait() }()
	t.Cleanup(func() {
		_ = up.Process.Kill()
		if t.Failed() {
			text, _ := os.ReadFile(out)
			t.Logf("kairon-local output:\n%s", tail(string(text), 30))
		}
	})
	eventually(t, 3*time.Minute, "kairon-local up", func() (bool, string) {
		text, _ := os.ReadFile(out)
		return strings.Contains(string(text), "kairon-local is up"), tail(string(text), 3)
	})

	k := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(binDir, "kubectl"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, b)
		}
		return string(b)
	}
	crds := k("get", "crd", "-o", "name")
	for _, plural := range []string{"machines", "machinesets", "machinepools", "machineclaims",
		"machinedisruptionbudgets", "machinemigrations", "machinenetworkpolicies", "machinequotas"} {
		if !strings.Contains(crds, "customresourcedefinition.apiextensions.k8s.io/"+plural+".kairon.zyvor.dev\n") {
			t.Errorf("CRD %s.kairon.zyvor.dev missing:\n%s", plural, crds)
		}
	}

	machine := filepath.Join(t.TempDir(), "m.yaml")
	_ = os.WriteFile(machine, []byte("apiVersion: kairon.zyvor.dev/v1alpha1\nkind: Machine\nmetadata: {name: local, namespace: default}\nspec: {}\n"), 0o644)
	k("apply", "-f", machine)
	var address string
	eventually(t, 3*time.Minute, "machine local Running", func() (bool, string) {
		state := k("get", "machine", "local", "-o", "jsonpath={.status.phase} {.status.addresses[0].address}")
		phase, addr, _ := strings.Cut(state, " ")
		address = addr
		return phase == "Running" && addr != "", state
	})
	if page, err := getInNetNS(netNS, "http://"+address+":8080/"); err != nil || !strings.Contains(page, "kairon guest local") {
		t.Errorf("guest at %s did not answer: %v %q", address, err, page)
	}
	k("delete", "machine", "local", "--timeout=60s")
	if vms := vmProcesses(t, dataDir); len(vms) != 0 {
		t.Errorf("VMs left after delete: %v", vms)
	}

	if err := up.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("kairon-local exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("kairon-local still running a minute after SIGTERM")
	}
}
