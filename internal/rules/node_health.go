package rules

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Node health: each node agent renews a Lease, as a kubelet does, and
// kairon-controller judges the node by it (docs/guides/node-failure.md).

// NodeLeaseNamespace holds the agents' Leases, beside the kubelets'.
const NodeLeaseNamespace = "kube-node-lease"

// NodeLeaseName is the Lease of node's agent: kairon-<node>, so it never
// takes the name of the kubelet's own Lease (<node>).
func NodeLeaseName(node string) string { return "kairon-" + node }

// DefaultNodeGracePeriod is how long an agent may go without renewing its
// Lease before its node is unreachable (kube-controller-manager's
// --node-monitor-grace-period is 40 s too).
const DefaultNodeGracePeriod = 40 * time.Second

// DefaultLeaseRenewInterval is how often an agent renews its Lease: a
// quarter of the default grace, so three renewals may fail in a row.
const DefaultLeaseRenewInterval = 10 * time.Second

// LeaseExpired: the Lease was last seen to change at observedAt, and grace
// has passed since. The time is the observer's own, never the agent's
// renewTime, so clocks that disagree cannot make a node look dead or alive.
func LeaseExpired(observedAt, now time.Time, grace time.Duration) bool {
	return now.Sub(observedAt) > grace
}

// NodeAgentReachable: the node's agent renews its Lease, as far as
// kairon-controller has said (the Node's KaironAgentReady condition). A
// node without the condition, whose agent never held a Lease, counts as
// reachable: there is nothing to judge it by.
func NodeAgentReachable(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if string(c.Type) == kaironv1.NodeConditionAgentReady.String() {
			return c.Status == corev1.ConditionTrue
		}
	}
	return true
}

// MachineNodeReachable: m is not on a node whose agent is unreachable (its
// NodeReachable condition is not False). Such a Machine may still run, so
// it is never deleted or recreated for it, but it counts as neither warm
// nor ready, and no claim gets it.
func MachineNodeReachable(m *kaironv1.Machine) bool {
	return !meta.IsStatusConditionFalse(m.Status.Conditions, kaironv1.ConditionNodeReachable.String())
}

// NodeUsable: new Machines may go to node: not fenced, Ready, its agent
// reachable, not being deleted, not cordoned. The scheduler's
// NodeRejections says which of these fails.
func NodeUsable(node *corev1.Node) bool {
	return !NodeFenced(node) && NodeReady(node) && NodeAgentReachable(node) && node.DeletionTimestamp == nil && !node.Spec.Unschedulable
}
