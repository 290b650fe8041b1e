package node_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
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
func runSnapshotAgent(t *testing.T, env *testenv.Env, nodeName, dir, store string, cidr string, options ...func(*node.Options)) (stateDir string) {
	t.Helper()
	stateDir = t.TempDir()
	b, err := sim.New(sim.Options{StateDir: filepath.Join(stateDir, "instances"), BootDelay: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	opts := node.Options{
		NodeName: nodeName, Register: true, Backend: b, StateDir: stateDir,
		CPU: 4, Memory: resource.MustParse("4Gi"),
		Network:  &node.NetworkOptions{CIDR: netip.MustParsePrefix(cidr), NoLinks: true},
		Interval: time.Second, SnapshotDir: dir, SnapshotStore: store,
		// Snapshots of another store are fetched over the migration
		// listener; plain TCP on loopback, as in the migration tests.
		MigrationListenAddress: "127.0.0.1:0", MigrationInsecure: true,
	}
	for _, o := range options {
		o(&opts)
	}
	agent, err := node.New(env.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	testenv.RunInBackground(t, "agent "+nodeName, agent.Run)
	deleteNodeAtEnd(t, env, nodeName)
	publishMigrationEndpoint(t, env, nodeName)
	return stateDir
}

// publishMigrationEndpoint plays kairon-controller's endpoint controller:
// the agent's published port on loopback.
func publishMigrationEndpoint(t *testing.T, env *testenv.Env, nodeName string) {
	t.Helper()
	ctx := context.Background()
	testenv.Eventually(t, waitTimeout, "node "+nodeName+" with its migration endpoint", func() (bool, string) {
		n := &corev1.Node{}
		if err := env.Client.Get(ctx, client.ObjectKey{Name: nodeName}, n); err != nil {
			return false, err.Error()
		}
		port := n.Annotations[kaironv1.AnnotationNodeMigrationPort]
		if port == "" {
			return false, "no port published yet"
		}
		base := n.DeepCopy()
		n.Annotations[kaironv1.AnnotationNodeMigrationEndpoint] = "127.0.0.1:" + port
		if err := env.Client.Patch(ctx, n, client.MergeFrom(base)); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
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
// a node of another store fetches the file from the node that took it and
// restores it; a restore that cannot work fails the Machine (RestoreFailed)
// naming the field; deleting the snapshot deletes its file and the copy.
func TestAgentTakesAndRestoresSnapshots(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	shared := t.TempDir()
	store := "shared-" + ns[len(ns)-5:]
	nodeA, nodeB, nodeC := ns[len(ns)-5:]+"-snap-a", ns[len(ns)-5:]+"-snap-b", ns[len(ns)-5:]+"-snap-c"
	stateA := runSnapshotAgent(t, env, nodeA, shared, store, "10.88.21.0/24")
	runSnapshotAgent(t, env, nodeB, shared, store, "10.88.22.0/24")
	stateC := runSnapshotAgent(t, env, nodeC, t.TempDir(), "", "10.88.23.0/24") // its own store

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

	// A node of another store fetches the file from the node that took it.
	restoredMachine(t, env, ns, "fetched", nodeC, "snap", "256Mi")
	waitPhase(t, env, client.ObjectKey{Namespace: ns, Name: "fetched"}, kaironv1.MachineRunning)
	waitMachineEvent(t, env, ns, "fetched", kaironv1.MachineReasonRestored)
	copyOnC := filepath.Join(stateC, "fetched-snapshots", st.File)
	if _, err := os.Stat(copyOnC); err != nil {
		t.Errorf("no fetched copy on %s: %v", nodeC, err)
	}

	// What cannot work fails the Machine, saying why.
	for _, tt := range []struct{ name, node, snapshot, memory, want string }{
		{"wrong-size", nodeB, "snap", "512Mi", "spec.memory is 512Mi, MachineSnapshot snap was taken with 256Mi"},
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
	testenv.Eventually(t, waitTimeout, "the state file and the fetched copy deleted", func() (bool, string) {
		entries, _ := os.ReadDir(shared)
		_, err := os.Stat(copyOnC)
		return len(entries) == 0 && os.IsNotExist(err), strings.Join(entryNames(entries), ",")
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
