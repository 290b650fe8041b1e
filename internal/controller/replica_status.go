package controller

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// setReplicaFailure sets the ReplicaFailure condition after a sync that
// failed and removes it after one that did not. While fewer Machines exist
// than desired, the failure is taken to be a create's; otherwise a delete's.
func setReplicaFailure(conditions *[]metav1.Condition, syncErr error, have, desired int32, generation int64) {
	if syncErr == nil {
		meta.RemoveStatusCondition(conditions, kaironv1.ConditionReplicaFailure.String())
		return
	}
	reason := kaironv1.ReplicaReasonFailedDelete
	if have < desired {
		reason = kaironv1.ReplicaReasonFailedCreate
	}
	meta.SetStatusCondition(conditions, metav1.Condition{
		Type: kaironv1.ConditionReplicaFailure.String(), Status: metav1.ConditionTrue, Reason: reason,
		Message: syncErr.Error(), ObservedGeneration: generation,
	})
}
