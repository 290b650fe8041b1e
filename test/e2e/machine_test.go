package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/testenv"
)

func deleteNodeAtEnd(t testing.TB, env *testenv.Env, name string) {
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
}

// A Machine applied with kubectl is scheduled, boots a real VM that answers
// on its address, and leaves no process, tap or state behind when deleted.
func TestMachineBootsAnswersAndLeavesNothingBehind(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	netNS := netns(t)
	state := t.TempDir()
	t.Cleanup(func() { killVMs(t, state) })
	startController(t, env)
	a := startAgent(t, env, "e2e-boot", state, netNS)
	deleteNodeAtEnd(t, env, "e2e-boot")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := os.ReadFile(a.log)
			t.Logf("kairon-node log:\n%s", tail(string(out), 40))
		}
	})

	env.KubectlStdin(t, `apiVersion: kairon.zyvor.dev/v1alpha1
kind: Machine
metadata:
  name: hello
spec: {}
`, "-n", ns, "apply", "-f", "-")
	key := client.ObjectKey{Namespace: ns, Name: "hello"}
	m := waitPhase(t, env, key, kaironv1.MachineRunning)
	if m.Spec.NodeName != "e2e-boot" || len(m.Status.Addresses) == 0 || m.Status.Acceleration == "" {
		t.Fatalf("running Machine lacks placement or status: node %q, %+v", m.Spec.NodeName, m.Status)
	}
	t.Logf("booted in %dms with %s", m.Status.BootMillis, m.Status.Acceleration)

	address := m.Status.Addresses[0].Address
	page, err := getInNetNS(netNS, "http://"+address+":8080/")
	if err != nil || !strings.Contains(page, "kairon guest hello") {
		t.Fatalf("guest at %s did not answer: %v %q", address, err, page)
	}
	vms := vmProcesses(t, state)
	if _, ok := vms[ns+"/hello"]; !ok || len(vms) != 1 {
		t.Fatalf("want one QEMU process named %s/hello, found %v", ns, vms)
	}

	logs, err := exec.Command(filepath.Join(env.BinDir, "kaironctl"), "--kubeconfig", env.Kubeconfig, "-n", ns, "logs", "machine", "hello").CombinedOutput()
	if err != nil || !strings.Contains(string(logs), "KAIRON-READY") {
		t.Errorf("kaironctl logs: %v\n%s", err, logs)
	}

	env.Kubectl(t, "-n", ns, "delete", "machine", "hello", "--wait=true", "--timeout=60s")
	if err := env.Client.Get(context.Background(), key, m); !apierrors.IsNotFound(err) {
		t.Fatalf("Machine still there after delete: %v", err)
	}
	if vms := vmProcesses(t, state); len(vms) != 0 {
		t.Errorf("QEMU processes left after delete: %v", vms)
	}
	if out, _ := exec.Command("ip", "-n", netNS, "-o", "link", "show", "type", "tun").CombinedOutput(); strings.Contains(string(out), network.TapName("e2e-boot", ns+"_hello")) {
		t.Errorf("tap left after delete:\n%s", out)
	}
	if left, _ := filepath.Glob(filepath.Join(state, "instances", "*")); len(left) != 0 {
		t.Errorf("instance state left after delete: %v", left)
	}
}

// Killing the agent never kills a VM: the next agent adopts both VMs with
// the same PIDs. A VM that dies is reported Failed with a reason.
func TestAgentRestartKeepsVMsAndCrashedVMFails(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	netNS := netns(t)
	state := t.TempDir()
	t.Cleanup(func() { killVMs(t, state) })
	startController(t, env)
	a := startAgent(t, env, "e2e-restart", state, netNS)
	deleteNodeAtEnd(t, env, "e2e-restart")

	for _, name := range []string{"one", "two"} {
		m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if err := env.Client.Create(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"one", "two"} {
		waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: name}, kaironv1.MachineRunning)
	}
	before := vmProcesses(t, state)
	if len(before) != 2 {
		t.Fatalf("want 2 VMs, found %v", before)
	}

	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Wait()
	if after := vmProcesses(t, state); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("VMs changed when the agent was killed: before %v, after %v", before, after)
	}

	startAgent(t, env, "e2e-restart", state, netNS)
	// Give the new agent time to adopt (or, wrongly, to restart) the VMs.
	testenv.Eventually(t, time.Minute, "node Ready again", func() (bool, string) {
		n := &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "e2e-restart"}, n); err != nil {
			return false, err.Error()
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && time.Since(c.LastHeartbeatTime.Time) < 5*time.Second {
				return true, ""
			}
		}
		return false, "not Ready"
	})
	// For longer than its reconcile tick (--interval 2s), it must leave them
	// as they are.
	testenv.Consistently(t, 3*time.Second, "the VMs adopted with their PIDs", func() (bool, string) {
		after := vmProcesses(t, state)
		// The new agent's acceleration probe is a short boot of its own,
		// not one of the Machines' VMs.
		delete(after, accelProbeVM)
		return fmt.Sprint(after) == fmt.Sprint(before), fmt.Sprintf("VMs %v, want the same PIDs %v", after, before)
	})
	for _, name := range []string{"one", "two"} {
		m := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, m); err != nil || m.Status.Phase != kaironv1.MachineRunning {
			t.Errorf("%s after restart: %v %s", name, err, m.Status.Phase)
		}
	}

	// Crash one VM.
	if err := syscall.Kill(before[ns+"/two"], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	failed := waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "two"}, kaironv1.MachineFailed)
	if failed.Status.Message == "" || failed.Status.ConsoleTail == "" {
		t.Errorf("failed Machine lacks a reason or console tail: %+v", failed.Status)
	}
	t.Logf("crash reported as: %s", failed.Status.Message)
	if vms := vmProcesses(t, state); len(vms) != 1 {
		t.Errorf("after the crash want only VM one, found %v", vms)
	}

	for _, name := range []string{"one", "two"} {
		_ = env.Client.Delete(ctx, &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}})
	}
	testenv.Eventually(t, time.Minute, "machines deleted", func() (bool, string) {
		list := &kaironv1.MachineList{}
		_ = env.Client.List(ctx, list, client.InNamespace(ns))
		return len(list.Items) == 0, fmt.Sprint(len(list.Items))
	})
	if vms := vmProcesses(t, state); len(vms) != 0 {
		t.Errorf("VMs left after deleting the Machines: %v", vms)
	}
}
