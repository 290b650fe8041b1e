package controller

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules"
)

// SnapshotScheduleReconciler runs SnapshotSchedules: at each slot of
// spec.schedule it creates a MachineSnapshot of every matching Machine that
// is Running, and it deletes the schedule's snapshots beyond spec.retention
// per Machine (rules.SnapshotsToPrune). A suspended schedule creates none.
// Slots missed while the controller was down are not made up, except the
// latest one (rules.ScheduleDue), as a CronJob does.
type SnapshotScheduleReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Interval is how often a schedule is looked at without any event, at
	// most; it is also looked at when its next slot comes.
	Interval time.Duration
	// Now is the clock; nil is time.Now. Tests move it.
	Now func() time.Time
}

func (r *SnapshotScheduleReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

// SetupWithManager registers the reconciler with mgr.
func (r *SnapshotScheduleReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		Named("snapshotschedule").
		For(&kaironv1.SnapshotSchedule{}).
		// Its snapshots becoming Ready (retention) or going.
		Watches(&kaironv1.MachineSnapshot{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			name := o.GetLabels()[kaironv1.LabelSnapshotSchedule]
			if name == "" {
				return nil
			}
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: name}}}
		}), builder.WithPredicates(snapshotPhaseChanged())).
		// Machines coming and going change the count of matching ones.
		Watches(&kaironv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.schedulesOfNamespace),
			builder.WithPredicates(machinePlacementChanged())).
		Complete(requeue.UntilStopped(r))
}

// schedulesOfNamespace are the requests for every schedule in o's namespace.
func (r *SnapshotScheduleReconciler) schedulesOfNamespace(ctx context.Context, o client.Object) []reconcile.Request {
	var list kaironv1.SnapshotScheduleList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for _, s := range list.Items {
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: s.Namespace, Name: s.Name}})
	}
	return reqs
}

// Reconcile runs one schedule: its due slot, its retention, its status.
func (r *SnapshotScheduleReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	s := &kaironv1.SnapshotSchedule{}
	if err := r.Client.Get(ctx, req.NamespacedName, s); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !s.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	var machines kaironv1.MachineList
	if err := r.Client.List(ctx, &machines, client.InNamespace(s.Namespace)); err != nil {
		return reconcile.Result{}, err
	}
	var snaps kaironv1.MachineSnapshotList
	if err := r.Client.List(ctx, &snaps, client.InNamespace(s.Namespace), client.MatchingLabels{kaironv1.LabelSnapshotSchedule: s.Name}); err != nil {
		return reconcile.Result{}, err
	}
	now := r.now()
	base := s.DeepCopy()
	var errs []error
	schedule, parseErr := rules.ParseSnapshotSchedule(s.Spec.Schedule)
	if parseErr == nil && !s.Spec.Suspend {
		if due, _ := rules.ScheduleDue(schedule, rules.ScheduleLastRun(s), now); !due.IsZero() {
			created, err := r.run(ctx, s, machines.Items, due)
			if err != nil {
				errs = append(errs, err)
			} else {
				at := metav1.NewTime(due)
				s.Status.LastScheduleTime = &at
				if len(created) > 0 {
					r.Recorder.Eventf(s, nil, corev1.EventTypeNormal, kaironv1.ScheduleReasonSnapshotsCreated, "Snapshot",
						"run of %s: created %d MachineSnapshots: %s", due.UTC().Format(time.RFC3339), len(created), strings.Join(created, ", "))
				}
				// The new snapshots are in no list yet: read them again.
				if err := r.Client.List(ctx, &snaps, client.InNamespace(s.Namespace), client.MatchingLabels{kaironv1.LabelSnapshotSchedule: s.Name}); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	pruned, err := r.prune(ctx, s, snaps.Items)
	if err != nil {
		errs = append(errs, err)
	}
	if len(pruned) > 0 {
		r.Recorder.Eventf(s, nil, corev1.EventTypeNormal, kaironv1.ScheduleReasonSnapshotsPruned, "Prune",
			"deleted %d MachineSnapshots beyond spec.retention %d per Machine: %s", len(pruned), rules.ScheduleRetention(s), strings.Join(pruned, ", "))
	}

	state := rules.ComputeScheduleState(s, machines.Items, snaps.Items, now)
	r.setStatus(s, state, len(snaps.Items)-len(pruned))
	if err := patch.Status(ctx, r.Client, base, s, patch.WithOptimisticLock(), patch.IgnoreNotFound()); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: time.Second}, nil
		}
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: r.requeueAfter(state, now)}, nil
}

// requeueAfter is when to look at the schedule again: at its next slot,
// or after Interval, whichever is sooner.
func (r *SnapshotScheduleReconciler) requeueAfter(state *rules.ScheduleState, now time.Time) time.Duration {
	wait := r.Interval
	if wait <= 0 {
		wait = DefaultInterval
	}
	if !state.Next.IsZero() {
		// A little after the slot, so the clock has passed it.
		wait = min(wait, state.Next.Sub(now)+100*time.Millisecond)
	}
	return max(wait, 100*time.Millisecond)
}

// run creates the snapshots of slot due for the matching Running Machines
// and returns their names. The names are per Machine and slot, so a run
// retried after a failure creates only those still missing.
func (r *SnapshotScheduleReconciler) run(ctx context.Context, s *kaironv1.SnapshotSchedule, machines []kaironv1.Machine, due time.Time) ([]string, error) {
	var created []string
	var errs []error
	for i := range machines {
		m := &machines[i]
		if !rules.ScheduleMatches(s, m) || m.Status.Phase != kaironv1.MachineRunning {
			continue
		}
		snap := &kaironv1.MachineSnapshot{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: s.Namespace,
				Name:      rules.ScheduledSnapshotName(s.Name, m.Name, due),
				Labels: map[string]string{
					kaironv1.LabelSnapshotSchedule: s.Name,
					kaironv1.LabelSnapshotMachine:  m.Name,
				},
			},
			Spec: kaironv1.MachineSnapshotSpec{MachineName: m.Name},
		}
		switch err := r.Client.Create(ctx, snap); {
		case apierrors.IsAlreadyExists(err):
		case err != nil:
			errs = append(errs, fmt.Errorf("creating MachineSnapshot %s: %w", snap.Name, err))
		default:
			created = append(created, snap.Name)
		}
	}
	if len(created) > 0 {
		log.FromContext(ctx).Info("snapshot schedule ran", "slot", due, "created", created)
	}
	return created, errors.Join(errs...)
}

// prune deletes the schedule's snapshots its retention does not keep and
// returns their names.
func (r *SnapshotScheduleReconciler) prune(ctx context.Context, s *kaironv1.SnapshotSchedule, snaps []kaironv1.MachineSnapshot) ([]string, error) {
	byMachine := rules.ScheduleSnapshots(s, snaps)
	machineNames := make([]string, 0, len(byMachine))
	for name := range byMachine {
		machineNames = append(machineNames, name)
	}
	sort.Strings(machineNames)
	var pruned []string
	var errs []error
	for _, name := range machineNames {
		for _, snap := range rules.SnapshotsToPrune(byMachine[name], rules.ScheduleRetention(s)) {
			err := r.Client.Delete(ctx, snap, client.Preconditions{UID: &snap.UID})
			if client.IgnoreNotFound(err) != nil {
				errs = append(errs, fmt.Errorf("deleting MachineSnapshot %s: %w", snap.Name, err))
				continue
			}
			pruned = append(pruned, snap.Name)
		}
	}
	return pruned, errors.Join(errs...)
}

// setStatus writes state into s's status; kept is how many snapshots the
// schedule holds after pruning.
func (r *SnapshotScheduleReconciler) setStatus(s *kaironv1.SnapshotSchedule, state *rules.ScheduleState, kept int) {
	s.Status.MatchingMachines = int32(len(state.Receipts))
	s.Status.Snapshots = int32(kept)
	s.Status.ObservedGeneration = s.Generation
	s.Status.NextScheduleTime = nil
	if !state.Next.IsZero() {
		next := metav1.NewTime(state.Next)
		s.Status.NextScheduleTime = &next
	}
	cond := metav1.Condition{Type: kaironv1.ConditionReady.String(), ObservedGeneration: s.Generation}
	switch {
	case state.Err != nil:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, kaironv1.ScheduleReasonInvalidSchedule, state.Err.Error()
	case s.Spec.Suspend:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, kaironv1.ScheduleReasonSuspended, "spec.suspend is true: no snapshots are taken"
	default:
		cond.Status, cond.Reason = metav1.ConditionTrue, kaironv1.ScheduleReasonScheduled
		cond.Message = "next run " + state.Next.UTC().Format(time.RFC3339)
	}
	meta.SetStatusCondition(&s.Status.Conditions, cond)
}
