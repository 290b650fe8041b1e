package rules

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func fenceMachine(name string, labels map[string]string, owners ...metav1.OwnerReference) *kaironv1.Machine {
	return &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels, OwnerReferences: owners},
		Spec:       kaironv1.MachineSpec{NodeName: "node-1"},
	}
}

// Each kind of Machine on a fenced node gets its action: set and pool
// members replaced, a snapshot restored (claimed or not), a claimed one
// without a snapshot loses its claim, a lone one stays, one being deleted
// is finished. A snapshot in the fenced node's own store does not count.
func TestPlanFence(t *testing.T) {
	now := metav1.Now()
	setRef := metav1.OwnerReference{APIVersion: "kairon.zyvor.dev/v1alpha1", Kind: "MachineSet", Name: "web", Controller: ptr.To(true)}
	claimed := map[string]string{kaironv1.LabelMachinePool: "agents", kaironv1.LabelPoolState: kaironv1.PoolStateClaimed, kaironv1.LabelMachineClaim: "job"}
	deleting := fenceMachine("going", nil)
	deleting.DeletionTimestamp = &now
	machines := []*kaironv1.Machine{
		fenceMachine("web-1", map[string]string{kaironv1.LabelMachineSet: "web"}, setRef),
		fenceMachine("warm-1", map[string]string{kaironv1.LabelMachinePool: "agents", kaironv1.LabelPoolState: kaironv1.PoolStateWarm}),
		fenceMachine("held-snap", claimed),
		fenceMachine("held-bare", map[string]string{kaironv1.LabelPoolState: kaironv1.PoolStateClaimed, kaironv1.LabelMachineClaim: "other"}),
		fenceMachine("lone-snap", nil),
		fenceMachine("lone-bare", nil),
		fenceMachine("lone-local", nil),
		deleting,
	}
	old, newer := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC), time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	snaps := map[string]FenceSnapshot{
		"ns/held-snap":  {Name: "h-new", TakenAt: newer, Store: "shared"},
		"ns/lone-snap":  {Name: "l-new", TakenAt: old, Store: "shared"},
		"ns/lone-local": {Name: "local", TakenAt: newer, Store: kaironv1.NodeLocalSnapshotStore("node-1")},
	}
	plan := PlanFence("node-1", machines, snaps)
	want := map[string]struct {
		action   FenceAction
		snapshot string
		claim    string
	}{
		"web-1":      {FenceReplace, "", ""},
		"warm-1":     {FenceReplace, "", ""},
		"held-snap":  {FenceRestore, "h-new", "job"},
		"held-bare":  {FenceClaimLost, "", "other"},
		"lone-snap":  {FenceRestore, "l-new", ""},
		"lone-bare":  {FenceLeave, "", ""},
		"lone-local": {FenceLeave, "", ""},
		"going":      {FenceFinishDeletion, "", ""},
	}
	if len(plan) != len(want) {
		t.Fatalf("plan has %d decisions, want %d", len(plan), len(want))
	}
	for i, d := range plan {
		if i > 0 && plan[i-1].Machine.Name > d.Machine.Name {
			t.Errorf("plan not sorted: %s before %s", plan[i-1].Machine.Name, d.Machine.Name)
		}
		w := want[d.Machine.Name]
		snap := ""
		if d.Snapshot != nil {
			snap = d.Snapshot.Name
		}
		if d.Action != w.action || snap != w.snapshot || d.Claim != w.claim {
			t.Errorf("%s: %s snapshot %q claim %q, want %s snapshot %q claim %q (%s)", d.Machine.Name, d.Action, snap, d.Claim, w.action, w.snapshot, w.claim, d.Receipt("node-1"))
		}
	}
	receipts := map[string]string{}
	for _, d := range plan {
		receipts[d.Machine.Name] = d.Receipt("node-1")
	}
	for name, part := range map[string]string{
		"web-1":      "machine ns/web-1 (MachineSet web): deleted and replaced on another node",
		"held-snap":  "restored on another node from snapshot h-new taken 2026-12-03T10:00:00Z",
		"held-bare":  "claim other goes Lost (NodeFenced)",
		"lone-bare":  "left on node node-1: nothing owns it and it has no Ready MachineSnapshot; it starts there again after kaironctl recover node-1",
		"lone-local": "its newest snapshot local is in node node-1's own store",
	} {
		if !strings.Contains(receipts[name], part) {
			t.Errorf("receipt of %s = %q, want it to contain %q", name, receipts[name], part)
		}
	}
	if got, want := FenceSummary(plan), "8 Machines: 2 restored, 2 replaced, 1 claim lost, 1 deletions finished, 2 left"; got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}

// A fenced node is never used, whatever else it is, and says so first.
func TestFencedNodeRejected(t *testing.T) {
	node := &corev1.Node{Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}
	if !NodeUsable(node) || NodeFenced(node) {
		t.Fatal("a Ready node without the taint should be usable and not fenced")
	}
	node.Spec.Taints = []corev1.Taint{FenceTaint()}
	if NodeUsable(node) || !NodeFenced(node) {
		t.Error("a fenced node should be fenced and not usable")
	}
	if r := NodeRejections(&NodeInfo{Node: node}, &kaironv1.Machine{}); len(r) != 1 || r[0] != rejectFenced {
		t.Errorf("rejections %v, want only fenced", r)
	}
	_, message := PickNode([]*NodeInfo{{Node: node}}, &kaironv1.Machine{})
	if !strings.Contains(message, "1 node is fenced") {
		t.Errorf("PickNode message %q, want it to say the node is fenced", message)
	}
	if !NodeAlive(node) {
		t.Error("a Ready node without KaironAgentReady counts as alive")
	}
	node.Status.Conditions = append(node.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeConditionType(kaironv1.NodeConditionAgentReady), Status: corev1.ConditionUnknown})
	if NodeAlive(node) {
		t.Error("a node whose agent's Lease expired is not alive, even if its kubelet says Ready")
	}
}
