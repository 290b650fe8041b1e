package rules

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestWarmMemberReady(t *testing.T) {
	agent := func(s metav1.ConditionStatus) []metav1.Condition {
		return []metav1.Condition{{Type: kaironv1.ConditionGuestAgentReady.String(), Status: s}}
	}
	reach := func(s metav1.ConditionStatus) []metav1.Condition {
		return []metav1.Condition{{Type: kaironv1.ConditionNodeReachable.String(), Status: s}}
	}
	for _, tc := range []struct {
		name      string
		readiness kaironv1.MachinePoolReadiness
		phase     kaironv1.MachinePhase
		conds     []metav1.Condition
		want      bool
	}{
		{"default: Running is enough", "", kaironv1.MachineRunning, nil, true},
		{"Running: Running is enough", kaironv1.PoolReadinessRunning, kaironv1.MachineRunning, agent(metav1.ConditionFalse), true},
		{"Running: Booting is not", kaironv1.PoolReadinessRunning, kaironv1.MachineBooting, nil, false},
		{"GuestAgent: Running without the condition", kaironv1.PoolReadinessGuestAgent, kaironv1.MachineRunning, nil, false},
		{"GuestAgent: Running, agent silent", kaironv1.PoolReadinessGuestAgent, kaironv1.MachineRunning, agent(metav1.ConditionFalse), false},
		{"GuestAgent: Running, agent answered", kaironv1.PoolReadinessGuestAgent, kaironv1.MachineRunning, agent(metav1.ConditionTrue), true},
		{"GuestAgent: agent answered but Booting", kaironv1.PoolReadinessGuestAgent, kaironv1.MachineBooting, agent(metav1.ConditionTrue), false},
		{"default: Running on an unreachable node", "", kaironv1.MachineRunning, reach(metav1.ConditionFalse), false},
		{"default: Running, node reachable again", "", kaironv1.MachineRunning, reach(metav1.ConditionTrue), true},
		{"GuestAgent: agent answered, node unreachable", kaironv1.PoolReadinessGuestAgent, kaironv1.MachineRunning,
			append(agent(metav1.ConditionTrue), reach(metav1.ConditionFalse)...), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool := &kaironv1.MachinePool{Spec: kaironv1.MachinePoolSpec{Readiness: tc.readiness}}
			m := &kaironv1.Machine{Status: kaironv1.MachineStatus{Phase: tc.phase, Conditions: tc.conds}}
			if got := WarmMemberReady(pool, m); got != tc.want {
				t.Errorf("WarmMemberReady = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWarmMemberUnplaced(t *testing.T) {
	scheduled := func(s metav1.ConditionStatus, msg string) []metav1.Condition {
		return []metav1.Condition{{Type: kaironv1.ConditionScheduled.String(), Status: s, Reason: kaironv1.MachineReasonUnschedulable, Message: msg}}
	}
	const noRoom = "0/1 nodes are available: 1 node has insufficient cpu (free 0, need 1)"
	for _, tc := range []struct {
		name     string
		node     string
		phase    kaironv1.MachinePhase
		conds    []metav1.Condition
		wantWhy  string
		unplaced bool
	}{
		{"new, not yet looked at by the scheduler", "", "", nil, "", false},
		{"no room", "", kaironv1.MachinePending, scheduled(metav1.ConditionFalse, noRoom), noRoom, true},
		{"no room, phase not yet written", "", "", scheduled(metav1.ConditionFalse, noRoom), noRoom, true},
		{"placed", "node-1", kaironv1.MachineScheduled, scheduled(metav1.ConditionTrue, "Bound to node node-1"), "", false},
		{"placed, the condition not yet updated", "node-1", kaironv1.MachinePending, scheduled(metav1.ConditionFalse, noRoom), "", false},
		{"booting", "node-1", kaironv1.MachineBooting, nil, "", false},
		{"failed without a node", "", kaironv1.MachineFailed, scheduled(metav1.ConditionFalse, noRoom), "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &kaironv1.Machine{Spec: kaironv1.MachineSpec{NodeName: tc.node}, Status: kaironv1.MachineStatus{Phase: tc.phase, Conditions: tc.conds}}
			why, unplaced := WarmMemberUnplaced(m)
			if why != tc.wantWhy || unplaced != tc.unplaced {
				t.Errorf("WarmMemberUnplaced = %q, %v; want %q, %v", why, unplaced, tc.wantWhy, tc.unplaced)
			}
		})
	}
}

// The explanation kept does not depend on the order members are counted
// in, so a message built from it stays put while the cache reorders.
func TestUnplacedMembersKeepsOneExplanationWhateverTheOrder(t *testing.T) {
	unplaced := func(why string) *kaironv1.Machine {
		return &kaironv1.Machine{Status: kaironv1.MachineStatus{Phase: kaironv1.MachinePending, Conditions: []metav1.Condition{
			{Type: kaironv1.ConditionScheduled.String(), Status: metav1.ConditionFalse, Reason: kaironv1.MachineReasonUnschedulable, Message: why}}}}
	}
	placed := &kaironv1.Machine{Spec: kaironv1.MachineSpec{NodeName: "node-1"}, Status: kaironv1.MachineStatus{Phase: kaironv1.MachineBooting}}
	members := []*kaironv1.Machine{unplaced("no room (free 1)"), placed, unplaced("no room (free 0)"), unplaced("no room (free 2)")}
	for _, order := range [][]int{{0, 1, 2, 3}, {3, 2, 1, 0}, {1, 3, 0, 2}} {
		var u UnplacedMembers
		for _, i := range order {
			if got, want := u.Add(members[i]), members[i] != placed; got != want {
				t.Errorf("order %v: Add(member %d) = %v, want %v", order, i, got, want)
			}
		}
		if u.Count != 3 || u.Why != "no room (free 0)" {
			t.Errorf("order %v: %+v, want 3 counted and the explanation %q", order, u, "no room (free 0)")
		}
	}
}
