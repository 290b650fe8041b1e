package controller

import (
	"context"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules"
)

// MachineQuotaReconciler reports in a MachineQuota's status what its
// namespace uses. Enforcement is the scheduler's and the webhook's job.
type MachineQuotaReconciler struct {
	Client   client.Client
	Interval time.Duration
}

// SetupWithManager registers the reconciler with mgr.
func (r *MachineQuotaReconciler) SetupWithManager(mgr manager.Manager) error {
	return builder.ControllerManagedBy(mgr).
		For(&kaironv1.MachineQuota{}).
		Watches(&kaironv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.quotasOfMachine), builder.WithPredicates(machinePlacementChanged())).
		Complete(requeue.UntilStopped(r))
}

func (r *MachineQuotaReconciler) quotasOfMachine(ctx context.Context, o client.Object) []reconcile.Request {
	var quotas kaironv1.MachineQuotaList
	if err := r.Client.List(ctx, &quotas, client.InNamespace(o.GetNamespace())); err != nil {
		log.FromContext(ctx).Error(err, "Listing machine quotas to update their usage", "namespace", o.GetNamespace())
		return nil
	}
	requests := make([]reconcile.Request, len(quotas.Items))
	for i := range quotas.Items {
		requests[i] = reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&quotas.Items[i])}
	}
	return requests
}

// Reconcile recomputes one quota's status.
func (r *MachineQuotaReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var quota kaironv1.MachineQuota
	if err := r.Client.Get(ctx, req.NamespacedName, &quota); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var machines kaironv1.MachineList
	if err := r.Client.List(ctx, &machines, client.InNamespace(quota.Namespace)); err != nil {
		return reconcile.Result{}, err
	}
	used, _ := rules.QuotaUsage(&quota, machines.Items)

	desired := quota.DeepCopy()
	desired.Status.Hard = *quota.Spec.Hard.DeepCopy()
	desired.Status.Used = used
	desired.Status.ObservedGeneration = quota.Generation
	meta.SetStatusCondition(&desired.Status.Conditions, quotaReadyCondition(&quota, used))

	if equality.Semantic.DeepEqual(quota.Status, desired.Status) {
		return reconcile.Result{RequeueAfter: r.Interval}, nil
	}
	// Last writer wins: the usage is recomputed every pass. The reconciler
	// owns the whole status, so all of it is sent, zero counts included.
	if err := patch.Status(ctx, r.Client, &quota, desired, patch.WholeStatus()); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	log.FromContext(ctx).V(1).Info("Updated quota usage", "used", rules.QuotaSummary(quota.Spec.Hard, used))
	return reconcile.Result{RequeueAfter: r.Interval}, nil
}

// quotaReadyCondition is Ready=True while use is within every limit. Use
// can exceed a limit after the quota was lowered or Machines were placed by
// hand; the condition then says so, since the Machines already running are
// left alone and only new ones wait.
func quotaReadyCondition(quota *kaironv1.MachineQuota, used kaironv1.MachineResources) metav1.Condition {
	summary := rules.QuotaSummary(quota.Spec.Hard, used)
	if over := rules.QuotaExceeded(quota.Spec.Hard, used); len(over) > 0 {
		return metav1.Condition{
			Type:               kaironv1.ConditionReady.String(),
			Status:             metav1.ConditionFalse,
			Reason:             kaironv1.QuotaReasonLimitExceeded,
			Message:            "over the limit: " + strings.Join(over, ", ") + "; running Machines are kept, new ones stay Pending",
			ObservedGeneration: quota.Generation,
		}
	}
	return metav1.Condition{
		Type:               kaironv1.ConditionReady.String(),
		Status:             metav1.ConditionTrue,
		Reason:             kaironv1.QuotaReasonWithinLimits,
		Message:            summary,
		ObservedGeneration: quota.Generation,
	}
}
