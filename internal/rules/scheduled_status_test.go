package rules

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestMarkScheduled(t *testing.T) {
	placedBefore := func(node string) []metav1.Condition {
		return []metav1.Condition{{Type: kaironv1.ConditionScheduled.String(), Status: metav1.ConditionTrue,
			Reason: kaironv1.MachineReasonScheduled, Message: "Bound to node " + node}}
	}
	tests := []struct {
		name                  string
		phase                 kaironv1.MachinePhase
		message               string
		conditions            []metav1.Condition
		wantMarkedBefore      bool
		wantPhase             kaironv1.MachinePhase
		wantMessageAfterMarks string
	}{
		{name: "just placed", phase: "", wantPhase: kaironv1.MachineScheduled},
		{name: "placed while it said why it waited", phase: kaironv1.MachinePending, message: "0/1 nodes are available",
			conditions: []metav1.Condition{{Type: kaironv1.ConditionScheduled.String(), Status: metav1.ConditionFalse, Reason: "Unschedulable"}},
			wantPhase:  kaironv1.MachineScheduled},
		{name: "already booting keeps its phase and message", phase: kaironv1.MachineBooting, message: "the guest is booting",
			wantPhase: kaironv1.MachineBooting, wantMessageAfterMarks: "the guest is booting"},
		{name: "a start retry keeps its message", phase: kaironv1.MachineScheduled, message: "starting the VM failed (attempt 1)",
			wantPhase: kaironv1.MachineScheduled, wantMessageAfterMarks: "starting the VM failed (attempt 1)"},
		{name: "placed again after its old node", phase: kaironv1.MachinePending, conditions: placedBefore("old"),
			wantPhase: kaironv1.MachineScheduled},
		{name: "already marked for this node", phase: kaironv1.MachineRunning, conditions: placedBefore("node-1"),
			wantMarkedBefore: true, wantPhase: kaironv1.MachineRunning},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Spec: kaironv1.MachineSpec{NodeName: "node-1"},
				Status: kaironv1.MachineStatus{Phase: tt.phase, Message: tt.message, Conditions: tt.conditions}}
			if got := MarkedScheduled(m); got != tt.wantMarkedBefore {
				t.Errorf("MarkedScheduled before = %v, want %v", got, tt.wantMarkedBefore)
			}
			MarkScheduled(m)
			c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionScheduled.String())
			if !MarkedScheduled(m) || c.Reason != kaironv1.MachineReasonScheduled || c.Message != "Bound to node node-1" || c.ObservedGeneration != 3 {
				t.Errorf("after MarkScheduled: condition %+v", c)
			}
			if m.Status.Phase != tt.wantPhase || m.Status.Message != tt.wantMessageAfterMarks {
				t.Errorf("after MarkScheduled: phase %q message %q, want %q %q", m.Status.Phase, m.Status.Message, tt.wantPhase, tt.wantMessageAfterMarks)
			}
		})
	}
}
