package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/event"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestUpdatesThat(t *testing.T) {
	phaseChanged := updatesThat(func(old, cur *kaironv1.Machine) bool { return old.Status.Phase != cur.Status.Phase })
	machine := func(phase kaironv1.MachinePhase) *kaironv1.Machine {
		return &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Status: kaironv1.MachineStatus{Phase: phase}}
	}
	for _, tc := range []struct {
		name string
		ev   event.UpdateEvent
		want bool
	}{
		{"the change matters", event.UpdateEvent{ObjectOld: machine(kaironv1.MachineBooting), ObjectNew: machine(kaironv1.MachineRunning)}, true},
		{"the change does not", event.UpdateEvent{ObjectOld: machine(kaironv1.MachineRunning), ObjectNew: machine(kaironv1.MachineRunning)}, false},
		{"another kind", event.UpdateEvent{ObjectOld: &corev1.Node{}, ObjectNew: &corev1.Node{}}, true},
		{"one side another kind", event.UpdateEvent{ObjectOld: machine(kaironv1.MachineRunning), ObjectNew: &corev1.Node{}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := phaseChanged.Update(tc.ev); got != tc.want {
				t.Errorf("Update = %v, want %v", got, tc.want)
			}
		})
	}
	if !phaseChanged.Create(event.CreateEvent{Object: machine("")}) || !phaseChanged.Delete(event.DeleteEvent{Object: machine("")}) ||
		!phaseChanged.Generic(event.GenericEvent{Object: machine("")}) {
		t.Error("create, delete and generic events must pass")
	}
}
