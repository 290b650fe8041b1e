package controller

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
)

// ClaimEgressEnforcedReconciler writes a bound claim's EgressEnforced
// condition from what the node agent reports in the egress policy's
// status.nodes. It writes that condition only, with the claim's
// resourceVersion as a lock, so it cannot undo the binder's or the claim
// reconciler's writes.
type ClaimEgressEnforcedReconciler struct {
	Client client.Client
}

// SetupWithManager registers the reconciler with mgr.
func (r *ClaimEgressEnforcedReconciler) SetupWithManager(mgr manager.Manager) error {
	claimOfPolicy := func(_ context.Context, o client.Object) []reconcile.Request {
		name, ok := o.GetLabels()[kaironv1.LabelMachineClaim]
		if !ok {
			return nil
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
	}
	return builder.ControllerManagedBy(mgr).
		Named("machineclaim-egress-enforced").
		For(&kaironv1.MachineClaim{}).
		Watches(&kaironv1.MachineNetworkPolicy{}, handler.EnqueueRequestsFromMapFunc(claimOfPolicy)).
		// The Machine's node decides whose report counts (a migration).
		Watches(&kaironv1.Machine{}, handler.EnqueueRequestsFromMapFunc(claimOfMachine)).
		Complete(requeue.UntilStopped(r))
}

// EgressEnforcement tells whether policy is in force for machine: the
// node that runs it lists it at the policy's current generation. A report
// from another node (the source of a migration) does not count.
func EgressEnforcement(policy *kaironv1.MachineNetworkPolicy, machine *kaironv1.Machine) metav1.Condition {
	c := metav1.Condition{Type: kaironv1.ConditionEgressEnforced.String(), Status: metav1.ConditionFalse, Reason: kaironv1.EgressReasonNotYetEnforced}
	switch {
	case policy == nil:
		c.Message = "the egress policy does not exist yet"
		return c
	case machine == nil || machine.Spec.NodeName == "":
		c.Message = "the Machine has no node yet"
		return c
	}
	for _, n := range policy.Status.Nodes {
		if n.Node != machine.Spec.NodeName {
			continue
		}
		if n.ObservedGeneration == policy.Generation && slices.Contains(n.Machines, machine.Name) {
			c.Status, c.Reason = metav1.ConditionTrue, kaironv1.EgressReasonEnforced
			c.Message = fmt.Sprintf("policy %s (generation %d) enforced on node %s", policy.Name, policy.Generation, n.Node)
			return c
		}
		if n.Error != "" {
			c.Reason = kaironv1.EgressReasonEnforcementFailed
			c.Message = fmt.Sprintf("node %s: %s", n.Node, n.Error)
			return c
		}
	}
	c.Message = fmt.Sprintf("node %s has not reported policy %s at generation %d", machine.Spec.NodeName, policy.Name, policy.Generation)
	return c
}

func (r *ClaimEgressEnforcedReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	claim := &kaironv1.MachineClaim{}
	if err := r.Client.Get(ctx, req.NamespacedName, claim); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	desired := claim.DeepCopy()
	if claim.Spec.Egress == nil || claim.Status.Phase != kaironv1.ClaimBound || claim.Status.MachineName == "" {
		meta.RemoveStatusCondition(&desired.Status.Conditions, kaironv1.ConditionEgressEnforced.String())
	} else {
		var policy *kaironv1.MachineNetworkPolicy
		if claim.Status.EgressPolicy != "" {
			policy = &kaironv1.MachineNetworkPolicy{}
			err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Status.EgressPolicy}, policy)
			if apierrors.IsNotFound(err) {
				policy = nil
			} else if err != nil {
				return reconcile.Result{}, err
			}
		}
		machine := &kaironv1.Machine{}
		err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: claim.Status.MachineName}, machine)
		if apierrors.IsNotFound(err) {
			machine = nil
		} else if err != nil {
			return reconcile.Result{}, err
		}
		c := EgressEnforcement(policy, machine)
		c.ObservedGeneration = claim.Generation
		meta.SetStatusCondition(&desired.Status.Conditions, c)
	}
	return reconcile.Result{}, client.IgnoreNotFound(patch.Status(ctx, r.Client, claim, desired, patch.WithOptimisticLock()))
}

// egressEnforceTimeout bounds how long a bind waits for the node to report
// the claim's egress policy in force; the Machine then goes back to its
// pool and the claim stays Pending, to be tried again. Atomic, as the
// intervals below: tests shorten them while other tests' binders run.
var egressEnforceTimeout = atomicDuration(20 * time.Second)

// egressEnforcePoll is how often the bind looks at the policy in the cache
// without a watch to wake it (policyWaiters), where the agent's status
// write arrives by watch; with one, it looks again after each new version
// and, as a safety net, every egressEnforceRecheck.
var (
	egressEnforcePoll    = atomicDuration(5 * time.Millisecond)
	egressEnforceRecheck = atomicDuration(time.Second)
)

// atomicDuration is a time.Duration variable safe to change while read.
func atomicDuration(d time.Duration) *atomic.Int64 {
	v := &atomic.Int64{}
	v.Store(int64(d))
	return v
}

// waitEgressEnforced returns the EgressEnforced condition once the node
// running m reports policy in force for it, so that a claim is never Bound
// while its Machine could still send what spec.egress forbids.
func waitEgressEnforced(ctx context.Context, c client.Reader, waiters *policyWaiters, namespace, policy string, m *kaironv1.Machine) (metav1.Condition, error) {
	timeout := time.Duration(egressEnforceTimeout.Load())
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	key := client.ObjectKey{Namespace: namespace, Name: policy}
	var last metav1.Condition
	timedOut := func(err error) (metav1.Condition, error) {
		if last.Message == "" {
			return last, err
		}
		return last, fmt.Errorf("egress policy not enforced within %v: %s", timeout, last.Message)
	}
	for {
		var changed <-chan struct{}
		stop := func() {}
		if waiters != nil {
			changed, stop = waiters.wait(key)
		}
		p := &kaironv1.MachineNetworkPolicy{}
		switch err := c.Get(ctx, key, p); {
		case apierrors.IsNotFound(err):
			p = nil
		case err != nil:
			stop()
			if ctx.Err() != nil {
				return timedOut(ctx.Err())
			}
			return last, err
		}
		if last = EgressEnforcement(p, m); last.Status == metav1.ConditionTrue {
			stop()
			return last, nil
		}
		recheck := time.Duration(egressEnforcePoll.Load())
		if changed != nil {
			recheck = time.Duration(egressEnforceRecheck.Load())
		}
		timer := time.NewTimer(recheck)
		select {
		case <-changed:
		case <-timer.C:
		case <-ctx.Done():
		}
		timer.Stop()
		stop()
		if ctx.Err() != nil {
			return timedOut(ctx.Err())
		}
	}
}

// withEgressEnforced puts the condition the bind waited for into the
// status that says Bound, so that both appear in one write.
func withEgressEnforced(status *kaironv1.MachineClaimStatus, cond *metav1.Condition, generation int64) {
	if cond == nil {
		return
	}
	c := *cond
	c.ObservedGeneration = generation
	meta.SetStatusCondition(&status.Conditions, c)
}
