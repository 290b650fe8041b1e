package rules

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// WarmMemberReady tells whether a warm member of pool may be bound now: it
// is Running, its node's agent is reachable (MachineNodeReachable), and
// under spec.readiness GuestAgent its guest agent answered the node's
// latest ping too. The binder and the pool's status both ask
// this, so status.readyWarm counts exactly the members a claim can get.
func WarmMemberReady(pool *kaironv1.MachinePool, m *kaironv1.Machine) bool {
	if m.Status.Phase != kaironv1.MachineRunning || !MachineNodeReachable(m) {
		return false
	}
	if pool.Spec.Readiness != kaironv1.PoolReadinessGuestAgent {
		return true
	}
	return meta.IsStatusConditionTrue(m.Status.Conditions, kaironv1.ConditionGuestAgentReady.String())
}

// WarmMemberUnplaced returns the scheduler's explanation for a warm member
// that waits for a node (not yet placed, its Scheduled condition False),
// and whether it waits. A pool whose members cannot be placed is short of
// room, not slow to boot, and its claims and status say which.
func WarmMemberUnplaced(m *kaironv1.Machine) (why string, unplaced bool) {
	if m.Spec.NodeName != "" {
		return "", false
	}
	switch m.Status.Phase {
	case "", kaironv1.MachinePending:
	default:
		return "", false
	}
	cond := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionScheduled.String())
	if cond == nil || cond.Status != metav1.ConditionFalse {
		return "", false
	}
	return cond.Message, true
}

// UnplacedMembers counts the warm members that wait for a node
// (WarmMemberUnplaced) and keeps one explanation, the same whatever order
// they are counted in, so that a message built from it does not flap.
type UnplacedMembers struct {
	Count int
	Why   string
}

// Add counts m if it waits for a node, and says whether it does.
func (u *UnplacedMembers) Add(m *kaironv1.Machine) bool {
	why, unplaced := WarmMemberUnplaced(m)
	if !unplaced {
		return false
	}
	u.Count++
	if u.Count == 1 || why < u.Why {
		u.Why = why
	}
	return true
}
