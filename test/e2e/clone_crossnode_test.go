package e2e

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// Snapshot clones on a node without the template (kairon-controller, two
// kairon-node agents with QEMU in one network namespace, each with its own
// address pool of one bridge's range): the pool's template is booted and
// saved on node A; A is cordoned and node B joins; the pool's two clones
// are scheduled to B, which fetches the template's state from A over the
// migration listener once and restores both from its copy; each clone has
// its own hostname, MAC and address (one of B's), reads other random bytes
// than its sibling, and answers on its own address; `kaironctl claim` binds
// a clone on B; deleting the pool leaves no VM, no template file on A and
// no copy on B.
func TestPoolClonesOnANodeWithoutTheTemplate(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	netNS := netns(t)
	// Short: the VMs' sockets are created below it.
	state, err := os.MkdirTemp("", "kcx-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(state) })
	t.Cleanup(func() { killVMs(t, state) })
	deleteMachinesAtEnd(t, env, ns)
	nodeA, nodeB := ns+"-a", ns+"-b"
	startController(t, env)
	agentFlags := func(i int) []string {
		return []string{"--network-cidr", "10.88.0.0/16", "--address-pool", fmt.Sprintf("10.88.%d.0/24", 71+i),
			// The template's state goes from A to B over the migration
			// listener: plain TCP on loopback, for tests.
			"--migration-listen", "127.0.0.1:0", "--migration-insecure"}
	}
	agents := map[string]*agent{}
	agents[nodeA] = startAgentWith(t, env, nodeA, filepath.Join(state, "a"), netNS, 4, "3Gi", agentFlags(0)...)
	deleteNodeAtEnd(t, env, nodeA)
	waitNodeReady(t, env, nodeA)
	t.Cleanup(func() {
		if t.Failed() {
			for name, a := range agents {
				out, _ := os.ReadFile(a.log)
				t.Logf("kairon-node %s log:\n%s", name, tail(string(out), 40))
			}
			t.Logf("objects:\n%s", kubectlQuiet(env, "-n", ns, "get", "machinepools,machineclaims,machines", "-o", "wide"))
		}
	})

	env.KubectlStdin(t, clonePool("agents", "Snapshot", 0), "-n", ns, "apply", "-f", "-")
	snap := waitPoolSnapshot(t, env, ns, "agents")
	if snap.NodeName != nodeA || !strings.HasPrefix(snap.Path, filepath.Join(state, "a")) {
		t.Fatalf("snapshot %+v, want it on %s", snap, nodeA)
	}
	tmpl := &kaironv1.Machine{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: snap.Machine}, tmpl); err != nil {
		t.Fatal(err)
	}
	if tmpl.Status.Snapshot == nil || tmpl.Status.Snapshot.SHA256 != testenv.FileSHA256(t, snap.Path) {
		t.Errorf("template status.snapshot %+v: no SHA-256 of its file", tmpl.Status.Snapshot)
	}

	// A has no room for clones; B, which has no file, joins.
	env.Kubectl(t, "cordon", nodeA)
	agents[nodeB] = startAgentWith(t, env, nodeB, filepath.Join(state, "b"), netNS, 4, "3Gi", agentFlags(1)...)
	deleteNodeAtEnd(t, env, nodeB)
	waitNodeReady(t, env, nodeB)
	env.Kubectl(t, "-n", ns, "scale", "machinepool", "agents", "--replicas", "2")
	clones := warmMembers(t, env, ns, "agents", 2, 4*time.Minute)
	for _, m := range clones {
		if m.Spec.NodeName != nodeB || len(m.Status.Addresses) == 0 || !strings.HasPrefix(m.Status.Addresses[0].Address, "10.88.72.") {
			t.Errorf("clone %s on %s with addresses %v, want it on %s with one of its addresses", m.Name, m.Spec.NodeName, m.Status.Addresses, nodeB)
		}
	}
	copies, _ := filepath.Glob(filepath.Join(state, "b", "fetched-templates", "*.state"))
	if len(copies) != 1 {
		t.Errorf("template copies on %s: %v, want one for both clones", nodeB, copies)
	} else if got := testenv.FileSHA256(t, copies[0]); got != tmpl.Status.Snapshot.SHA256 {
		t.Errorf("the copy on %s has SHA-256 %s, the template's file %s", nodeB, got, tmpl.Status.Snapshot.SHA256)
	}
	checkCloneIdentities(t, env, ns, netNS, snap, clones)
	if m := claimAClone(t, env, ns, snap); m.Spec.NodeName != nodeB {
		t.Errorf("the claim bound %s on %s, want a clone on %s", m.Name, m.Spec.NodeName, nodeB)
	}

	env.Kubectl(t, "-n", ns, "delete", "machineclaims,machinepools", "--all", "--wait=true", "--timeout=2m")
	testenv.Eventually(t, 2*time.Minute, "every Machine deleted", func() (bool, string) {
		list := &kaironv1.MachineList{}
		_ = env.Client.List(ctx, list, client.InNamespace(ns))
		var left []string
		for _, m := range list.Items {
			left = append(left, m.Name)
		}
		return len(left) == 0, fmt.Sprint(left)
	})
	// B's sweep looks every 15 s.
	testenv.Eventually(t, 2*time.Minute, "no VM, template file or copy left", func() (bool, string) {
		vms := vmProcesses(t, state)
		copies, _ := filepath.Glob(filepath.Join(state, "b", "fetched-templates", "*"))
		_, err := os.Stat(snap.Path)
		return len(vms) == 0 && len(copies) == 0 && errors.Is(err, fs.ErrNotExist), fmt.Sprint(vms, copies, err)
	})
}
