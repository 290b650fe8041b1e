package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/testenv"
)

// clonePool is a MachinePool of 256 MiB guests warmed from snapshot clones
// (or booted, with warmFrom Boot).
func clonePool(name, warmFrom string, replicas int) string {
	return fmt.Sprintf(`apiVersion: kairon.zyvor.dev/v1alpha1
kind: MachinePool
metadata:
  name: %s
spec:
  replicas: %d
  warmFrom: %s
  template:
    spec:
      cpu: 1
      memory: 256Mi
`, name, replicas, warmFrom)
}

// waitPoolSnapshot waits for the pool's SnapshotReady condition.
func waitPoolSnapshot(t testing.TB, env *testenv.Env, ns, pool string) *kaironv1.MachinePoolSnapshot {
	t.Helper()
	var snap *kaironv1.MachinePoolSnapshot
	testenv.Eventually(t, 4*time.Minute, "pool "+pool+" SnapshotReady", func() (bool, string) {
		p := &kaironv1.MachinePool{}
		if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: pool}, p); err != nil {
			return false, err.Error()
		}
		snap = p.Status.Snapshot
		c := meta.FindStatusCondition(p.Status.Conditions, kaironv1.ConditionSnapshotReady.String())
		return c != nil && c.Status == metav1.ConditionTrue && snap != nil, fmt.Sprintf("%+v %+v", c, snap)
	})
	return snap
}

// warmMembers lists the pool's Running warm members once there are n.
func warmMembers(t testing.TB, env *testenv.Env, ns, pool string, n int, limit time.Duration) []kaironv1.Machine {
	t.Helper()
	var running []kaironv1.Machine
	testenv.Eventually(t, limit, fmt.Sprintf("%d Running warm members of %s", n, pool), func() (bool, string) {
		list := &kaironv1.MachineList{}
		if err := env.Client.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{
			kaironv1.LabelMachinePool: pool, kaironv1.LabelPoolState: kaironv1.PoolStateWarm,
		}); err != nil {
			return false, err.Error()
		}
		running = nil
		var seen []string
		for _, m := range list.Items {
			if m.Status.Phase == kaironv1.MachineRunning && m.DeletionTimestamp == nil {
				running = append(running, m)
			}
			seen = append(seen, m.Name+"="+string(m.Status.Phase))
		}
		return len(running) == n && len(list.Items) == n, fmt.Sprint(seen)
	})
	return running
}

// Snapshot clones with real VMs (kairon-controller and kairon-node with
// QEMU, the node's network with its baseline pinning each tap to its
// Machine's MAC): the pool's template is booted, saved and stopped; two
// clones are restored from it, each with its own hostname, MAC and
// address, reading other random bytes than its sibling (through kaironctl
// exec and the guest agent); each answers on its own address from the
// namespace of the node's bridge; `kaironctl claim` binds a clone; and
// deleting the pool leaves no VM and no snapshot file.
func TestPoolClonesOfARealGuest(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	node := startPoolNode(t, env, ns, "e2e-clone", 6, "3Gi")
	netNS, state := node.netNS, node.state
	env.KubectlStdin(t, clonePool("agents", "Snapshot", 0), "-n", ns, "apply", "-f", "-")
	snap := waitPoolSnapshot(t, env, ns, "agents")
	if snap.NodeName != "e2e-clone" || !strings.HasPrefix(snap.Path, state) || snap.SizeBytes <= 0 {
		t.Errorf("snapshot %+v", snap)
	}
	if _, err := os.Stat(snap.Path); err != nil {
		t.Fatalf("snapshot file: %v", err)
	}
	if vms := vmProcesses(t, state); len(vms) != 0 {
		t.Errorf("the template's VM runs on after its save: %v", vms)
	}

	env.Kubectl(t, "-n", ns, "scale", "machinepool", "agents", "--replicas", "2")
	clones := warmMembers(t, env, ns, "agents", 2, 3*time.Minute)

	for _, m := range clones {
		if m.Spec.NodeName != snap.NodeName {
			t.Errorf("%s runs on %s, not on the template's node %s", m.Name, m.Spec.NodeName, snap.NodeName)
		}
	}
	checkCloneIdentities(t, env, ns, netNS, snap, clones)
	claimAClone(t, env, ns, snap)

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
	if vms := vmProcesses(t, state); len(vms) != 0 {
		t.Errorf("VMs left after deleting the pool and claims: %v", vms)
	}
	if _, err := os.Stat(snap.Path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("snapshot file left after its template went: %v", err)
	}
}

// kaironctlIn runs bin/kaironctl in namespace ns and returns its output.
func kaironctlIn(t testing.TB, env *testenv.Env, ns string, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(env.BinDir, "kaironctl"), append([]string{"--kubeconfig", env.Kubeconfig, "-n", ns}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("kaironctl %s: %v: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String()
}

// checkCloneIdentities checks, through kaironctl exec and the guest agent,
// that each clone of snap has its own hostname, MAC and address, reads
// other random bytes than its siblings, and answers on its own address
// from the namespace of the nodes' bridge (whose baseline lets only the
// Machine's own MAC and address out of its tap).
func checkCloneIdentities(t *testing.T, env *testenv.Env, ns, netNS string, snap *kaironv1.MachinePoolSnapshot, clones []kaironv1.Machine) {
	t.Helper()
	random := map[string]string{}
	addresses := map[string]string{}
	for _, m := range clones {
		if m.Annotations[kaironv1.AnnotationRestoreFrom] != snap.Machine || len(m.Status.Addresses) == 0 {
			t.Fatalf("%s is no clone of %s: annotations %v addresses %v", m.Name, snap.Machine, m.Annotations, m.Status.Addresses)
		}
		out := kaironctlIn(t, env, ns, "exec", m.Name, "--", "sh", "-c",
			"hostname; cat /sys/class/net/eth0/address; ip -4 -o addr show dev eth0 | awk '{print $4}'; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
		lines := strings.Split(out, "\n")
		addr := m.Status.Addresses[0].Address
		mac := network.MAC(ns + "_" + m.Name)
		if len(lines) != 4 || lines[0] != m.Name || lines[1] != mac || !strings.HasPrefix(lines[2], addr+"/") || len(lines[3]) != 64 {
			t.Errorf("%s (address %s, MAC %s) reports:\n%s", m.Name, addr, mac, out)
			continue
		}
		if other, seen := random[lines[3]]; seen {
			t.Errorf("%s read the same random bytes as %s", m.Name, other)
		}
		random[lines[3]] = m.Name
		if other, seen := addresses[addr]; seen {
			t.Errorf("%s and %s both have address %s", m.Name, other, addr)
		}
		addresses[addr] = m.Name
		page, err := getInNetNS(netNS, "http://"+addr+":8080/")
		if err != nil || !strings.Contains(page, "kairon guest") {
			t.Errorf("%s at %s did not answer: %v %q", m.Name, addr, err, page)
		}
		t.Logf("%s on %s: %s %s %s, Running %dms after its restore began", m.Name, m.Spec.NodeName, lines[0], lines[1], lines[2], m.Status.BootMillis)
	}
}

// claimAClone runs kaironctl claim on pool agents and checks that it bound
// a clone of snap; it returns that Machine.
func claimAClone(t *testing.T, env *testenv.Env, ns string, snap *kaironv1.MachinePoolSnapshot) *kaironv1.Machine {
	t.Helper()
	out := kaironctlIn(t, env, ns, "claim", "agents")
	match := boundLine.FindStringSubmatch(out)
	if match == nil {
		t.Fatalf("kaironctl claim printed %q", out)
	}
	m := &kaironv1.Machine{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: match[2]}, m); err != nil {
		t.Fatal(err)
	}
	if m.Annotations[kaironv1.AnnotationRestoreFrom] != snap.Machine {
		t.Errorf("the claim bound %s, which is no clone", m.Name)
	}
	t.Logf("%s", strings.TrimSpace(out))
	return m
}
