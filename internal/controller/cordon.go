package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/ops"
	"github.com/zyvor/kairon/internal/rules"
)

// DefaultCordonEvacuateMinRetryInterval is how long cordon evacuation waits
// before it tries a Machine again.
const DefaultCordonEvacuateMinRetryInterval = 2 * time.Minute

// Values of -cordon-evacuate-strategy.
const (
	CordonEvacuateCold = "cold"
	CordonEvacuateAuto = "auto"
)

// CordonEvacuationStrategy turns a -cordon-evacuate-strategy value into the
// strategy of the migrations cordon evacuation creates. Empty means cold.
// auto is rules.StrategyAuto: each migration is live when the Machine and
// both nodes can migrate live, cold otherwise
// (rules.ChooseEvacuationStrategy), and says which and why in its
// StrategyChosen condition. live is refused: live for every Machine,
// whether or not its nodes can, would fail where auto falls back to cold,
// and cordon evacuation does not insist on live on its own.
func CordonEvacuationStrategy(s string) (kaironv1.MigrationStrategy, error) {
	switch s {
	case "", CordonEvacuateCold:
		return kaironv1.MigrationCold, nil
	case CordonEvacuateAuto:
		return rules.StrategyAuto, nil
	case string(kaironv1.MigrationLive):
		return "", errors.New(`-cordon-evacuate-strategy "live" is not allowed: cordon evacuation never insists on live migrations; use auto (live where the Machine and both nodes can, cold otherwise) or cold, or move Machines live yourself with kaironctl evacuate NODE --strategy live`)
	}
	return "", fmt.Errorf("-cordon-evacuate-strategy %q is not valid; use cold or auto", s)
}

// cordonPassKey is the only request the cordon evacuation queue holds:
// budgets span nodes, so one pass decides for every cordoned node at once,
// spending allowances across all of them, and passes never overlap.
var cordonPassKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "cordon-evacuation-pass"}}

// attemptStampPrecision is the resolution of the attempted-at annotation
// (RFC 3339 in whole seconds). The recorded time may be up to this much
// earlier than the attempt, so a retry waits this much longer to be sure
// a Machine is never tried twice within the interval.
const attemptStampPrecision = time.Second

// CordonEvacuationReconciler moves the Machines off cordoned Kairon nodes
// (spec.unschedulable true): each one gets the MachineMigration `kaironctl
// evacuate` would create for it, within the MachineDisruptionBudgets
// (rules.PlanEvacuation decides). Every attempt, created or blocked, is stamped on
// the Machine in the AnnotationCordonEvacuateAttemptedAt annotation, and a
// Machine is not tried again before MinRetryInterval has passed since. A
// Machine that already has a non-terminal migration is never given another.
type CordonEvacuationReconciler struct {
	// Client reads Nodes from the manager's cache, and writes.
	Client client.Client
	// APIReader reads Machines, migrations and budgets from the API
	// server for each decision, so a pass always sees the migrations the
	// previous one created.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Strategy is cold, the migrations' spec.strategy, or
	// rules.StrategyAuto, which chooses per Machine; see
	// CordonEvacuationStrategy. It is never live.
	Strategy kaironv1.MigrationStrategy
	// MinRetryInterval is the least time between two attempts at one Machine.
	MinRetryInterval time.Duration
	// Interval is how often a pass runs without any event.
	Interval time.Duration

	now func() time.Time
}

// SetupWithManager registers the reconciler with mgr.
func (r *CordonEvacuationReconciler) SetupWithManager(mgr manager.Manager) error {
	if r.Strategy == kaironv1.MigrationLive {
		return errors.New("cordon evacuation never insists on live migrations: use strategy auto (live where possible) or cold")
	}
	if err := IndexPodsByNode(mgr); err != nil {
		return err
	}
	if r.Strategy == "" {
		r.Strategy = kaironv1.MigrationCold
	}
	if r.MinRetryInterval <= 0 {
		r.MinRetryInterval = DefaultCordonEvacuateMinRetryInterval
	}
	if r.now == nil {
		r.now = time.Now
	}
	return singlePass(mgr, "cordonevacuation", cordonPassKey, r, func(b *builder.Builder, enqueuePass handler.EventHandler) *builder.Builder {
		return b.
			Watches(&corev1.Node{}, enqueuePass, builder.WithPredicates(nodeCordonChanged())).
			// A migration that ends frees its budget, or (Failed) leaves its
			// Machine to be tried again. Machines are deliberately not
			// watched: their status changes all the time, each pass reads
			// every Machine from the API server, and the Machines of a
			// cordoned node were all tried by the first pass; the rest waits
			// for the retry interval or the tick anyway.
			Watches(&kaironv1.MachineMigration{}, enqueuePass, builder.WithPredicates(migrationPhaseChanged())).
			Watches(&kaironv1.MachineDisruptionBudget{}, enqueuePass, builder.WithPredicates(predicate.GenerationChangedPredicate{}))
	})
}

// nodeCordonChanged passes Kairon nodes that are created cordoned or whose
// spec.unschedulable changes.
func nodeCordonChanged() predicate.Funcs {
	cordoned := func(o client.Object) bool {
		n, ok := o.(*corev1.Node)
		return ok && n.Spec.Unschedulable
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return rules.IsKaironNode(e.Object) && cordoned(e.Object) },
		DeleteFunc:  func(event.DeleteEvent) bool { return false },
		GenericFunc: func(e event.GenericEvent) bool { return rules.IsKaironNode(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			if !rules.IsKaironNode(e.ObjectNew) {
				return false
			}
			return cordoned(e.ObjectOld) != cordoned(e.ObjectNew) || !rules.IsKaironNode(e.ObjectOld)
		},
	}
}

// Reconcile runs one pass over every cordoned Kairon node.
func (r *CordonEvacuationReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	logger := log.FromContext(ctx)
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.HasLabels{kaironv1.LabelNode}); err != nil {
		return reconcile.Result{}, fmt.Errorf("listing nodes: %w", err)
	}
	var cordoned []string
	for i := range nodes.Items {
		if n := &nodes.Items[i]; n.Spec.Unschedulable && n.DeletionTimestamp == nil {
			cordoned = append(cordoned, n.Name)
		}
	}
	if len(cordoned) == 0 {
		return reconcile.Result{RequeueAfter: r.Interval}, nil
	}
	sort.Strings(cordoned)

	snap, err := rules.LoadEvacuationSnapshot(ctx, r.APIReader)
	if err != nil {
		return reconcile.Result{}, err
	}
	now := r.now()
	next := now.Add(r.Interval) // when the next pass is due
	// The Machines to try now, each with its node, and in node order.
	var candidates []*kaironv1.Machine
	nodeOf := map[*kaironv1.Machine]string{}
	for _, node := range cordoned {
		for _, m := range snap.MachinesOn(node) {
			if retryAt, throttled := r.retryAt(m, now); throttled {
				logger.V(1).Info("Cordon evacuation tried this machine recently; waiting", "machine", klog.KObj(m), "node", klog.KRef("", node), "retryAt", retryAt)
				if retryAt.Before(next) {
					next = retryAt
				}
				continue
			}
			candidates = append(candidates, m)
			nodeOf[m] = node
		}
	}

	var placement *evacuationPlacement
	if r.Strategy == rules.StrategyAuto {
		placement = newEvacuationPlacement(nodes.Items, snap)
		if err := chargePods(ctx, r.Client, placement.byName); err != nil {
			return reconcile.Result{}, err
		}
	}
	attempted := false
	for _, d := range snap.Plan(candidates) {
		m, node := d.Machine, nodeOf[d.Machine]
		switch d.Verdict {
		case rules.EvacuationDeleting:
			continue
		case rules.EvacuationInFlight:
			logger.V(1).Info("Machine is already being migrated", "machine", klog.KObj(m), "node", klog.KRef("", node), "migration", klog.KObj(d.Migration))
			continue
		case rules.EvacuationBlocked:
			attempted = true
			message := fmt.Sprintf("Node %s is cordoned, but the machine was not migrated: %s; trying again in %s", node, d.Reason, r.MinRetryInterval)
			logger.Info("Cordon evacuation blocked by disruption budget", "machine", klog.KObj(m), "node", klog.KRef("", node), "reason", d.Reason)
			r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, kaironv1.EventReasonEvacuationBlocked, "Evacuate", "%s", message)
		case rules.EvacuationMigrate:
			attempted = true
			r.migrate(ctx, m, node, placement)
		}
		r.stampAttempt(ctx, m, now)
	}
	if attempted {
		if retry := now.Add(r.MinRetryInterval + attemptStampPrecision); retry.Before(next) {
			next = retry
		}
	}
	return reconcile.Result{RequeueAfter: max(next.Sub(r.now()), time.Second)}, nil
}

// evacuationPlacement is what strategy auto chooses with within one pass:
// the Kairon nodes, charged with the Machines on them and moving to them,
// and with each target this pass already chose.
type evacuationPlacement struct {
	byName map[string]*rules.NodeInfo
	nodes  []*rules.NodeInfo
}

func newEvacuationPlacement(nodes []corev1.Node, snap *rules.EvacuationSnapshot) *evacuationPlacement {
	p := &evacuationPlacement{byName: map[string]*rules.NodeInfo{}}
	for i := range nodes {
		n := rules.NewNodeInfo(&nodes[i])
		p.byName[n.Node.Name] = n
		p.nodes = append(p.nodes, n)
	}
	machines := make([]*kaironv1.Machine, len(snap.Machines))
	for i := range snap.Machines {
		machines[i] = &snap.Machines[i]
	}
	rules.ChargeNodes(p.byName, machines, snap.Migrations)
	return p
}

// choose is auto's choice for m off node; the node it chose, live or
// not yet (a cold migration's target is the migration controller's pick,
// most likely the same node), is charged with m for the rest of the pass.
func (p *evacuationPlacement) choose(m *kaironv1.Machine, node string) rules.StrategyChoice {
	var source *corev1.Node
	var candidates []*rules.NodeInfo
	for _, n := range p.nodes {
		if n.Node.Name == node {
			source = n.Node
		} else {
			candidates = append(candidates, n)
		}
	}
	choice := rules.ChooseEvacuationStrategy(m, source, candidates)
	if n := p.byName[choice.TargetNode]; n != nil {
		n.Requested = n.Requested.Add(rules.MachineResources(m))
	}
	return choice
}

// migrate creates m's migration off node, and says how it went in an
// event. A refusal (by the MachineMigration webhook, which may have seen a
// budget spent by someone else since the pass read the cluster) counts as
// a blocked attempt. With strategy auto, placement chooses live or cold.
func (r *CordonEvacuationReconciler) migrate(ctx context.Context, m *kaironv1.Machine, node string, placement *evacuationPlacement) {
	logger := log.FromContext(ctx).WithValues("machine", klog.KObj(m), "node", klog.KRef("", node))
	mig := rules.NewEvacuationMigration(m, node, r.Strategy)
	chose := ""
	if placement != nil {
		choice := placement.choose(m, node)
		rules.ApplyStrategyChoice(mig, choice)
		chose = "; strategy auto chose " + choice.Message
	}
	err := r.Client.Create(ctx, mig)
	switch {
	case err == nil:
		logger.Info("Created evacuation migration", "migration", klog.KObj(mig), "strategy", mig.Spec.Strategy, "target", mig.Spec.TargetNode,
			"why", mig.Annotations[kaironv1.AnnotationMigrationStrategyMessage])
		r.Recorder.Eventf(m, mig, corev1.EventTypeNormal, kaironv1.EventReasonEvacuationMigrationCreated, "Evacuate",
			"Node %s is cordoned: created MachineMigration %s (%s) to move the machine off it%s", node, mig.Name, mig.Spec.Strategy, chose)
	case ops.IsMigrationRefusal(err):
		logger.Info("Evacuation migration refused by admission", "reason", err.Error())
		r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, kaironv1.EventReasonEvacuationBlocked, "Evacuate",
			"Node %s is cordoned, but creating the machine's migration was refused: %v; trying again in %s", node, err, r.MinRetryInterval)
	default:
		logger.Error(err, "Creating evacuation migration")
		r.Recorder.Eventf(m, nil, corev1.EventTypeWarning, kaironv1.EventReasonEvacuationFailed, "Evacuate",
			"Node %s is cordoned, but creating the machine's migration failed: %v; trying again in %s", node, err, r.MinRetryInterval)
	}
}

// retryAt is when m may be tried again, and whether that is still to come.
// A missing or unreadable annotation means now.
func (r *CordonEvacuationReconciler) retryAt(m *kaironv1.Machine, now time.Time) (time.Time, bool) {
	stamp, ok := m.Annotations[kaironv1.AnnotationCordonEvacuateAttemptedAt]
	if !ok {
		return now, false
	}
	at, err := time.Parse(time.RFC3339, stamp)
	if err != nil {
		return now, false
	}
	retry := at.Add(r.MinRetryInterval + attemptStampPrecision)
	return retry, now.Before(retry)
}

// stampAttempt records the attempt at m in its annotation. A Machine gone
// meanwhile needs none; a failed write is logged, and the Machine may then
// be tried again on the next pass.
func (r *CordonEvacuationReconciler) stampAttempt(ctx context.Context, m *kaironv1.Machine, at time.Time) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		kaironv1.AnnotationCordonEvacuateAttemptedAt: at.UTC().Format(time.RFC3339),
	}}})
	if err != nil {
		return
	}
	if err := r.Client.Patch(ctx, m.DeepCopy(), client.RawPatch(types.MergePatchType, patch)); err != nil && !apierrors.IsNotFound(err) {
		log.FromContext(ctx).Error(err, "Recording the cordon evacuation attempt", "machine", klog.KObj(m))
	}
}
