package controller

import (
	"context"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// mirrorNodeReachable copies the NodeReachable condition of a bound
// claim's Machine into the claim's status: False while the Machine's node
// agent is unreachable (the VM may be running or gone; nobody can tell
// yet), True once it is back. A claim whose Machine never saw its node
// unreachable has no such condition.
func mirrorNodeReachable(ctx context.Context, c client.Reader, claim *kaironv1.MachineClaim, status *kaironv1.MachineClaimStatus) error {
	var m kaironv1.Machine
	if err := c.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Status.MachineName}, &m); err != nil {
		return client.IgnoreNotFound(err)
	}
	cond := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionNodeReachable.String())
	if cond == nil {
		meta.RemoveStatusCondition(&status.Conditions, kaironv1.ConditionNodeReachable.String())
		return nil
	}
	mirrored := *cond
	mirrored.ObservedGeneration = claim.Generation
	mirrored.Message = "machine " + m.Name + " is on " + cond.Message
	meta.SetStatusCondition(&status.Conditions, mirrored)
	return nil
}
