package rules

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// This file is what `kaironctl fence` and kairon-controller's fence
// controller share: how a fence is recorded on a Node, and what becomes of
// each Machine of a fenced node. kaironctl prints the plan as receipts; the
// controller carries it out (docs/guides/node-failure.md).

// FenceTaint is the taint kaironctl fence puts on a Node: NoExecute, as
// Kubernetes' node.kubernetes.io/out-of-service, so nothing that does not
// tolerate it runs or is placed there until kaironctl recover.
func FenceTaint() corev1.Taint {
	return corev1.Taint{Key: kaironv1.TaintNodeFenced, Value: "true", Effect: corev1.TaintEffectNoExecute}
}

// NodeFenced: node carries the fence taint, whatever its value or effect.
func NodeFenced(node *corev1.Node) bool {
	for _, t := range node.Spec.Taints {
		if t.Key == kaironv1.TaintNodeFenced {
			return true
		}
	}
	return false
}

// NodeAlive: as far as Kairon can tell, node still runs its agent: the
// controller says its Lease is renewed (KaironAgentReady True) or, on a
// node no Lease judges, it is Ready. Fencing such a node would run its
// Machines twice; kaironctl fence refuses it without --force.
func NodeAlive(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if string(c.Type) == kaironv1.NodeConditionAgentReady.String() {
			return c.Status == corev1.ConditionTrue
		}
	}
	return NodeReady(node)
}

// FenceAction is what becomes of one Machine of a fenced node.
type FenceAction string

const (
	// FenceReplace: a MachineSet's or MachinePool's (unclaimed) Machine is
	// deleted, its VM finalizer finished for the dead agent; its owner has
	// replaced it, or does now, on another node.
	FenceReplace FenceAction = "Replace"
	// FenceRestore: the Machine is recreated under its name, on another
	// node, from its newest Ready MachineSnapshot (memory and devices as of
	// that snapshot); a claim bound to it stays bound.
	FenceRestore FenceAction = "Restore"
	// FenceClaimLost: a claimed Machine with no snapshot to come back from
	// is deleted and its claim goes Lost (reason NodeFenced).
	FenceClaimLost FenceAction = "ClaimLost"
	// FenceLeave: a Machine nobody owns, without a snapshot, stays on the
	// node: nothing can recreate it as it was. It starts again there once
	// the node recovers, unless someone deletes it.
	FenceLeave FenceAction = "Leave"
	// FenceFinishDeletion: the Machine was being deleted; its VM finalizer,
	// which the dead agent cannot remove, is finished.
	FenceFinishDeletion FenceAction = "FinishDeletion"
)

// FenceSnapshot is a Ready MachineSnapshot as the fence plan needs it.
type FenceSnapshot struct {
	Name    string
	TakenAt time.Time
	// Store is the snapshot store holding the state file (status.store).
	Store string
}

// FenceDecision is the plan for one Machine of a fenced node.
type FenceDecision struct {
	Machine *kaironv1.Machine
	Action  FenceAction
	// Owner is who the Machine belongs to, "" for nobody: "MachineSet web",
	// "MachinePool agents", "MachineClaim ci-1".
	Owner string
	// Claim is the name of the claim holding it, if any (same namespace).
	Claim string
	// Snapshot is the snapshot FenceRestore restores from.
	Snapshot *FenceSnapshot
	// Why says, in a sentence, why this action.
	Why string
}

// PlanFence decides what becomes of each Machine of the fenced node,
// sorted by namespace and name. snapshots are the newest Ready snapshot of
// each Machine by "namespace/name" (loadFenceSnapshots). A snapshot kept
// in the fenced node's own store cannot be restored elsewhere and does not
// count.
func PlanFence(node string, machines []*kaironv1.Machine, snapshots map[string]FenceSnapshot) []FenceDecision {
	sorted := append([]*kaironv1.Machine(nil), machines...)
	sortEvacuationMachines(sorted)
	out := make([]FenceDecision, 0, len(sorted))
	for _, m := range sorted {
		d := FenceDecision{Machine: m, Owner: machineOwner(m)}
		if m.Labels[kaironv1.LabelPoolState] == kaironv1.PoolStateClaimed {
			d.Claim = m.Labels[kaironv1.LabelMachineClaim]
		}
		snap, hasSnap := snapshots[m.Namespace+"/"+m.Name]
		unreachable := hasSnap && snap.Store == kaironv1.NodeLocalSnapshotStore(node)
		noSnap := "it has no Ready MachineSnapshot"
		if unreachable {
			noSnap = fmt.Sprintf("its newest snapshot %s is in node %s's own store, which went down with it", snap.Name, node)
		}
		usable := hasSnap && !unreachable
		switch {
		case m.DeletionTimestamp != nil:
			d.Action, d.Why = FenceFinishDeletion, "it was being deleted and the node's agent cannot finish that"
		case d.Claim != "" && usable:
			d.Action, d.Snapshot = FenceRestore, &snap
			d.Why = "claim " + d.Claim + " holds it and it has a snapshot"
		case d.Claim != "":
			d.Action, d.Why = FenceClaimLost, "claim "+d.Claim+" holds it and "+noSnap
		case m.Labels[kaironv1.LabelMachineSet] != "" || m.Labels[kaironv1.LabelMachinePool] != "" ||
			m.Labels[kaironv1.LabelMachinePoolTemplate] != "" || d.Owner != "":
			d.Action, d.Why = FenceReplace, "its "+ownerKind(d.Owner)+" keeps its count on other nodes"
		case usable:
			d.Action, d.Snapshot = FenceRestore, &snap
			d.Why = "it has a snapshot"
		default:
			d.Action, d.Why = FenceLeave, "nothing owns it and "+noSnap
		}
		out = append(out, d)
	}
	return out
}

// LoadFencePlan reads, through reader (the API server, not a cache: a
// stale plan would act twice), the Machines whose spec.nodeName is node
// and their snapshots, and plans with PlanFence.
func LoadFencePlan(ctx context.Context, reader client.Reader, node string) ([]FenceDecision, error) {
	var list kaironv1.MachineList
	if err := reader.List(ctx, &list, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("spec.nodeName", node)}); err != nil {
		return nil, fmt.Errorf("listing machines on node %s: %w", node, err)
	}
	machines := make([]*kaironv1.Machine, 0, len(list.Items))
	for i := range list.Items {
		machines = append(machines, &list.Items[i])
	}
	snapshots, err := loadFenceSnapshots(ctx, reader, machines)
	if err != nil {
		return nil, err
	}
	return PlanFence(node, machines, snapshots), nil
}

// machineOwner is "Kind name" of m's controlling owner, else of the owner
// its labels name, else "".
func machineOwner(m *kaironv1.Machine) string {
	if c := m.Labels[kaironv1.LabelMachineClaim]; c != "" && m.Labels[kaironv1.LabelPoolState] == kaironv1.PoolStateClaimed {
		return "MachineClaim " + c
	}
	for _, ref := range m.OwnerReferences {
		if ref.Controller != nil && *ref.Controller {
			return ref.Kind + " " + ref.Name
		}
	}
	switch {
	case m.Labels[kaironv1.LabelMachineSet] != "":
		return "MachineSet " + m.Labels[kaironv1.LabelMachineSet]
	case m.Labels[kaironv1.LabelMachinePool] != "":
		return "MachinePool " + m.Labels[kaironv1.LabelMachinePool]
	case m.Labels[kaironv1.LabelMachinePoolTemplate] != "":
		return "MachinePool " + m.Labels[kaironv1.LabelMachinePoolTemplate]
	}
	if len(m.OwnerReferences) > 0 {
		return m.OwnerReferences[0].Kind + " " + m.OwnerReferences[0].Name
	}
	return ""
}

func ownerKind(owner string) string {
	for i := range owner {
		if owner[i] == ' ' {
			return owner[:i]
		}
	}
	return "owner"
}

// Receipt is the line kaironctl fence prints, and the fence controller's
// event says, about the decision: what happens to the Machine and why.
func (d FenceDecision) Receipt(node string) string {
	m := d.Machine
	who := fmt.Sprintf("machine %s/%s", m.Namespace, m.Name)
	if d.Owner != "" {
		who += " (" + d.Owner + ")"
	}
	switch d.Action {
	case FenceRestore:
		return fmt.Sprintf("%s: restored on another node from snapshot %s taken %s: %s",
			who, d.Snapshot.Name, d.Snapshot.TakenAt.UTC().Format(time.RFC3339), d.Why)
	case FenceReplace:
		return fmt.Sprintf("%s: deleted and replaced on another node: %s", who, d.Why)
	case FenceClaimLost:
		return fmt.Sprintf("%s: deleted, claim %s goes Lost (%s): %s", who, d.Claim, kaironv1.ClaimReasonNodeFenced, d.Why)
	case FenceFinishDeletion:
		return fmt.Sprintf("%s: deletion finished: %s", who, d.Why)
	default:
		return fmt.Sprintf("%s: left on node %s: %s; it starts there again after kaironctl recover %s, or delete it", who, node, d.Why, node)
	}
}

// FenceSummary counts the plan's actions: "4 Machines: 1 restored, 2
// replaced, 1 claim lost, 0 left".
func FenceSummary(plan []FenceDecision) string {
	counts := map[FenceAction]int{}
	for _, d := range plan {
		counts[d.Action]++
	}
	parts := []string{fmt.Sprintf("%d %s:", len(plan), plural(len(plan), "Machine", "Machines")),
		fmt.Sprintf("%d restored,", counts[FenceRestore]),
		fmt.Sprintf("%d replaced,", counts[FenceReplace]),
		fmt.Sprintf("%d %s lost,", counts[FenceClaimLost], plural(counts[FenceClaimLost], "claim", "claims")),
	}
	if n := counts[FenceFinishDeletion]; n > 0 {
		parts = append(parts, fmt.Sprintf("%d deletions finished,", n))
	}
	parts = append(parts, fmt.Sprintf("%d left", counts[FenceLeave]))
	return strings.Join(parts, " ")
}

// FencedNodes counts the fenced nodes among nodes (kairon_fenced_nodes).
func FencedNodes(nodes []corev1.Node) int {
	n := 0
	for i := range nodes {
		if NodeFenced(&nodes[i]) {
			n++
		}
	}
	return n
}
