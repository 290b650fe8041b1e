package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
)

// MachineSnapshotReconciler hands each Pending MachineSnapshot to the node
// that runs its Machine (status.node), whose agent takes it
// (internal/node/machine_snapshot.go), and labels the snapshot with its
// Machine's name. The node agent alone writes the rest of the status; the
// node confinement policy lets an agent write only the snapshots handed
// to it. It also counts finished snapshots in the metrics.
type MachineSnapshotReconciler struct {
	Client client.Client

	ends snapshotEnds
}

// SetupWithManager registers the reconciler with mgr.
func (r *MachineSnapshotReconciler) SetupWithManager(mgr ctrl.Manager) error {
	r.ends.since = time.Now()
	return ctrl.NewControllerManagedBy(mgr).
		Named("machinesnapshot").
		For(&kaironv1.MachineSnapshot{}).
		// A Machine that starts running, moves or goes: its Pending
		// snapshots are handed (again).
		Watches(&kaironv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.snapshotsOfMachine),
			builder.WithPredicates(machinePlacementChanged())).
		Complete(requeue.UntilStopped(r))
}

// snapshotsOfMachine are the requests for the snapshots of a Machine.
func (r *MachineSnapshotReconciler) snapshotsOfMachine(ctx context.Context, o client.Object) []reconcile.Request {
	var list kaironv1.MachineSnapshotList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace()), client.MatchingLabels{kaironv1.LabelSnapshotMachine: o.GetName()}); err != nil {
		return nil
	}
	var reqs []reconcile.Request
	for _, s := range list.Items {
		if s.Status.Phase == "" || s.Status.Phase == kaironv1.SnapshotPending {
			reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Name}})
		}
	}
	return reqs
}

// Reconcile labels and hands one snapshot.
func (r *MachineSnapshotReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	snap := &kaironv1.MachineSnapshot{}
	if err := r.Client.Get(ctx, req.NamespacedName, snap); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if snap.Labels[kaironv1.LabelSnapshotMachine] != snap.Spec.MachineName {
		base := snap.DeepCopy()
		if snap.Labels == nil {
			snap.Labels = map[string]string{}
		}
		snap.Labels[kaironv1.LabelSnapshotMachine] = snap.Spec.MachineName
		if err := r.Client.Patch(ctx, snap, client.MergeFrom(base)); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	switch snap.Status.Phase {
	case kaironv1.SnapshotReady, kaironv1.SnapshotFailed:
		r.ends.record(snap)
		return reconcile.Result{}, nil
	}
	if !snap.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	machine := &kaironv1.Machine{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: snap.Namespace, Name: snap.Spec.MachineName}, machine)
	if client.IgnoreNotFound(err) != nil {
		return reconcile.Result{}, err
	}
	node, message := "", ""
	switch {
	case err != nil:
		message = fmt.Sprintf("Machine %s not found; the snapshot is taken once it exists and runs", snap.Spec.MachineName)
	case !machine.DeletionTimestamp.IsZero():
		message = fmt.Sprintf("Machine %s is being deleted", machine.Name)
	case machine.Spec.NodeName == "" || machine.Status.Phase != kaironv1.MachineRunning:
		phase := machine.Status.Phase
		if phase == "" {
			phase = kaironv1.MachinePending
		}
		message = fmt.Sprintf("Machine %s is %s; the snapshot is taken once it runs", machine.Name, phase)
	default:
		node = machine.Spec.NodeName
		message = fmt.Sprintf("node %s is taking it", node)
	}
	base := snap.DeepCopy()
	snap.Status.Phase = kaironv1.SnapshotPending
	snap.Status.Node = node
	snap.Status.Message = message
	meta.SetStatusCondition(&snap.Status.Conditions, metav1.Condition{
		Type: kaironv1.ConditionReady.String(), Status: metav1.ConditionFalse,
		Reason: kaironv1.SnapshotReasonWaitingForMachine, Message: message, ObservedGeneration: snap.Generation,
	})
	// Locked: the node agent writes the same status once it took it.
	err = patch.Status(ctx, r.Client, base, snap, patch.WithOptimisticLock(), patch.IgnoreNotFound())
	if apierrors.IsConflict(err) {
		// The agent took it meanwhile, or the cache is behind a write of
		// ours: look again with the fresh object.
		return reconcile.Result{RequeueAfter: time.Second}, nil
	}
	return reconcile.Result{}, err
}

// snapshotEnds counts each snapshot's end once in the metrics. Only
// snapshots that ended after since count: a restarted controller would
// otherwise count every one still in the cluster again.
// maxSnapshotEndsSeen bounds what snapshotEnds remembers.
const maxSnapshotEndsSeen = 100000

type snapshotEnds struct {
	since time.Time
	mu    sync.Mutex
	seen  map[types.UID]bool
}

func (e *snapshotEnds) record(snap *kaironv1.MachineSnapshot) {
	ended := snap.CreationTimestamp.Time
	if snap.Status.TakenAt != nil {
		ended = snap.Status.TakenAt.Time
	}
	if ended.Before(e.since.Truncate(time.Second)) {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.seen[snap.UID] {
		return
	}
	if e.seen == nil || len(e.seen) >= maxSnapshotEndsSeen {
		// Forget them all, and with them every end before now.
		e.seen = map[types.UID]bool{}
		e.since = time.Now()
	}
	e.seen[snap.UID] = true
	machineSnapshots.WithLabelValues(string(snap.Status.Phase)).Inc()
	if snap.Status.Phase == kaironv1.SnapshotReady {
		machineSnapshotPause.Observe(float64(snap.Status.PauseMillis) / 1000)
		machineSnapshotSize.Observe(float64(snap.Status.SizeBytes))
	}
}
