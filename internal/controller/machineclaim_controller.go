package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/requeue"
)

// adoptGrace is how long a Pending claim with a Machine already labelled
// for it is left to the binder that labelled it, whose status write is
// normally a few milliseconds behind, before this controller records the
// bind itself (that binder crashed, or lost its write).
const adoptGrace = 2 * time.Second

// releaseRetryDelay is how soon a release looks again while the claim's
// egress policy is still being deleted (its deletion event usually comes
// first).
const releaseRetryDelay = time.Second

// MachineClaimReconciler runs a claim's life after the bind, which
// MachineClaimBinder does: it keeps the egress policy in line with
// spec.egress, marks the claim Lost when its Machine goes, deletes it when
// spec.ttlSeconds runs out and, through the claim's finalizer, releases the
// Machine when the claim is deleted: egress policy first, then the Machine
// deleted or handed back per spec.reclaimPolicy.
type MachineClaimReconciler struct {
	Client client.Client
	// APIReader reads from the API server where acting on a stale cache
	// would be wrong (declaring a Machine lost, releasing Machines).
	APIReader client.Reader
	Recorder  events.EventRecorder
	Interval  time.Duration

	tracker *bindTracker
}

// SetupWithManager registers the reconciler with mgr.
func (r *MachineClaimReconciler) SetupWithManager(mgr manager.Manager) error {
	if r.tracker == nil {
		r.tracker = newBindTracker()
	}
	return builder.ControllerManagedBy(mgr).
		For(&kaironv1.MachineClaim{}).
		Owns(&kaironv1.MachineNetworkPolicy{}).
		Watches(&kaironv1.Machine{}, handler.EnqueueRequestsFromMapFunc(claimOfMachine),
			builder.WithPredicates(poolMemberChanged())).
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(requeue.UntilStopped(r))
}

// claimOfMachine maps a claimed Machine to its claim.
func claimOfMachine(_ context.Context, o client.Object) []reconcile.Request {
	claim := o.GetLabels()[kaironv1.LabelMachineClaim]
	if claim == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: claim}}}
}

// Reconcile runs one claim's life past the bind.
func (r *MachineClaimReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var claim kaironv1.MachineClaim
	if err := r.Client.Get(ctx, req.NamespacedName, &claim); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if claim.DeletionTimestamp != nil {
		return r.release(ctx, &claim)
	}
	labelled, err := r.labelledMachines(ctx, &claim)
	if err != nil {
		return reconcile.Result{}, err
	}
	var result reconcile.Result
	switch claim.Status.Phase {
	case kaironv1.ClaimBound:
		result, err = r.reconcileBound(ctx, &claim, labelled)
	case kaironv1.ClaimLost:
		result, err = r.reconcileLost(ctx, &claim, labelled)
	default:
		result, err = r.reconcilePending(ctx, &claim, labelled)
	}
	if apierrors.IsConflict(err) {
		// The claim or a Machine changed under us; look again with the
		// new version, quietly.
		return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	return result, err
}

// labelledMachines lists the Machines labelled as claimed by this claim,
// from the cache. Normally there is one, the bound Machine; more are strays
// of a bind that lost a race, to be handed back.
func (r *MachineClaimReconciler) labelledMachines(ctx context.Context, claim *kaironv1.MachineClaim) ([]*kaironv1.Machine, error) {
	return listLabelled(ctx, r.Client, claim, client.MatchingFields{claimedMachineIndex: claim.Name})
}

// labelledMachinesLive is labelledMachines read from the API server.
func (r *MachineClaimReconciler) labelledMachinesLive(ctx context.Context, claim *kaironv1.MachineClaim) ([]*kaironv1.Machine, error) {
	return listLabelled(ctx, r.APIReader, claim,
		client.MatchingLabels{kaironv1.LabelMachineClaim: claim.Name, kaironv1.LabelPoolState: kaironv1.PoolStateClaimed})
}

func listLabelled(ctx context.Context, reader client.Reader, claim *kaironv1.MachineClaim, selector client.ListOption) ([]*kaironv1.Machine, error) {
	var list kaironv1.MachineList
	if err := reader.List(ctx, &list, client.InNamespace(claim.Namespace), selector); err != nil {
		return nil, fmt.Errorf("listing the claim's machines: %w", err)
	}
	var out []*kaironv1.Machine
	for i := range list.Items {
		if list.Items[i].DeletionTimestamp == nil {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// reconcilePending settles a Pending claim that already has a Machine
// labelled for it: the binder labelled the Machine but its status write
// never landed. Left alone, the claim would be bound a second time.
func (r *MachineClaimReconciler) reconcilePending(ctx context.Context, claim *kaironv1.MachineClaim, labelled []*kaironv1.Machine) (reconcile.Result, error) {
	if len(labelled) == 0 {
		// Binding is the binder's. Looked at again each interval all the
		// same: should the event of a bind whose status write was lost
		// never reach this reconciler, the claim would wait forever, the
		// binder leaving a claim with a Machine labelled for it alone.
		r.tracker.forgetOrphan(claim.UID)
		return reconcile.Result{RequeueAfter: r.Interval}, nil
	}
	if r.tracker.claimInFlight(claim) {
		return reconcile.Result{RequeueAfter: adoptGrace}, nil
	}
	if wait := adoptGrace - r.tracker.now().Sub(r.tracker.orphanSince(claim.UID)); wait > 0 {
		return reconcile.Result{RequeueAfter: wait}, nil
	}
	sortOldestFirst(r.tracker, labelled)
	var adopted *kaironv1.Machine
	for _, m := range labelled {
		var fresh kaironv1.Machine
		err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(m), &fresh)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return reconcile.Result{}, err
		}
		if fresh.DeletionTimestamp == nil && fresh.Labels[kaironv1.LabelMachineClaim] == claim.Name &&
			fresh.Labels[kaironv1.LabelPoolState] == kaironv1.PoolStateClaimed {
			adopted = &fresh
			break
		}
	}
	if adopted == nil {
		log.FromContext(ctx).V(1).Info("The cache showed a Machine labelled for the claim that the API server does not", "machines", len(labelled))
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	// A Conflict here means the Machine changed since read, most often
	// handed back by the binder undoing this bind: look again.
	if err := markRecordingBind(ctx, r.Client, adopted, claim); err != nil {
		return reconcile.Result{}, err
	}
	claim, err := ensureClaimFinalizer(ctx, r.Client, claim)
	if err != nil {
		return reconcile.Result{}, err
	}
	policy := ""
	if claim.Spec.Egress != nil {
		if policy, err = ensureEgressPolicy(ctx, r.Client, r.APIReader, claim, adopted.Name); err != nil {
			return reconcile.Result{}, fmt.Errorf("egress policy: %w", err)
		}
	}
	now := r.tracker.now()
	bindTime := now.Sub(r.tracker.createdAt(claim))
	if err := patchClaimStatus(ctx, r.Client, claim, boundStatus(claim, adopted.Name, policy, now, bindTime)); err != nil {
		return reconcile.Result{}, err
	}
	r.tracker.forgetOrphan(claim.UID)
	claimBindDuration.Observe(bindTime.Seconds())
	log.FromContext(ctx).Info("Recorded an unrecorded bind", "machine", klog.KObj(adopted))
	r.Recorder.Eventf(claim, adopted, corev1.EventTypeNormal, kaironv1.ClaimReasonBound, "Bind",
		"Bound to machine %s in %dms", adopted.Name, claim.Status.BindMillis)
	return reconcile.Result{RequeueAfter: r.Interval}, r.handBackStrays(ctx, claim, labelled, adopted.Name)
}

// markRecordingBind writes AnnotationRecordingBindOf on m, guarded by the
// resourceVersion m was read at, before the claim's status names m. The
// guard orders this recording against a hand-back of m (returnToPool): if
// the hand-back's patch lands first this write conflicts and nothing is
// recorded; if this write lands first the hand-back's patch conflicts, and
// on reading m again it finds the mark and leaves m to the claim.
func markRecordingBind(ctx context.Context, c client.Client, m *kaironv1.Machine, claim *kaironv1.MachineClaim) error {
	if m.Annotations[kaironv1.AnnotationRecordingBindOf] == string(claim.UID) {
		return nil
	}
	marked := m.DeepCopy()
	if marked.Annotations == nil {
		marked.Annotations = map[string]string{}
	}
	marked.Annotations[kaironv1.AnnotationRecordingBindOf] = string(claim.UID)
	if err := c.Patch(ctx, marked, client.MergeFromWithOptions(m, client.MergeFromWithOptimisticLock{})); err != nil {
		return err
	}
	*m = *marked
	return nil
}

// reconcileBound watches over a bound claim: its Machine, its egress
// policy, its TTL.
func (r *MachineClaimReconciler) reconcileBound(ctx context.Context, claim *kaironv1.MachineClaim, labelled []*kaironv1.Machine) (reconcile.Result, error) {
	lost, err := r.machineLost(ctx, claim)
	if err != nil {
		return reconcile.Result{}, err
	}
	if lost {
		if claim.Annotations[kaironv1.AnnotationFenceRestoring] != "" {
			// kairon-controller is recreating the Machine of a fenced node
			// from a snapshot under the same name (fence_restore.go).
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		return r.markLost(ctx, claim, labelled)
	}
	var errs []error
	errs = append(errs, r.handBackStrays(ctx, claim, labelled, claim.Status.MachineName))
	// A bind recorded by hand, or by an older controller, may lack the
	// finalizer; without it a Retain claim's Machine would follow the claim.
	claim, err = ensureClaimFinalizer(ctx, r.Client, claim)
	if err != nil {
		return reconcile.Result{}, errors.Join(append(errs, err)...)
	}

	status := claim.Status.DeepCopy()
	policy, err := r.syncEgress(ctx, claim)
	if err != nil {
		errs = append(errs, err)
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: kaironv1.ConditionReady.String(), Status: metav1.ConditionFalse, Reason: kaironv1.ClaimReasonEgressPolicyFailed,
			Message: "egress policy: " + err.Error(), ObservedGeneration: claim.Generation,
		})
	} else {
		status.EgressPolicy = policy
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: kaironv1.ConditionReady.String(), Status: metav1.ConditionTrue, Reason: kaironv1.ClaimReasonBound,
			Message: "Bound to machine " + claim.Status.MachineName, ObservedGeneration: claim.Generation,
		})
	}
	status.ObservedGeneration = claim.Generation
	errs = append(errs, mirrorNodeReachable(ctx, r.Client, claim, status))
	if !equality.Semantic.DeepEqual(&claim.Status, status) {
		errs = append(errs, patchClaimStatus(ctx, r.Client, claim, status))
	}
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	return r.expire(ctx, claim)
}

// machineLost says whether the bound Machine was deleted out from under the
// claim. The cache saw the Machine when it was bound, so its absence there
// is asked of the API server before the claim is declared Lost for good.
func (r *MachineClaimReconciler) machineLost(ctx context.Context, claim *kaironv1.MachineClaim) (bool, error) {
	key := client.ObjectKey{Namespace: claim.Namespace, Name: claim.Status.MachineName}
	var m kaironv1.Machine
	err := r.Client.Get(ctx, key, &m)
	if apierrors.IsNotFound(err) {
		err = r.APIReader.Get(ctx, key, &m)
	}
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, err
	}
	return m.DeletionTimestamp != nil, nil
}

func (r *MachineClaimReconciler) markLost(ctx context.Context, claim *kaironv1.MachineClaim, labelled []*kaironv1.Machine) (reconcile.Result, error) {
	message := fmt.Sprintf("machine %q was deleted", claim.Status.MachineName)
	status := claim.Status.DeepCopy()
	status.Phase = kaironv1.ClaimLost
	status.Message = message
	status.ObservedGeneration = claim.Generation
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: kaironv1.ConditionReady.String(), Status: metav1.ConditionFalse, Reason: kaironv1.ClaimReasonMachineLost,
		Message: message, ObservedGeneration: claim.Generation,
	})
	if err := patchClaimStatus(ctx, r.Client, claim, status); err != nil {
		return reconcile.Result{}, err
	}
	log.FromContext(ctx).Info("Claim lost its machine", "machine", klog.KRef(claim.Namespace, claim.Status.MachineName))
	r.Recorder.Eventf(claim, nil, corev1.EventTypeWarning, kaironv1.ClaimReasonMachineLost, "Bind", "%s", message)
	return r.reconcileLost(ctx, claim, labelled)
}

// reconcileLost cleans up after a lost Machine: its egress policy confines
// nothing any more. The claim stays, Lost, until deleted or expired.
func (r *MachineClaimReconciler) reconcileLost(ctx context.Context, claim *kaironv1.MachineClaim, labelled []*kaironv1.Machine) (reconcile.Result, error) {
	errs := []error{r.handBackStrays(ctx, claim, labelled, "")}
	gone, err := deleteEgressPolicy(ctx, r.Client, r.Client, claim)
	errs = append(errs, err)
	if gone && claim.Status.EgressPolicy != "" {
		status := claim.Status.DeepCopy()
		status.EgressPolicy = ""
		errs = append(errs, patchClaimStatus(ctx, r.Client, claim, status))
	}
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	return r.expire(ctx, claim)
}

// syncEgress makes the claim's egress policy match spec.egress and returns
// its name, "" when there is none.
func (r *MachineClaimReconciler) syncEgress(ctx context.Context, claim *kaironv1.MachineClaim) (string, error) {
	if claim.Spec.Egress != nil {
		return ensureEgressPolicy(ctx, r.Client, r.APIReader, claim, claim.Status.MachineName)
	}
	gone, err := deleteEgressPolicy(ctx, r.Client, r.Client, claim)
	switch {
	case err != nil:
		return claim.Status.EgressPolicy, err
	case !gone:
		return claim.Status.EgressPolicy, nil
	}
	return "", nil
}

// handBackStrays returns to the pool every Machine labelled for the claim
// except keep.
func (r *MachineClaimReconciler) handBackStrays(ctx context.Context, claim *kaironv1.MachineClaim, labelled []*kaironv1.Machine, keep string) error {
	var pool *kaironv1.MachinePool
	var errs []error
	for _, m := range labelled {
		if m.Name == keep {
			continue
		}
		if pool == nil {
			pool = &kaironv1.MachinePool{}
			if err := r.Client.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: m.Labels[kaironv1.LabelMachinePool]}, pool); err != nil {
				if !apierrors.IsNotFound(err) {
					return err
				}
				pool = nil
			}
		}
		log.FromContext(ctx).Info("Handing back a machine the claim does not hold", "machine", klog.KObj(m))
		errs = append(errs, returnToPool(ctx, r.Client, r.APIReader, r.Recorder, pool, claim, m.Name))
	}
	return errors.Join(errs...)
}

// expire deletes the claim once spec.ttlSeconds have passed since the bind,
// or says when to look again.
func (r *MachineClaimReconciler) expire(ctx context.Context, claim *kaironv1.MachineClaim) (reconcile.Result, error) {
	result := reconcile.Result{RequeueAfter: r.Interval}
	if claim.Spec.TTLSeconds == nil || claim.Status.BoundAt == nil {
		return result, nil
	}
	ttl := time.Duration(*claim.Spec.TTLSeconds) * time.Second
	if left := time.Until(claim.Status.BoundAt.Add(ttl)); left > 0 {
		result.RequeueAfter = min(result.RequeueAfter, left)
		return result, nil
	}
	err := r.Client.Delete(ctx, claim, client.Preconditions{UID: ptr.To(claim.UID)})
	if err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	log.FromContext(ctx).Info("Deleted expired claim", "ttlSeconds", *claim.Spec.TTLSeconds)
	r.Recorder.Eventf(claim, nil, corev1.EventTypeNormal, kaironv1.EventReasonExpired, "Delete",
		"Deleted the claim %ds after its bind (spec.ttlSeconds)", *claim.Spec.TTLSeconds)
	return reconcile.Result{}, nil
}

// release runs when a claim is deleted. The order is the point: the egress
// policy goes first, and only once it is gone is the Machine deleted or
// handed back, so a Machine is never deleted while its policy still names
// it, nor handed back to its user still confined by a claim that is gone.
func (r *MachineClaimReconciler) release(ctx context.Context, claim *kaironv1.MachineClaim) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(claim, kaironv1.FinalizerMachineClaim) {
		return reconcile.Result{}, nil
	}
	gone, err := deleteEgressPolicy(ctx, r.Client, r.APIReader, claim)
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("deleting egress policy: %w", err)
	}
	if !gone {
		return reconcile.Result{RequeueAfter: releaseRetryDelay}, nil
	}

	// Read from the API server: a Machine the cache has not yet seen
	// labelled for the claim would otherwise outlive it, claimed by nobody.
	labelled, err := r.labelledMachinesLive(ctx, claim)
	if err != nil {
		return reconcile.Result{}, err
	}
	bound := ""
	if claim.Status.Phase == kaironv1.ClaimBound {
		bound = claim.Status.MachineName
	}
	var errs []error
	for _, m := range labelled {
		if m.Name == bound {
			errs = append(errs, r.reclaim(ctx, claim, m))
		}
	}
	errs = append(errs, r.handBackStrays(ctx, claim, labelled, bound))
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}

	updated := claim.DeepCopy()
	controllerutil.RemoveFinalizer(updated, kaironv1.FinalizerMachineClaim)
	if err := r.Client.Patch(ctx, updated, client.MergeFromWithOptions(claim, client.MergeFromWithOptimisticLock{})); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	r.tracker.departed(claim.UID)
	return reconcile.Result{}, nil
}

// reclaim applies spec.reclaimPolicy to the claim's Machine.
func (r *MachineClaimReconciler) reclaim(ctx context.Context, claim *kaironv1.MachineClaim, m *kaironv1.Machine) error {
	logger := log.FromContext(ctx).WithValues("machine", klog.KObj(m))
	if claim.Spec.ReclaimPolicy == kaironv1.ReclaimRetain {
		if err := r.retain(ctx, claim, m.Name); err != nil {
			return fmt.Errorf("keeping machine %s: %w", m.Name, err)
		}
		logger.Info("Released machine, kept as a plain Machine (reclaimPolicy Retain)")
		r.Recorder.Eventf(claim, m, corev1.EventTypeNormal, kaironv1.EventReasonReleased, "Release",
			"Kept machine %s as a plain Machine (reclaimPolicy Retain)", m.Name)
		return nil
	}
	err := r.Client.Delete(ctx, m, client.Preconditions{UID: ptr.To(m.UID)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting machine %s: %w", m.Name, err)
	}
	logger.Info("Released machine, deleted it (reclaimPolicy Delete)")
	r.Recorder.Eventf(claim, m, corev1.EventTypeNormal, kaironv1.EventReasonReleased, "Release", "Deleted machine %s (reclaimPolicy Delete)", m.Name)
	return nil
}

// retain turns the claim's Machine into a plain Machine: without the pool
// and claim labels and without the claim as owner, so that neither the
// pool nor the garbage collector touches it again. The claim's spec.labels
// stay; the user asked for them.
func (r *MachineClaimReconciler) retain(ctx context.Context, claim *kaironv1.MachineClaim, name string) error {
	for range 5 {
		var m kaironv1.Machine
		if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: name}, &m); err != nil {
			return client.IgnoreNotFound(err)
		}
		plain := m.DeepCopy()
		for _, k := range []string{kaironv1.LabelMachinePool, kaironv1.LabelMachinePoolTemplateHash, kaironv1.LabelPoolState, kaironv1.LabelMachineClaim} {
			delete(plain.Labels, k)
		}
		delete(plain.Annotations, kaironv1.AnnotationRecordingBindOf)
		plain.OwnerReferences = nil
		for _, ref := range m.OwnerReferences {
			if ref.UID != claim.UID {
				plain.OwnerReferences = append(plain.OwnerReferences, ref)
			}
		}
		err := r.Client.Patch(ctx, plain, client.MergeFromWithOptions(&m, client.MergeFromWithOptimisticLock{}))
		if !apierrors.IsConflict(err) {
			return client.IgnoreNotFound(err)
		}
	}
	return errors.New("the machine kept changing")
}
