package controller

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/rules"
)

// budgetPassKey is the only request the budget reconciler's queue holds:
// rules.LoadBudgetStates reads the whole cluster at once, so every event asks for
// one pass over all budgets and the workqueue folds bursts into one.
var budgetPassKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "disruption-budget-pass"}}

// MachineDisruptionBudgetReconciler keeps every budget's status and the
// kairon_disruption_budget_status gauge up to date. It only observes: the
// decisions (evacuate, the webhook, cordon evacuation) recompute their
// numbers with rules.LoadBudgetStates when they decide.
type MachineDisruptionBudgetReconciler struct {
	// Client reads from the manager's cache, which must see every
	// namespace whose Machines budgets should count, and writes statuses.
	Client client.Client
	// Interval is how often a pass runs without any event.
	Interval time.Duration

	mu sync.Mutex
	// recorded are the budgets this reconciler has gauge series for, so
	// it deletes the series of budgets that disappeared (and only its own).
	recorded map[types.NamespacedName]bool
}

// SetupWithManager registers the reconciler with mgr.
func (r *MachineDisruptionBudgetReconciler) SetupWithManager(mgr manager.Manager) error {
	return singlePass(mgr, "machinedisruptionbudget", budgetPassKey, r, func(b *builder.Builder, enqueuePass handler.EventHandler) *builder.Builder {
		return b.
			Watches(&kaironv1.MachineDisruptionBudget{}, enqueuePass, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
			Watches(&kaironv1.Machine{}, enqueuePass, builder.WithPredicates(machineBudgetHealthChanged())).
			Watches(&kaironv1.MachineMigration{}, enqueuePass, builder.WithPredicates(migrationPhaseChanged()))
	})
}

// machineBudgetHealthChanged passes Machine events that can change a
// budget's numbers: creation, deletion, label and phase changes.
func machineBudgetHealthChanged() predicate.Funcs {
	return updatesThat(func(old, cur *kaironv1.Machine) bool {
		return old.Status.Phase != cur.Status.Phase || !equality.Semantic.DeepEqual(old.Labels, cur.Labels) ||
			rules.MachineNodeReachable(old) != rules.MachineNodeReachable(cur)
	})
}

// migrationPhaseChanged passes MachineMigration creation, deletion and
// phase changes: a migration stops counting once it is terminal.
func migrationPhaseChanged() predicate.Funcs {
	return updatesThat(func(old, cur *kaironv1.MachineMigration) bool { return old.Status.Phase != cur.Status.Phase })
}

// Reconcile runs one pass: it evaluates every budget, patches the statuses
// that changed and sets the gauge from what the object then says. A failed
// patch is logged and tried again on the next tick; until then the gauge
// keeps reporting the status the object still has, never the numbers that
// failed to reach it.
func (r *MachineDisruptionBudgetReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	states, err := rules.LoadBudgetStates(ctx, r.Client)
	if err != nil {
		return reconcile.Result{}, err
	}
	seen := make(map[types.NamespacedName]bool, len(states))
	for i := range states {
		s := &states[i]
		key := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
		b := s.Budget
		if b.DeletionTimestamp != nil {
			seen[key] = recordBudgetStatus(key, &b.Status)
			continue
		}
		desired := b.DeepCopy()
		setBudgetStatus(&desired.Status, s)
		if equality.Semantic.DeepEqual(b.Status, desired.Status) {
			seen[key] = recordBudgetStatus(key, &b.Status)
			continue
		}
		// Last writer wins: the counts are recomputed every tick. The
		// reconciler owns the whole status, so all of it is sent: a diff
		// would leave out a count that stays 0 (disruptionsAllowed of an
		// exhausted budget), and the object would never show it.
		if err := patch.Status(ctx, r.Client, b, desired, patch.WholeStatus()); err != nil {
			if !apierrors.IsNotFound(err) {
				logger.Error(err, "Patching disruption budget status; trying again next tick", "budget", klog.KObj(b))
			}
			seen[key] = recordBudgetStatus(key, &b.Status)
			continue
		}
		// desired now holds the object as the API server returned it.
		seen[key] = recordBudgetStatus(key, &desired.Status)
		logger.V(1).Info("Updated disruption budget status", "budget", klog.KObj(b),
			"expected", s.ExpectedMachines, "healthy", s.CurrentHealthy, "desired", s.DesiredHealthy, "allowed", s.DisruptionsAllowed)
	}
	r.forgetDeleted(seen)
	return reconcile.Result{RequeueAfter: r.Interval}, nil
}

// setBudgetStatus writes s into status, with a Ready condition that is
// False for an invalid budget.
func setBudgetStatus(status *kaironv1.MachineDisruptionBudgetStatus, s *rules.BudgetState) {
	status.ExpectedMachines = s.ExpectedMachines
	status.CurrentHealthy = s.CurrentHealthy
	status.DesiredHealthy = s.DesiredHealthy
	status.DisruptionsAllowed = s.DisruptionsAllowed
	status.ObservedGeneration = s.Generation
	cond := metav1.Condition{
		Type:               kaironv1.ConditionReady.String(),
		Status:             metav1.ConditionTrue,
		Reason:             kaironv1.BudgetReasonStatusComputed,
		Message:            rules.BudgetSummary(s),
		ObservedGeneration: s.Generation,
	}
	if s.Err != nil {
		cond.Status = metav1.ConditionFalse
		cond.Reason = kaironv1.BudgetReasonInvalid
		cond.Message = s.Err.Error() + "; until fixed, the budget blocks every disruption of the Machines it matches"
	}
	meta.SetStatusCondition(&status.Conditions, cond)
}

// recordBudgetStatus sets the gauge series of one budget to status, the
// status its object has, and reports whether it did. A budget whose status
// was never written (it has no Ready condition yet) has no series: its
// object shows no numbers either.
func recordBudgetStatus(key types.NamespacedName, status *kaironv1.MachineDisruptionBudgetStatus) bool {
	if meta.FindStatusCondition(status.Conditions, kaironv1.ConditionReady.String()) == nil {
		DisruptionBudgetStatus.DeletePartialMatch(prometheus.Labels{"namespace": key.Namespace, "budget": key.Name})
		return false
	}
	for field, v := range map[string]int32{
		BudgetFieldExpectedMachines:   status.ExpectedMachines,
		BudgetFieldCurrentHealthy:     status.CurrentHealthy,
		BudgetFieldDesiredHealthy:     status.DesiredHealthy,
		BudgetFieldDisruptionsAllowed: status.DisruptionsAllowed,
	} {
		DisruptionBudgetStatus.WithLabelValues(key.Namespace, key.Name, field).Set(float64(v))
	}
	return true
}

// forgetDeleted deletes the gauge series of budgets this reconciler
// recorded before but did not see in this pass.
func (r *MachineDisruptionBudgetReconciler) forgetDeleted(seen map[types.NamespacedName]bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for key := range r.recorded {
		if !seen[key] {
			DisruptionBudgetStatus.DeletePartialMatch(prometheus.Labels{"namespace": key.Namespace, "budget": key.Name})
		}
	}
	r.recorded = seen
}
