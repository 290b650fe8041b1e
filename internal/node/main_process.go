package node

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/guestagent/wire"
)

// observeMainProcess keeps the MainProcess condition of a Machine whose
// image has an entrypoint, from what the guest agent reported of it at
// the last ping, and records an event when it ends. The guest reports it
// (wire.MainProcess, validated on receipt), so it says what the guest
// claims: enough to show a user their program's exit, not to be trusted
// for anything else. A guest that reports none leaves the condition as
// it was: an old agent, or the default guest.
func (a *Agent) observeMainProcess(machine *kaironv1.Machine, main *wire.MainProcess) {
	if main == nil {
		return
	}
	cond, eventType, eventReason := mainProcessCondition(main)
	cond.ObservedGeneration = machine.Generation
	old := meta.FindStatusCondition(machine.Status.Conditions, cond.Type)
	changed := old == nil || old.Reason != cond.Reason || old.Message != cond.Message
	meta.SetStatusCondition(&machine.Status.Conditions, cond)
	if changed && eventReason != "" {
		a.event(machine, eventType, eventReason, cond.Message)
	}
}

// mainProcessCondition is the MainProcess condition for what the guest
// reported, with the event its end is recorded with (no reason while it
// runs).
func mainProcessCondition(main *wire.MainProcess) (cond metav1.Condition, eventType, eventReason string) {
	cond = metav1.Condition{Type: kaironv1.ConditionMainProcess.String()}
	switch {
	case main.State == wire.MainRunning:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, kaironv1.MainProcessReasonRunning, "the image's main process (its entrypoint and command) runs"
		return cond, "", ""
	case main.Signal != "":
		cond.Status, cond.Reason = metav1.ConditionFalse, kaironv1.MainProcessReasonFailed
		cond.Message = fmt.Sprintf("the image's main process was killed by signal %s", main.Signal)
		return cond, corev1.EventTypeWarning, kaironv1.EventReasonMainProcessFailed
	case main.ExitCode == 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, kaironv1.MainProcessReasonCompleted
		cond.Message = "the image's main process exited with status 0"
		return cond, corev1.EventTypeNormal, kaironv1.EventReasonMainProcessCompleted
	default:
		cond.Status, cond.Reason = metav1.ConditionFalse, kaironv1.MainProcessReasonFailed
		cond.Message = fmt.Sprintf("the image's main process exited with status %d", main.ExitCode)
		return cond, corev1.EventTypeWarning, kaironv1.EventReasonMainProcessFailed
	}
}
