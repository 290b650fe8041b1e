package node

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/guestagent/wire"
)

func TestMainProcessCondition(t *testing.T) {
	for _, tc := range []struct {
		main                   wire.MainProcess
		status                 metav1.ConditionStatus
		reason, message        string
		eventType, eventReason string
	}{
		{wire.MainProcess{State: wire.MainRunning}, metav1.ConditionTrue, kaironv1.MainProcessReasonRunning, "the image's main process (its entrypoint and command) runs", "", ""},
		{wire.MainProcess{State: wire.MainExited}, metav1.ConditionFalse, kaironv1.MainProcessReasonCompleted, "the image's main process exited with status 0", corev1.EventTypeNormal, kaironv1.EventReasonMainProcessCompleted},
		{wire.MainProcess{State: wire.MainExited, ExitCode: 3}, metav1.ConditionFalse, kaironv1.MainProcessReasonFailed, "the image's main process exited with status 3", corev1.EventTypeWarning, kaironv1.EventReasonMainProcessFailed},
		{wire.MainProcess{State: wire.MainExited, ExitCode: -1, Signal: "KILL"}, metav1.ConditionFalse, kaironv1.MainProcessReasonFailed, "the image's main process was killed by signal KILL", corev1.EventTypeWarning, kaironv1.EventReasonMainProcessFailed},
	} {
		cond, eventType, eventReason := mainProcessCondition(&tc.main)
		if cond.Type != "MainProcess" || cond.Status != tc.status || cond.Reason != tc.reason || cond.Message != tc.message || eventType != tc.eventType || eventReason != tc.eventReason {
			t.Errorf("%+v: got %s %s %s %q, event %s %s", tc.main, cond.Type, cond.Status, cond.Reason, cond.Message, eventType, eventReason)
		}
	}
}
