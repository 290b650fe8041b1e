package rules

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestLeaseExpired(t *testing.T) {
	seen := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		after time.Duration
		want  bool
	}{
		{"just renewed", 0, false},
		{"within the grace", 39 * time.Second, false},
		{"at the grace", 40 * time.Second, false},
		{"past the grace", 41 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := LeaseExpired(seen, seen.Add(tc.after), DefaultNodeGracePeriod); got != tc.want {
				t.Errorf("LeaseExpired after %s = %v, want %v", tc.after, got, tc.want)
			}
		})
	}
}

func TestNodeHealthRules(t *testing.T) {
	ready := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}
	agent := func(s corev1.ConditionStatus) corev1.NodeCondition {
		return corev1.NodeCondition{Type: corev1.NodeConditionType(kaironv1.NodeConditionAgentReady), Status: s}
	}
	now := metav1.Now()
	for _, tc := range []struct {
		name                string
		conds               []corev1.NodeCondition
		unschedulable       bool
		deleting            bool
		reachable, usable   bool
		rejectionIsNotReady bool
	}{
		{"ready, agent never judged", []corev1.NodeCondition{ready}, false, false, true, true, false},
		{"ready, agent reachable", []corev1.NodeCondition{ready, agent(corev1.ConditionTrue)}, false, false, true, true, false},
		{"ready (kubelet), agent unknown", []corev1.NodeCondition{ready, agent(corev1.ConditionUnknown)}, false, false, false, false, false},
		{"ready, agent false", []corev1.NodeCondition{ready, agent(corev1.ConditionFalse)}, false, false, false, false, false},
		{"not ready, agent unknown", []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionUnknown}, agent(corev1.ConditionUnknown)}, false, false, false, false, true},
		{"cordoned", []corev1.NodeCondition{ready}, true, false, true, false, false},
		{"deleting", []corev1.NodeCondition{ready}, false, true, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			node := &corev1.Node{Status: corev1.NodeStatus{Conditions: tc.conds}, Spec: corev1.NodeSpec{Unschedulable: tc.unschedulable}}
			if tc.deleting {
				node.DeletionTimestamp = &now
			}
			if got := NodeAgentReachable(node); got != tc.reachable {
				t.Errorf("NodeAgentReachable = %v, want %v", got, tc.reachable)
			}
			if got := NodeUsable(node); got != tc.usable {
				t.Errorf("NodeUsable = %v, want %v", got, tc.usable)
			}
			if !tc.reachable {
				rejections := NodeRejections(&NodeInfo{Node: node}, &kaironv1.Machine{})
				want := rejectUnreachable
				if tc.rejectionIsNotReady {
					want = rejectNotReady
				}
				if len(rejections) != 1 || rejections[0] != want {
					t.Errorf("NodeRejections = %v, want [%v]", rejections, want)
				}
			}
		})
	}
}

func TestUnreachableNodeMessage(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue},
		{Type: corev1.NodeConditionType(kaironv1.NodeConditionAgentReady), Status: corev1.ConditionUnknown},
	}}}
	_, msg := PickNode([]*NodeInfo{{Node: node}}, &kaironv1.Machine{})
	if want := "0/1 nodes are available: 1 node's agent is unreachable"; msg != want {
		t.Errorf("message = %q, want %q", msg, want)
	}
}

func TestMachineNodeReachable(t *testing.T) {
	for _, tc := range []struct {
		name  string
		conds []metav1.Condition
		want  bool
	}{
		{"no condition", nil, true},
		{"reachable", []metav1.Condition{{Type: kaironv1.ConditionNodeReachable.String(), Status: metav1.ConditionTrue}}, true},
		{"unreachable", []metav1.Condition{{Type: kaironv1.ConditionNodeReachable.String(), Status: metav1.ConditionFalse}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &kaironv1.Machine{Status: kaironv1.MachineStatus{Conditions: tc.conds}}
			if got := MachineNodeReachable(m); got != tc.want {
				t.Errorf("MachineNodeReachable = %v, want %v", got, tc.want)
			}
		})
	}
}
