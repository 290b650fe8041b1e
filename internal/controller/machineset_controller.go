package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
)

var machineSetKind = kaironv1.GroupVersion.WithKind("MachineSet")

// MachineSetReconciler keeps spec.replicas Machines for every MachineSet.
type MachineSetReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	Interval time.Duration

	expectations *replicaExpectations
	failures     *failureBackoff
}

// SetupWithManager registers the reconciler with mgr.
func (r *MachineSetReconciler) SetupWithManager(mgr manager.Manager) error {
	if r.expectations == nil {
		r.expectations = newReplicaExpectations()
	}
	if r.failures == nil {
		r.failures = newFailureBackoff()
	}
	return builder.ControllerManagedBy(mgr).
		For(&kaironv1.MachineSet{}).
		Watches(&kaironv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.machineSetsOfMachine)).
		Complete(requeue.UntilStopped(r))
}

// machineSetsOfMachine maps a Machine to its controlling MachineSet or, for
// an orphan, to every set in its namespace that selects it and could adopt it.
func (r *MachineSetReconciler) machineSetsOfMachine(ctx context.Context, o client.Object) []reconcile.Request {
	if ref := metav1.GetControllerOf(o); ref != nil {
		if ref.Kind != machineSetKind.Kind || ref.APIVersion != machineSetKind.GroupVersion().String() {
			return nil
		}
		return []reconcile.Request{{NamespacedName: client.ObjectKey{Namespace: o.GetNamespace(), Name: ref.Name}}}
	}
	var sets kaironv1.MachineSetList
	if err := r.Client.List(ctx, &sets, client.InNamespace(o.GetNamespace())); err != nil {
		log.FromContext(ctx).Error(err, "Listing machine sets that could adopt a machine", "machine", klog.KObj(o))
		return nil
	}
	var requests []reconcile.Request
	for i := range sets.Items {
		selector, err := machineSetSelector(&sets.Items[i])
		if err == nil && selector.Matches(labels.Set(o.GetLabels())) {
			requests = append(requests, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&sets.Items[i])})
		}
	}
	return requests
}

// machineSetSelector refuses an empty selector, which would select, and so
// adopt, every Machine in the namespace, and one that does not select the
// Machines the template makes, which would have the set create Machines
// forever. The API server checks the latter for matchLabels only.
func machineSetSelector(set *kaironv1.MachineSet) (labels.Selector, error) {
	selector, err := metav1.LabelSelectorAsSelector(set.Spec.Selector.LabelSelector())
	if err != nil {
		return nil, err
	}
	if selector.Empty() {
		return nil, errors.New("spec.selector is empty; it would select every Machine in the namespace")
	}
	if !selector.Matches(labels.Set(newMachineForSet(set).Labels)) {
		return nil, errors.New("spec.selector does not select the Machines spec.template makes: it must match spec.template.metadata.labels")
	}
	return selector, nil
}

// Reconcile brings one MachineSet's Machines to spec.replicas.
func (r *MachineSetReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var set kaironv1.MachineSet
	if err := r.Client.Get(ctx, req.NamespacedName, &set); err != nil {
		if apierrors.IsNotFound(err) {
			// The garbage collector deletes the Machines of a deleted set.
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if set.DeletionTimestamp != nil {
		r.expectations.forget(set.UID)
		return reconcile.Result{}, nil
	}

	desired := set.DeepCopy()
	status := &desired.Status
	status.ObservedGeneration = set.Generation
	status.Selector = metav1.FormatLabelSelector(set.Spec.Selector.LabelSelector())

	selector, err := machineSetSelector(&set)
	if err != nil {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: kaironv1.ConditionReady.String(), Status: metav1.ConditionFalse, Reason: kaironv1.SetReasonInvalidSelector,
			Message: err.Error(), ObservedGeneration: set.Generation,
		})
		// Retrying cannot help until the spec changes, which requeues.
		return reconcile.Result{}, patch.Status(ctx, r.Client, &set, desired, patch.WholeStatus(), patch.IgnoreNotFound())
	}

	owned, err := r.claimMachines(ctx, &set, selector)
	if err != nil {
		return reconcile.Result{}, err
	}
	live, createsInFlight := r.expectations.reconcile(set.UID, owned)
	// Failed Machines and those on an unreachable node do not count, and
	// are replaced; only the Failed ones are deleted (replica_health.go).
	live, _, failed := splitByHealth(live)
	failed, held, retryIn := r.failures.heldFailed(set.UID, failed)

	syncErr := r.syncReplicas(ctx, &set, live, createsInFlight+held)
	syncErr = errors.Join(syncErr, deleteFailed(ctx, r.Client, r.Recorder, r.failures, r.expectations, &set, failed))
	setReplicaCounts(status, live)
	setMachineSetConditions(status, &set, syncErr)
	// The set's status is this controller's alone: all of it is written.
	if err := patch.Status(ctx, r.Client, &set, desired, patch.WholeStatus(), patch.IgnoreNotFound()); err != nil {
		return reconcile.Result{}, errors.Join(syncErr, err)
	}
	if syncErr != nil {
		return reconcile.Result{}, syncErr
	}
	if status.ReadyReplicas == ptr.Deref(set.Spec.Replicas, 1) {
		r.failures.healthy(set.UID)
	}
	if retryIn > 0 && retryIn < r.Interval {
		return reconcile.Result{RequeueAfter: retryIn}, nil
	}
	return reconcile.Result{RequeueAfter: r.Interval}, nil
}

// claimMachines returns the set's Machines after adopting the orphans its
// selector matches and releasing the Machines it no longer selects, the way
// a ReplicaSet treats Pods.
func (r *MachineSetReconciler) claimMachines(ctx context.Context, set *kaironv1.MachineSet, selector labels.Selector) ([]*kaironv1.Machine, error) {
	var machines kaironv1.MachineList
	if err := r.Client.List(ctx, &machines, client.InNamespace(set.Namespace)); err != nil {
		return nil, err
	}
	var owned []*kaironv1.Machine
	var errs []error
	for i := range machines.Items {
		m := &machines.Items[i]
		ref := metav1.GetControllerOf(m)
		matches := selector.Matches(labels.Set(m.Labels))
		switch {
		case ref != nil && ref.UID == set.UID && matches:
			owned = append(owned, m)
		case ref != nil && ref.UID == set.UID:
			errs = append(errs, r.release(ctx, set, m))
		case ref == nil && matches && m.DeletionTimestamp == nil:
			if err := r.adopt(ctx, set, m); err != nil {
				errs = append(errs, err)
				continue
			}
			owned = append(owned, m)
		}
	}
	return owned, errors.Join(errs...)
}

func (r *MachineSetReconciler) adopt(ctx context.Context, set *kaironv1.MachineSet, m *kaironv1.Machine) error {
	orig := m.DeepCopy()
	m.OwnerReferences = append(m.OwnerReferences, *metav1.NewControllerRef(set, machineSetKind))
	if err := r.Client.Patch(ctx, m, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return client.IgnoreNotFound(err)
	}
	log.FromContext(ctx).Info("Adopted machine", "machine", klog.KObj(m))
	return nil
}

func (r *MachineSetReconciler) release(ctx context.Context, set *kaironv1.MachineSet, m *kaironv1.Machine) error {
	orig := m.DeepCopy()
	refs := m.OwnerReferences[:0:0]
	for _, ref := range m.OwnerReferences {
		if ref.UID != set.UID {
			refs = append(refs, ref)
		}
	}
	m.OwnerReferences = refs
	if err := r.Client.Patch(ctx, m, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return client.IgnoreNotFound(err)
	}
	log.FromContext(ctx).Info("Released machine that no longer matches the selector", "machine", klog.KObj(m))
	return nil
}

// syncReplicas creates or deletes Machines until live plus those created
// but not yet seen make spec.replicas.
func (r *MachineSetReconciler) syncReplicas(ctx context.Context, set *kaironv1.MachineSet, live []*kaironv1.Machine, createsInFlight int) error {
	diff := int(ptr.Deref(set.Spec.Replicas, 1)) - len(live) - createsInFlight
	switch {
	case diff > 0:
		return r.createMachines(ctx, set, diff)
	case diff < 0 && createsInFlight == 0:
		// Deleting while creations are unconfirmed could delete a Machine
		// and then see the created one arrive, leaving one too few.
		return r.deleteMachines(ctx, set, live, -diff)
	}
	return nil
}

// Creation bursts. A set or pool scaled from 0 to its maximum (1000) must
// not fire a thousand creates at the API server in one go, nor a thousand
// refusals when a quota or the webhook refuses them all.
const (
	// maxCreatesPerSync caps the Machines one reconcile of a set or pool
	// creates; the next reconcile (at once: the creations requeue it)
	// creates more. Like the ReplicaSet controller's burstReplicas.
	maxCreatesPerSync = 100
	// slowStartInitialBatch is the first batch of slowStartBatch.
	slowStartInitialBatch = 1
	// slowStartMaxBatch caps a batch of creates made at the same time.
	slowStartMaxBatch = 16
)

// slowStartBatch calls fn count times, in batches of initial, then twice
// as many, and so on up to slowStartMaxBatch; the calls of one batch run at
// the same time. It stops after the first batch with a failure, so when
// every call would fail (a quota, the webhook) only a few are made. It
// returns how many calls succeeded and the first error, like the ReplicaSet
// controller's slowStartBatch.
func slowStartBatch(count, initial int, fn func() error) (int, error) {
	remaining := count
	successes := 0
	for batch := min(remaining, max(initial, 1)); batch > 0; batch = min(remaining, 2*batch, slowStartMaxBatch) {
		errs := make(chan error, batch)
		var wg sync.WaitGroup
		for range batch {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := fn(); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		successes += batch - len(errs)
		if len(errs) > 0 {
			return successes, <-errs
		}
		remaining -= batch
	}
	return successes, nil
}

// createMachines creates up to maxCreatesPerSync Machines with
// slowStartBatch: it stops after the first batch with a failure, since
// whatever refused one (a quota, the webhook) refuses the rest, and the next
// reconcile tries again.
func (r *MachineSetReconciler) createMachines(ctx context.Context, set *kaironv1.MachineSet, n int) error {
	_, err := slowStartBatch(min(n, maxCreatesPerSync), slowStartInitialBatch, func() error {
		m := newMachineForSet(set)
		if err := r.Client.Create(ctx, m); err != nil {
			r.Recorder.Eventf(set, nil, corev1.EventTypeWarning, kaironv1.ReplicaReasonFailedCreate, "Create", "Creating a machine: %v", err)
			return fmt.Errorf("creating a machine: %w", err)
		}
		r.expectations.created(set.UID, m.Name)
		log.FromContext(ctx).Info("Created machine", "machine", klog.KObj(m))
		r.Recorder.Eventf(set, m, corev1.EventTypeNormal, kaironv1.EventReasonSuccessfulCreate, "Create", "Created machine %s", m.Name)
		return nil
	})
	return err
}

func (r *MachineSetReconciler) deleteMachines(ctx context.Context, set *kaironv1.MachineSet, live []*kaironv1.Machine, n int) error {
	victims := surplusMachines(live, n)
	var errs []error
	for _, m := range victims {
		err := r.Client.Delete(ctx, m, client.Preconditions{UID: ptr.To(m.UID)})
		if err != nil && !apierrors.IsNotFound(err) {
			r.Recorder.Eventf(set, m, corev1.EventTypeWarning, kaironv1.ReplicaReasonFailedDelete, "Delete", "Deleting machine %s: %v", m.Name, err)
			errs = append(errs, fmt.Errorf("deleting machine %s: %w", m.Name, err))
			continue
		}
		r.expectations.deleted(set.UID, m.UID)
		log.FromContext(ctx).Info("Deleted surplus machine", "machine", klog.KObj(m), "phase", m.Status.Phase)
		r.Recorder.Eventf(set, m, corev1.EventTypeNormal, kaironv1.EventReasonSuccessfulDelete, "Delete", "Deleted machine %s", m.Name)
	}
	return errors.Join(errs...)
}

// newMachineForSet builds one Machine from the set's template, named
// <set>-<5 random characters> by the API server.
func newMachineForSet(set *kaironv1.MachineSet) *kaironv1.Machine {
	labels := maps.Clone(set.Spec.Template.Metadata.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[kaironv1.LabelMachineSet] = set.Name
	return &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       set.Namespace,
			GenerateName:    set.Name + "-",
			Labels:          labels,
			Annotations:     maps.Clone(set.Spec.Template.Metadata.Annotations),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(set, machineSetKind)},
		},
		Spec: *set.Spec.Template.Spec.DeepCopy(),
	}
}

// surplusMachines picks the n Machines to delete when scaling down: those
// that do the least yet first, so scaling down never stops a Running
// Machine while one that is still on its way could go instead.
func surplusMachines(live []*kaironv1.Machine, n int) []*kaironv1.Machine {
	ordered := append([]*kaironv1.Machine(nil), live...)
	sort.SliceStable(ordered, func(i, j int) bool {
		a, b := ordered[i], ordered[j]
		if ra, rb := deletionRank(a), deletionRank(b); ra != rb {
			return ra < rb
		}
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return b.CreationTimestamp.Before(&a.CreationTimestamp)
		}
		return a.Name > b.Name
	})
	if n > len(ordered) {
		n = len(ordered)
	}
	return ordered[:n]
}

// deletionRank orders Machines by how little deleting them loses: waiting
// for a node, then on the way up, then stopped or broken, then Running.
func deletionRank(m *kaironv1.Machine) int {
	switch {
	case m.Spec.NodeName == "" || m.Status.Phase == "" || m.Status.Phase == kaironv1.MachinePending:
		return 0
	case m.Status.Phase == kaironv1.MachineScheduled || m.Status.Phase == kaironv1.MachineBooting:
		return 1
	case m.Status.Phase == kaironv1.MachineRunning:
		return 3
	}
	return 2
}

func setReplicaCounts(status *kaironv1.MachineSetStatus, live []*kaironv1.Machine) {
	status.Replicas = int32(len(live))
	status.ReadyReplicas = 0
	for _, m := range live {
		if m.Status.Phase == kaironv1.MachineRunning {
			status.ReadyReplicas++
		}
	}
}

func setMachineSetConditions(status *kaironv1.MachineSetStatus, set *kaironv1.MachineSet, syncErr error) {
	desired := ptr.Deref(set.Spec.Replicas, 1)
	ready := metav1.Condition{
		Type: kaironv1.ConditionReady.String(), Status: metav1.ConditionTrue, Reason: kaironv1.SetReasonAllReplicasReady,
		Message:            fmt.Sprintf("%d/%d machines Running", status.ReadyReplicas, desired),
		ObservedGeneration: set.Generation,
	}
	if status.ReadyReplicas != desired || status.Replicas != desired {
		ready.Status, ready.Reason = metav1.ConditionFalse, kaironv1.SetReasonReplicasNotReady
		if status.Replicas != desired {
			ready.Message = fmt.Sprintf("%d/%d machines Running, %d exist", status.ReadyReplicas, desired, status.Replicas)
		}
	}
	meta.SetStatusCondition(&status.Conditions, ready)
	setReplicaFailure(&status.Conditions, syncErr, status.Replicas, desired, set.Generation)
}
