package node_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/testenv/host"
)

// sharedBridge puts an agent on kairon-local's network: one bridge in one
// network namespace for every node, one range, a pool of it per node.
func sharedBridge(netns, pool string) func(*node.Options) {
	return func(o *node.Options) {
		o.Network = &node.NetworkOptions{CIDR: netip.MustParsePrefix("10.88.0.0/16"), Pool: netip.MustParsePrefix(pool), Bridge: "kbr0", NetNS: netns}
	}
}

func testNetns(t *testing.T, prefix string) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	netns := prefix + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", netns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", netns).Run() })
	return netns
}

func createMachine(t *testing.T, env *testenv.Env, ns, name, nodeName string) *kaironv1.Machine {
	t.Helper()
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineSpec{NodeName: nodeName}}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return m
}

func addressOf(t *testing.T, m *kaironv1.Machine) string {
	t.Helper()
	if len(m.Status.Addresses) != 1 {
		t.Fatalf("machine %s/%s has addresses %v, want one", m.Namespace, m.Name, m.Status.Addresses)
	}
	return m.Status.Addresses[0].Address
}

// pinnedTo tells whether the baseline pins the tap of instance id on
// nodeName to addr.
func pinnedTo(t *testing.T, netns, nodeName, id, addr string) bool {
	t.Helper()
	tap := network.TapName(nodeName, id)
	out, err := exec.Command("ip", "netns", "exec", netns, "nft", "list", "chain", "bridge", network.BaselineTable, "g_"+tap).CombinedOutput()
	return err == nil && strings.Contains(string(out), "ip saddr != "+addr+" drop")
}

// The red team's break (issue 42): on kairon-local's shared bridge a guest
// migrated away kept its address, and the node it left gave the same
// address to a new VM of another namespace. The address must stay the
// moved guest's, cold or live, until it is gone; then it is free again.
func TestAddressesStayUniqueAfterAMigration(t *testing.T) {
	host.SkipIfShort(t, "root, to make network namespaces, and the control plane")
	for _, strategy := range []kaironv1.MigrationStrategy{kaironv1.MigrationCold, kaironv1.MigrationLive} {
		t.Run(string(strategy), func(t *testing.T) {
			env := testenv.Get(t)
			ns, other := env.Namespace(t), env.Namespace(t)
			ctx := context.Background()
			netns := testNetns(t, "kairon-addr-")
			source, target := "addr-"+strings.ToLower(string(strategy))+"-2", "addr-"+strings.ToLower(string(strategy))+"-1"
			snapshots := t.TempDir()
			store := func(o *node.Options) { o.SnapshotDir, o.SnapshotStore = snapshots, "shared" }
			sourceOpts := []func(*node.Options){sharedBridge(netns, "10.88.2.0/24"), store}
			targetOpts := []func(*node.Options){sharedBridge(netns, "10.88.1.0/24"), store}
			if strategy == kaironv1.MigrationLive {
				ca := newMigrationCA(t, "kairon migration CA")
				sourceOpts = append(sourceOpts, withTLS(ca.dir(t, source)))
				targetOpts = append(targetOpts, withTLS(ca.dir(t, target)))
			}
			sourceState := t.TempDir()
			runControllers(t, env)
			runSimAgent(t, env, source, sourceState, nil, sourceOpts...)
			runSimAgent(t, env, target, t.TempDir(), nil, targetOpts...)

			vm := waitPhase(t, env, client.ObjectKeyFromObject(createMachine(t, env, ns, "vm", source)), kaironv1.MachineRunning)
			moving := addressOf(t, vm)
			if !netip.MustParsePrefix("10.88.2.0/24").Contains(netip.MustParseAddr(moving)) {
				t.Fatalf("the Machine on %s has %s, not an address of its pool", source, moving)
			}
			// A snapshot of the guest, restored on the source below.
			snap := &kaironv1.MachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "snap"}, Spec: kaironv1.MachineSnapshotSpec{MachineName: "vm"}}
			if err := env.Client.Create(ctx, snap); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, waitTimeout, "snapshot Ready", func() (bool, string) {
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(snap), snap); err != nil {
					return false, err.Error()
				}
				return snap.Status.Phase == kaironv1.SnapshotReady, string(snap.Status.Phase) + ": " + snap.Status.Message
			})
			waitPhase(t, env, client.ObjectKeyFromObject(vm), kaironv1.MachineRunning)
			waitNodeReady(t, env, target)
			mig := &kaironv1.MachineMigration{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move"},
				Spec:       kaironv1.MachineMigrationSpec{MachineName: "vm", TargetNode: target, Strategy: strategy},
			}
			if err := env.Client.Create(ctx, mig); err != nil {
				t.Fatal(err)
			}
			waitMigration(t, env, client.ObjectKeyFromObject(mig), kaironv1.MigrationSucceeded)
			moved := waitPhase(t, env, client.ObjectKeyFromObject(vm), kaironv1.MachineRunning)
			if moved.Spec.NodeName != target || addressOf(t, moved) != moving {
				t.Fatalf("after the move: on %s with %v, want on %s with %s", moved.Spec.NodeName, moved.Status.Addresses, target, moving)
			}
			// The source is done with the guest once its instance is gone
			// and its address is no longer its VM's: released, or held for
			// the guest that left.
			testenv.Eventually(t, waitTimeout, "the source done with the guest", func() (bool, string) {
				allocations, held := ipamState(t, sourceState)
				_, allocated := allocations[ns+"_vm"]
				return !instanceExists(sourceState, ns, "vm") && (!allocated || slices.Contains(held, ns+"_vm")),
					fmt.Sprintf("instance there: %v, allocations %v, held %v", instanceExists(sourceState, ns, "vm"), allocations, held)
			})

			// Another namespace's new VM on the node the guest left.
			newcomer := waitPhase(t, env, client.ObjectKeyFromObject(createMachine(t, env, other, "newcomer", source)), kaironv1.MachineRunning)
			if got := addressOf(t, newcomer); got == moving {
				t.Fatalf("the new Machine of namespace %s on %s got %s, the address of the migrated guest of %s", other, source, got, ns)
			}
			if !pinnedTo(t, netns, target, ns+"_vm", moving) {
				t.Errorf("the migrated guest's tap on %s is not pinned to its address %s", target, moving)
			}
			if !pinnedTo(t, netns, source, other+"_newcomer", addressOf(t, newcomer)) {
				t.Errorf("the new guest's tap on %s is not pinned to its address %s", source, addressOf(t, newcomer))
			}

			// A Machine restored from the guest's snapshot on the node it
			// left: the guest's memory, an address of its own.
			restored := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "restored"},
				Spec: kaironv1.MachineSpec{NodeName: source, RestoreFrom: &kaironv1.RestoreSource{SnapshotName: "snap"}}}
			if err := env.Client.Create(ctx, restored); err != nil {
				t.Fatal(err)
			}
			restored = waitPhase(t, env, client.ObjectKeyFromObject(restored), kaironv1.MachineRunning)
			if got := addressOf(t, restored); got == moving || got == addressOf(t, newcomer) {
				t.Fatalf("the Machine restored from the snapshot on %s got %s, held by another (migrated %s, new %s)", source, got, moving, addressOf(t, newcomer))
			}

			// Once the migrated guest is gone, its address is the source
			// pool's again: holding it does not leak it.
			if err := env.Client.Delete(ctx, moved); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, waitTimeout, "the migrated Machine gone", func() (bool, string) {
				err := env.Client.Get(ctx, client.ObjectKeyFromObject(moved), &kaironv1.Machine{})
				return client.IgnoreNotFound(err) == nil && err != nil, "still there"
			})
			testenv.Eventually(t, waitTimeout, "the source's hold on "+moving+" released", func() (bool, string) {
				_, held := ipamState(t, sourceState)
				return len(held) == 0, "held: " + strings.Join(held, ", ")
			})
			again := waitPhase(t, env, client.ObjectKeyFromObject(createMachine(t, env, other, "again", source)), kaironv1.MachineRunning)
			if got := addressOf(t, again); got != moving {
				t.Errorf("a new Machine on %s after the migrated one went got %s, want the freed %s (the lowest of the pool)", source, got, moving)
			}
		})
	}
}

// ipamState reads an agent's allocations, and the instances whose address
// it holds for a guest that left its node.
func ipamState(t *testing.T, stateDir string) (allocations map[string]string, held []string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(stateDir, "ipam.json"))
	if err != nil {
		t.Fatal(err)
	}
	var state struct {
		Allocations map[string]string `json:"allocations"`
		Held        []string          `json:"held"`
	}
	if err := json.Unmarshal(data, &state); err != nil {
		t.Fatal(err)
	}
	return state.Allocations, state.Held
}

// An agent does not start a VM with an address another Machine holds,
// whatever its own allocations say: here its file gives the new Machine
// the address of a guest running on another node. The Machine is Pending
// with an AddressInUse event, then gets an address of its own.
func TestAgentRefusesAnAddressAnotherMachineHolds(t *testing.T) {
	host.SkipIfShort(t, "root, to make network namespaces, and the control plane")
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	netns := testNetns(t, "kairon-addr-")
	runControllers(t, env)
	runSimAgent(t, env, "refuse-1", t.TempDir(), nil, sharedBridge(netns, "10.88.1.0/24"))
	first := waitPhase(t, env, client.ObjectKeyFromObject(createMachine(t, env, ns, "first", "refuse-1")), kaironv1.MachineRunning)
	held := addressOf(t, first)

	// refuse-2's allocations, as a stale file or a lost race could leave
	// them: the next Machine's id already has first's address.
	state := t.TempDir()
	file, err := json.Marshal(map[string]any{"prefix": "10.88.0.0/16", "allocations": map[string]string{ns + "_second": held}})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "ipam.json"), file, 0o644); err != nil {
		t.Fatal(err)
	}
	runSimAgent(t, env, "refuse-2", state, nil, sharedBridge(netns, "10.88.2.0/24"))
	second := createMachine(t, env, ns, "second", "refuse-2")
	testenv.Eventually(t, waitTimeout, "an AddressInUse event on the second Machine", func() (bool, string) {
		var l eventsv1.EventList
		if err := env.Client.List(ctx, &l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		for _, e := range l.Items {
			if e.Regarding.Name == "second" && e.Reason == kaironv1.EventReasonAddressInUse {
				want := "guest address " + held + " is held by Machine " + ns + "/first"
				return strings.Contains(e.Note, want), "note " + e.Note
			}
		}
		m := &kaironv1.Machine{}
		_ = env.Client.Get(ctx, client.ObjectKeyFromObject(second), m)
		return false, "none yet; the Machine is " + string(m.Status.Phase) + ": " + m.Status.Message
	})
	running := waitPhase(t, env, client.ObjectKeyFromObject(second), kaironv1.MachineRunning)
	if got := addressOf(t, running); got == held || !netip.MustParsePrefix("10.88.2.0/24").Contains(netip.MustParseAddr(got)) {
		t.Errorf("the second Machine runs with %s, want an address of refuse-2's pool other than %s", got, held)
	}
	if !pinnedTo(t, netns, "refuse-1", ns+"_first", held) {
		t.Errorf("the first guest's tap is no longer pinned to %s", held)
	}
}
