package controller

import (
	"context"
	"encoding/json"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

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

// patchWholeStatus writes status to obj, whose status is now cur, if it
// changed. The replica controllers own the whole status of their objects,
// so it sends all of it rather than a diff: a diff against a status the
// server has never seen leaves out zero counts (readyReplicas: 0), which
// kubectl then prints as blank. A deleted obj is no error.
func patchWholeStatus[S any](ctx context.Context, c client.Client, obj client.Object, cur, status *S) error {
	if equality.Semantic.DeepEqual(cur, status) {
		return nil
	}
	body, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	// A copy, so that the caller's object keeps the state it reconciled.
	patched := obj.DeepCopyObject().(client.Object)
	return client.IgnoreNotFound(c.Status().Patch(ctx, patched, client.RawPatch(types.MergePatchType, body)))
}
