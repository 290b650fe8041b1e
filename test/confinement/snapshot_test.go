package confinement_test

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// TestAgentConfinedToTheSnapshotsHandedToIt: node agent A writes the status
// of a MachineSnapshot kairon-controller handed to node A, and nothing
// else: not one handed to node B or to no node, not the node it is handed
// to, not its labels, no create or delete. It may label its own Node with
// its snapshot store.
func TestAgentConfinedToTheSnapshotsHandedToIt(t *testing.T) {
	cp := controlPlane(t)
	ctx := context.Background()
	adm := admin(t, cp)
	a, b := "snap-a", "snap-b"
	nodeA := makeNode(t, adm, a)
	makeNode(t, adm, b)
	agentA := agent(t, cp, a)
	ns := makeNamespace(t, adm)

	handed := func(name, node string) *kaironv1.MachineSnapshot {
		t.Helper()
		s := &kaironv1.MachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineSnapshotSpec{MachineName: "m"}}
		if err := adm.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		base := s.DeepCopy()
		s.Status.Phase, s.Status.Node = kaironv1.SnapshotPending, node
		if err := adm.Status().Patch(ctx, s, client.MergeFrom(base)); err != nil {
			t.Fatal(err)
		}
		return s
	}
	toA, toB, toNone := handed("to-a", a), handed("to-b", b), handed("to-none", "")
	ready := map[string]any{"status": map[string]any{"phase": kaironv1.SnapshotReady, "store": "node." + a, "sizeBytes": 1 << 20}}

	refused(t, "report a snapshot handed to node B", mergePatch(ctx, agentA, toB, ready, true), "which kairon-controller handed to node "+b)
	refused(t, "report a snapshot handed to no node", mergePatch(ctx, agentA, toNone, ready, true), "handed to no node")
	refused(t, "hand its snapshot to node B", mergePatch(ctx, agentA, toA, map[string]any{"status": map[string]any{"node": b}}, true), "may not hand MachineSnapshot to-a to another node")
	refused(t, "label its snapshot", mergePatch(ctx, agentA, toA, map[string]any{"metadata": map[string]any{"labels": map[string]any{"x": "y"}}}, false), "cannot patch resource") // RBAC: status only
	refused(t, "create a snapshot", agentA.Create(ctx, &kaironv1.MachineSnapshot{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "new"}, Spec: kaironv1.MachineSnapshotSpec{MachineName: "m"}}), "cannot create resource")
	refused(t, "delete a snapshot", agentA.Delete(ctx, toA), "cannot delete resource")

	allowed(t, "report its snapshot Ready", mergePatch(ctx, agentA, toA, ready, true))
	allowed(t, "label its own Node with its snapshot store", mergePatch(ctx, agentA, nodeA, map[string]any{"metadata": map[string]any{
		"labels": map[string]any{kaironv1.LabelNodeSnapshotStore: "shared-nfs"}}}, false))
}
