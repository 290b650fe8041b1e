package rules

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// MarkScheduled records in m's status that m is placed on its
// spec.nodeName: the Scheduled condition, and the phase Scheduled while
// nothing has moved it past Pending.
//
// Two writers share this: the node agent puts it into the first status it
// writes for a Machine it picks up, and the scheduler writes it only for a
// Machine no agent picked up soon after the scheduler placed it (or one
// placed by hand). A Machine's status then has one writer as it starts,
// rather than the scheduler and the agent both writing it within
// milliseconds and one of them refused for a stale resourceVersion.
func MarkScheduled(m *kaironv1.Machine) {
	if m.Status.Phase == "" || m.Status.Phase == kaironv1.MachinePending {
		m.Status.Phase = kaironv1.MachineScheduled
		m.Status.Message = ""
	}
	meta.SetStatusCondition(&m.Status.Conditions, metav1.Condition{
		Type:               kaironv1.ConditionScheduled.String(),
		Status:             metav1.ConditionTrue,
		Reason:             kaironv1.MachineReasonScheduled,
		Message:            scheduledMessage(m.Spec.NodeName),
		ObservedGeneration: m.Generation,
	})
}

// MarkedScheduled says whether m's status already says it is placed on
// the node it is placed on now. A Machine placed again (after its node
// failed, or moved by a migration) still carries the condition of its
// last placement, which names the old node.
func MarkedScheduled(m *kaironv1.Machine) bool {
	c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionScheduled.String())
	return c != nil && c.Status == metav1.ConditionTrue && c.Message == scheduledMessage(m.Spec.NodeName)
}

func scheduledMessage(node string) string {
	return "Bound to node " + node
}
