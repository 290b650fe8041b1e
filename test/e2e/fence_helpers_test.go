package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// Helpers of the node failure test (fence_local_test.go).

func listSnapshots(t *testing.T, env *testenv.Env, ns string) []kaironv1.MachineSnapshot {
	t.Helper()
	var l kaironv1.MachineSnapshotList
	if err := env.Client.List(context.Background(), &l, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// runningMachines waits until the Machines matching opts are want, all
// Running, and returns them.
func runningMachines(t *testing.T, env *testenv.Env, ns string, match client.MatchingLabels, want int) []kaironv1.Machine {
	t.Helper()
	var l kaironv1.MachineList
	testenv.Eventually(t, 3*time.Minute, fmt.Sprintf("%d Running machines %v", want, match), func() (bool, string) {
		if err := env.Client.List(context.Background(), &l, client.InNamespace(ns), match); err != nil {
			return false, err.Error()
		}
		n := 0
		for _, m := range l.Items {
			if m.Status.Phase == kaironv1.MachineRunning {
				n++
			}
		}
		return n == want && len(l.Items) == want, fmt.Sprintf("%d of %d Running", n, len(l.Items))
	})
	return l.Items
}

func nodeConditionStatus(t *testing.T, env *testenv.Env, name string, typ corev1.NodeConditionType) corev1.ConditionStatus {
	t.Helper()
	var n corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		return ""
	}
	for _, c := range n.Status.Conditions {
		if c.Type == typ {
			return c.Status
		}
	}
	return ""
}

// running: pid is a live process (not gone, not a zombie).
func running(pid int) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	if i := strings.LastIndexByte(string(raw), ')'); i > 0 && i+2 < len(raw) {
		return raw[i+2] != 'Z'
	}
	return true
}
