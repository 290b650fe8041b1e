package rules

import (
	"k8s.io/apimachinery/pkg/api/meta"

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
