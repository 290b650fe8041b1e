package controller

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// Placing a Machine restored from a MachineSnapshot (spec.restoreFrom):
// only once the snapshot is Ready, and on a node whose agent reaches the
// snapshot's store (its label kairon.zyvor.dev/snapshot-store) if one has
// room; otherwise on any node that can fetch the file from the node that
// took it, while that one is up. The node agent starts it from the file
// (internal/node/machine_snapshot.go).

// loadSnapshots gives the pass the MachineSnapshots its restored Machines
// name; a pass with none lists nothing.
func (r *SchedulerReconciler) loadSnapshots(ctx context.Context, pass *schedulingPass) error {
	pass.snapshots = map[types.NamespacedName]*kaironv1.MachineSnapshot{}
	restoring := false
	for _, m := range pass.unscheduled {
		restoring = restoring || m.Spec.RestoreFrom != nil
	}
	if !restoring {
		return nil
	}
	var list kaironv1.MachineSnapshotList
	if err := r.Client.List(ctx, &list); err != nil {
		return fmt.Errorf("listing machine snapshots: %w", err)
	}
	for i := range list.Items {
		s := &list.Items[i]
		pass.snapshots[types.NamespacedName{Namespace: s.Namespace, Name: s.Name}] = s
	}
	return nil
}

// pick chooses m's node, or says why there is none and with which reason
// of the Scheduled condition.
func (p *schedulingPass) pick(m *kaironv1.Machine) (node *rules.NodeInfo, reason, message string) {
	if m.Spec.RestoreFrom == nil {
		node, message = rules.PickNode(p.nodes, m)
		return node, kaironv1.MachineReasonUnschedulable, message
	}
	name := m.Spec.RestoreFrom.SnapshotName
	snap := p.snapshots[types.NamespacedName{Namespace: m.Namespace, Name: name}]
	switch {
	case snap == nil:
		return nil, kaironv1.MachineReasonSnapshotNotReady, fmt.Sprintf("spec.restoreFrom: MachineSnapshot %s not found", name)
	case snap.Status.Phase != kaironv1.SnapshotReady:
		phase := snap.Status.Phase
		if phase == "" {
			phase = kaironv1.SnapshotPending
		}
		return nil, kaironv1.MachineReasonSnapshotNotReady, fmt.Sprintf("spec.restoreFrom: MachineSnapshot %s is %s, not Ready", name, phase)
	}
	var reaching []*rules.NodeInfo
	for _, n := range p.nodes {
		if n.Node.Labels[kaironv1.LabelNodeSnapshotStore] == snap.Status.Store {
			reaching = append(reaching, n)
		}
	}
	if len(reaching) > 0 {
		if node, message = rules.PickNode(reaching, m); node != nil {
			return node, "", ""
		}
		message = fmt.Sprintf("%s (the %d reaching store %s of MachineSnapshot %s)", message, len(reaching), snap.Status.Store, name)
	} else {
		message = fmt.Sprintf("0/%d nodes reach store %s of MachineSnapshot %s (Node label %s)",
			len(p.nodes), snap.Status.Store, name, kaironv1.LabelNodeSnapshotStore)
	}
	// None of the store's nodes can take it: another node fetches the file
	// from the node that took it, while that one's agent is up and both
	// have a migration endpoint (internal/node/machine_snapshot_fetch.go).
	owner := p.nodesByName[snap.Status.Node]
	if owner == nil || !rules.NodeReady(owner.Node) || !rules.NodeAgentReachable(owner.Node) || !hasMigrationEndpoint(owner) {
		return nil, kaironv1.MachineReasonUnschedulable, message + "; its node " + snap.Status.Node + " cannot send it (down, or no migration endpoint)"
	}
	var fetching []*rules.NodeInfo
	for _, n := range p.nodes {
		if hasMigrationEndpoint(n) {
			fetching = append(fetching, n)
		}
	}
	if node, fetchMessage := rules.PickNode(fetching, m); node != nil {
		return node, "", ""
	} else if len(fetching) > 0 {
		message += "; nodes that could fetch it from node " + snap.Status.Node + ": " + fetchMessage
	}
	return nil, kaironv1.MachineReasonUnschedulable, message
}

// hasMigrationEndpoint: other agents reach n's agent (kairon-controller
// wrote its endpoint from the port the agent published).
func hasMigrationEndpoint(n *rules.NodeInfo) bool {
	return n.Node.Annotations[kaironv1.AnnotationNodeMigrationEndpoint] != ""
}

// snapshotPhaseChanged passes the MachineSnapshot events that can let a
// restored Machine be placed: a new one, and a phase or store change.
func snapshotPhaseChanged() predicate.Funcs {
	return updatesThat(func(old, cur *kaironv1.MachineSnapshot) bool {
		return old.Status.Phase != cur.Status.Phase || old.Status.Store != cur.Status.Store
	})
}
