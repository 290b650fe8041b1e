package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules"
)

// fencePoll is how often a fenced node with Machines still to deal with
// (a restore waiting, a write that failed) is looked at again.
const fencePoll = 2 * time.Second

// FenceReconciler follows through on a fence: an operator attested, with
// kaironctl fence, that a node is down (the TaintNodeFenced taint on the
// Node), and this controller carries out rules.PlanFence for every Machine
// whose spec.nodeName is that node. MachineSet and MachinePool Machines are
// deleted, their VM finalizer finished in the dead agent's place, so that
// their owners replace them; a Machine with a Ready MachineSnapshot is
// recreated from it on another node (fence_restore.go); a claimed Machine
// without one is deleted and its claim goes Lost (ClaimReasonNodeFenced); a
// Machine nobody owns, without a snapshot, stays. MachineMigrations through
// the node end (fence_migrations.go). The scheduler places
// nothing on a fenced node (rules.NodeRejections). kaironctl recover lifts
// the taint; the node's agent then destroys its stale VMs before it reports
// Ready (internal/node/rejoin_fence.go).
type FenceReconciler struct {
	Client client.Client
	// APIReader lists the fenced node's Machines and their claims from the
	// API server: acting twice on a stale cache would delete a replacement.
	APIReader client.Reader
	Recorder  events.EventRecorder

	mu sync.Mutex
	// fenced are the nodes this controller saw fenced, for the
	// NodeFenced/NodeRecovered events and the gauge.
	fenced map[string]bool
	// left are the Machines whose FencedMachineLeft event was recorded.
	left map[types.UID]bool
	// restores are the Machines deleted to be recreated from a snapshot
	// (fence_restore.go).
	restores map[types.NamespacedName]*pendingRestore
}

// SetupWithManager registers the reconciler with mgr.
func (r *FenceReconciler) SetupWithManager(mgr manager.Manager) error {
	r.fenced = map[string]bool{}
	r.left = map[types.UID]bool{}
	r.restores = map[types.NamespacedName]*pendingRestore{}
	return builder.ControllerManagedBy(mgr).
		Named("fence").
		For(&corev1.Node{}, builder.WithPredicates(fenceChanged())).
		// A Machine arriving on, or changing on, a fenced node (a restore
		// that took, a delete) is looked at with its node.
		Watches(&kaironv1.Machine{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			m, ok := o.(*kaironv1.Machine)
			if !ok || m.Spec.NodeName == "" || !r.isFenced(m.Spec.NodeName) {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: m.Spec.NodeName}}}
		})).
		Complete(requeue.UntilStopped(r))
}

// fenceChanged passes a node's arrival and departure and the fence taint
// going on or off.
func fenceChanged() predicate.Funcs {
	return updatesThat(func(old, cur *corev1.Node) bool { return rules.NodeFenced(old) != rules.NodeFenced(cur) })
}

func (r *FenceReconciler) isFenced(node string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fenced[node]
}

// setFenced records whether node is fenced, updates kairon_fenced_nodes and
// reports whether that changed.
func (r *FenceReconciler) setFenced(node string, fenced bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	was := r.fenced[node]
	if fenced {
		r.fenced[node] = true
	} else {
		delete(r.fenced, node)
	}
	fencedNodes.Set(float64(len(r.fenced)))
	return was != fenced
}

// Reconcile follows through on one node's fence.
func (r *FenceReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	if err := r.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		if apierrors.IsNotFound(err) {
			r.setFenced(req.Name, false)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	// Restores under way finish whatever became of their node's fence.
	restoring, restoreErr := r.finishRestores(ctx)
	if !rules.NodeFenced(&node) {
		if r.setFenced(node.Name, false) {
			log.FromContext(ctx).Info("Fence lifted", "node", klog.KObj(&node))
			r.Recorder.Eventf(&node, nil, corev1.EventTypeNormal, kaironv1.EventReasonNodeRecovered, "Recover",
				"The fence is lifted (kaironctl recover): the scheduler may place Machines here again once the agent reports Ready; it first destroys every VM whose Machine runs elsewhere now")
		}
		if restoring {
			return reconcile.Result{RequeueAfter: fencePoll}, restoreErr
		}
		return reconcile.Result{}, restoreErr
	}

	plan, err := rules.LoadFencePlan(ctx, r.APIReader, node.Name)
	if err != nil {
		return reconcile.Result{}, err
	}
	if r.setFenced(node.Name, true) {
		log.FromContext(ctx).Info("Node fenced", "node", klog.KObj(&node), "plan", rules.FenceSummary(plan))
		by := ""
		if who := node.Annotations[kaironv1.AnnotationFencedBy]; who != "" {
			by = " by " + who
		}
		r.Recorder.Eventf(&node, nil, corev1.EventTypeWarning, kaironv1.EventReasonNodeFenced, "Fence",
			"Fenced%s (kaironctl fence): the node is down; %s", by, rules.FenceSummary(plan))
	}

	// Migrations through the node end first: a Running one would keep the
	// rejoining agent from destroying the VM it moves.
	errs := []error{restoreErr, r.endMigrations(ctx, node.Name, plan)}
	pending := restoring
	for _, d := range plan {
		done, err := r.carryOut(ctx, node.Name, d)
		if err != nil {
			errs = append(errs, fmt.Errorf("machine %s/%s: %w", d.Machine.Namespace, d.Machine.Name, err))
		}
		if !done {
			pending = true
		}
	}
	if err := errors.Join(errs...); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
		}
		return reconcile.Result{}, err
	}
	if pending {
		return reconcile.Result{RequeueAfter: fencePoll}, nil
	}
	return reconcile.Result{}, nil
}

// carryOut acts on one decision. It reports whether the Machine is dealt
// with (false: look again soon).
func (r *FenceReconciler) carryOut(ctx context.Context, node string, d rules.FenceDecision) (bool, error) {
	m := d.Machine
	switch d.Action {
	case rules.FenceFinishDeletion:
		return false, r.finishDeletion(ctx, m)
	case rules.FenceReplace:
		if err := r.remove(ctx, m); err != nil {
			return false, err
		}
		r.machineEvent(ctx, m, corev1.EventTypeNormal, kaironv1.EventReasonFenceReplaced, d.Receipt(node))
		return true, nil
	case rules.FenceClaimLost:
		if err := r.loseClaim(ctx, node, d); err != nil {
			return false, err
		}
		if err := r.remove(ctx, m); err != nil {
			return false, err
		}
		r.machineEvent(ctx, m, corev1.EventTypeWarning, kaironv1.ClaimReasonNodeFenced, d.Receipt(node))
		return true, nil
	case rules.FenceRestore:
		return r.restore(ctx, node, d)
	default:
		r.mu.Lock()
		seen := r.left[m.UID]
		r.left[m.UID] = true
		r.mu.Unlock()
		if !seen {
			r.machineEvent(ctx, m, corev1.EventTypeWarning, kaironv1.EventReasonFenceLeft, d.Receipt(node))
		}
		return true, nil
	}
}

func (r *FenceReconciler) machineEvent(ctx context.Context, m *kaironv1.Machine, kind, reason, message string) {
	log.FromContext(ctx).Info("Fence", "machine", klog.KObj(m), "action", reason, "receipt", message)
	r.Recorder.Eventf(m, nil, kind, reason, "Fence", "%s", message)
}

// remove deletes a Machine of the fenced node and finishes its deletion in
// the dead agent's place.
func (r *FenceReconciler) remove(ctx context.Context, m *kaironv1.Machine) error {
	if m.DeletionTimestamp == nil {
		err := r.Client.Delete(ctx, m, client.Preconditions{UID: ptr.To(m.UID)})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil // gone, or a new Machine under the name: not ours
		}
		if err != nil {
			return err
		}
	}
	return r.finishDeletion(ctx, m)
}

// finishDeletion removes the VM finalizer, which only the node's agent
// removes otherwise: the VM is gone with its node (the operator said so).
func (r *FenceReconciler) finishDeletion(ctx context.Context, m *kaironv1.Machine) error {
	if !controllerutil.ContainsFinalizer(m, kaironv1.FinalizerMachineVM) {
		return nil
	}
	updated := m.DeepCopy()
	controllerutil.RemoveFinalizer(updated, kaironv1.FinalizerMachineVM)
	// Locked to the version read: a Machine recreated under the name since
	// is another object and keeps its finalizer.
	err := r.Client.Patch(ctx, updated, client.MergeFromWithOptions(m, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// loseClaim marks the claim holding d's Machine Lost, reason NodeFenced,
// before the Machine goes: the claim controller would otherwise say only
// that the Machine was deleted.
func (r *FenceReconciler) loseClaim(ctx context.Context, node string, d rules.FenceDecision) error {
	m := d.Machine
	var claim kaironv1.MachineClaim
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: d.Claim}, &claim)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if claim.Status.Phase != kaironv1.ClaimBound || claim.Status.MachineName != m.Name {
		return nil // not bound to it (any more)
	}
	message := fmt.Sprintf("machine %s ran on node %s, which was fenced (kaironctl fence), and %s", m.Name, node,
		"it has no Ready MachineSnapshot to be restored from")
	status := claim.Status.DeepCopy()
	status.Phase = kaironv1.ClaimLost
	status.Message = message
	status.ObservedGeneration = claim.Generation
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: kaironv1.ConditionReady.String(), Status: metav1.ConditionFalse, Reason: kaironv1.ClaimReasonNodeFenced,
		Message: message, ObservedGeneration: claim.Generation,
	})
	desired := claim.DeepCopy()
	desired.Status = *status
	if err := patch.Status(ctx, r.Client, &claim, desired, patch.WithOptimisticLock()); err != nil {
		return err
	}
	log.FromContext(ctx).Info("Claim lost its machine to a fence", "claim", klog.KObj(&claim), "machine", klog.KObj(m))
	r.Recorder.Eventf(desired, m, corev1.EventTypeWarning, kaironv1.ClaimReasonNodeFenced, "Fence", "%s", message)
	return nil
}
