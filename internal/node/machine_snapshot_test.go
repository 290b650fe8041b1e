package node_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/node"
	"github.com/zyvor/kairon/internal/testenv"
)

// runSnapshotAgent starts a sim-backed agent whose snapshots are in dir,
// store store.
func runSnapshotAgent(t *testing.T, env *testenv.Env, nodeName, dir, store string, cidr string) (stateDir string) {
	t.Helper()
	stateDir = t.TempDir()
	b, err := sim.New(sim.Options{StateDir: filepath.Join(stateDir, "instances"), BootDelay: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	agent, err := node.New(env.Config, node.Options{
		NodeName: nodeName, Register: true, Backend: b, StateDir: stateDir,
		CPU: 4, Memory: resource.MustParse("4Gi"),
		Network:  &node.NetworkOptions{CIDR: netip.MustParsePrefix(cidr), NoLinks: true},
		Interval: time.Second, SnapshotDir: dir, SnapshotStore: store,
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "agent "+nodeName, agent.Run)
	deleteNodeAtEnd(t, env, nodeName)
	return stateDir
}

// handTo plays kairon-controller: it hands the snapshot to node.
func handTo(t *testing.T, env *testenv.Env, snap *kaironv1.MachineSnapshot, node string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur := &kaironv1.MachineSnapshot{}
		if err := env.Client.Get(context.Background(), client.ObjectKeyFromObject(snap), cur); err != nil {
			return err
		}
		base := cur.DeepCopy()
		cur.Status.Phase, cur.Status.Node = kaironv1.SnapshotPending, node
		return env.Client.Status().Patch(context.Background(), cur, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}))
	})
	if err != nil {
		t.Fatal(err)
	}
}

func restoredMachine(t *testing.T, env *testenv.Env, ns, name, node, snapshot, memory string) *kaironv1.Machine {
	t.Helper()
	m := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: kaironv1.MachineSpec{NodeName: node, CPU: 1, Memory: resource.MustParse(memory),
			RestoreFrom: &kaironv1.RestoreSource{SnapshotName: snapshot}},
	}
	if err := env.Client.Create(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	return m
}

// The node agents' part of MachineSnapshots on the sim backend: the node a
// snapshot is handed to saves the running VM into its store, resumes it and
// reports it Ready; a node of the same store restores it as a new Machine;
// a restore that cannot work fails the Machine (RestoreFailed) naming the
// field or the store; deleting the snapshot deletes its file.
func TestAgentTakesAndRestoresSnapshots(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	shared := t.TempDir()
	store := "shared-" + ns[len(ns)-5:]
	nodeA, nodeB, nodeC := ns[len(ns)-5:]+"-snap-a", ns[len(ns)-5:]+"-snap-b", ns[len(ns)-5:]+"-snap-c"
	stateA := runSnapshotAgent(t, env, nodeA, shared, store, "10.88.21.0/24")
	runSnapshotAgent(t, env, nodeB, shared, store, "10.88.22.0/24")
	runSnapshotAgent(t, env, nodeC, t.TempDir(), "", "10.88.23.0/24") // its own store

	src := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "src"},
		Spec: kaironv1.MachineSpec{NodeName: nodeA, CPU: 1, Memory: resource.MustParse("256Mi")}}
	if err := env.Client.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	waitPhase(t, env, client.ObjectKeyFromObject(src), kaironv1.MachineRunning)

	snap := &kaironv1.MachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "snap"}, Spec: kaironv1.MachineSnapshotSpec{MachineName: "src"}}
	if err := env.Client.Create(ctx, snap); err != nil {
		t.Fatal(err)
	}
	handTo(t, env, snap, nodeA)
	testenv.Eventually(t, waitTimeout, "snapshot Ready", func() (bool, string) {
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(snap), snap); err != nil {
			return false, err.Error()
		}
		return snap.Status.Phase == kaironv1.SnapshotReady, string(snap.Status.Phase) + ": " + snap.Status.Message
	})
	st := snap.Status
	if st.Node != nodeA || st.Store != store || st.SizeBytes <= 0 || st.TakenAt == nil || st.CPU != 1 || st.Memory == nil || st.Memory.String() != "256Mi" || st.Image != "default" {
		t.Errorf("snapshot status %+v", st)
	}
	if _, err := os.Stat(filepath.Join(shared, st.File)); err != nil {
		t.Errorf("the state file is not in the shared dir: %v", err)
	}
	if !strings.Contains(st.Message, "saved on node "+nodeA+" to store "+store) {
		t.Errorf("message %q", st.Message)
	}
	// The source runs on: resumed after the save.
	if got := waitPhase(t, env, client.ObjectKeyFromObject(src), kaironv1.MachineRunning); got.Status.Phase != kaironv1.MachineRunning {
		t.Fatal(got.Status.Phase)
	}
	if inst, err := simInstance(t, stateA, ns, "src"); err != nil || inst.Phase != backend.Running {
		t.Errorf("the source VM after its snapshot: %+v, %v; want it Running (resumed)", inst, err)
	}
	waitMachineEvent(t, env, ns, "src", kaironv1.SnapshotReasonTaken)

	// Another node of the store restores it.
	restoredMachine(t, env, ns, "back", nodeB, "snap", "256Mi")
	waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "back"}, kaironv1.MachineRunning)
	ev := waitMachineEvent(t, env, ns, "back", kaironv1.MachineReasonRestored)
	if !strings.Contains(ev.Note, "from MachineSnapshot snap") {
		t.Errorf("restored event %q", ev.Note)
	}

	// What cannot work fails the Machine, saying why.
	for _, tt := range []struct{ name, node, snapshot, memory, want string }{
		{"wrong-size", nodeB, "snap", "512Mi", "spec.memory is 512Mi, MachineSnapshot snap was taken with 256Mi"},
		{"other-store", nodeC, "snap", "256Mi", "MachineSnapshot snap is in store " + store + ", which node " + nodeC + " does not reach"},
		{"no-snapshot", nodeB, "missing", "256Mi", "spec.restoreFrom.snapshotName: MachineSnapshot missing not found"},
	} {
		restoredMachine(t, env, ns, tt.name, tt.node, tt.snapshot, tt.memory)
		m := waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: tt.name}, kaironv1.MachineFailed)
		if !strings.Contains(m.Status.Message, tt.want) {
			t.Errorf("%s: message %q, want it to contain %q", tt.name, m.Status.Message, tt.want)
		}
		if c := findCondition(m, kaironv1.ConditionReady); c == nil || c.Reason != kaironv1.MachineReasonRestoreFailed {
			t.Errorf("%s: Ready condition %+v, want reason %s", tt.name, c, kaironv1.MachineReasonRestoreFailed)
		}
	}

	// A deleted snapshot takes its file with it.
	if err := env.Client.Delete(ctx, snap); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, waitTimeout, "the state file deleted", func() (bool, string) {
		entries, _ := os.ReadDir(shared)
		return len(entries) == 0, strings.Join(entryNames(entries), ",")
	})
}

func entryNames(entries []os.DirEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func findCondition(m *kaironv1.Machine, t kaironv1.ConditionType) *metav1.Condition {
	for i := range m.Status.Conditions {
		if m.Status.Conditions[i].Type == t.String() {
			return &m.Status.Conditions[i]
		}
	}
	return nil
}
