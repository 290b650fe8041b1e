package controller

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules"
)

// DefaultMigrationTimeout is how long a migration may stay Running before
// it is marked Failed.
const DefaultMigrationTimeout = 5 * time.Minute

// MachineMigrationReconciler drives a MachineMigration's phase. It picks
// the target and the MigrationPolicy (rules.SelectMigrationPolicy), waits
// Pending (reason ParallelLimitReached) while the policy's
// maxParallelMigrations or maxParallelOutboundPerNode are taken by Running
// migrations, then starts the migration (phase Running) with the policy's
// values in status.migrationPolicy, which the source agent applies; the node agents of
// the source and target move the VM and switch the Machine's
// spec.nodeName (internal/node/migration.go); it then sees the Machine
// Running on the target and marks the migration Succeeded, or Failed on a
// timeout. The agents mark a migration Failed themselves when their part
// fails, since only they know why.
type MachineMigrationReconciler struct {
	Client   client.Client
	Recorder events.EventRecorder
	// Interval is the reconcile tick; Timeout bounds a Running migration
	// (zero means DefaultMigrationTimeout).
	Interval time.Duration
	Timeout  time.Duration

	ended migrationEnds
	// started are the migrations this reconciler set Running that the
	// cache may still show Pending, counted against the parallel limits.
	started startedMigrations
}

// SetupWithManager registers the reconciler with mgr.
func (r *MachineMigrationReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := IndexPodsByNode(mgr); err != nil {
		return err
	}
	if r.Timeout <= 0 {
		r.Timeout = DefaultMigrationTimeout
	}
	r.ended.since = time.Now()
	return builder.ControllerManagedBy(mgr).
		Named("machinemigration").
		For(&kaironv1.MachineMigration{}).
		// The Machine moving or becoming Running ends a migration.
		Watches(&kaironv1.Machine{}, handler.EnqueueRequestsFromMapFunc(r.migrationsOf)).
		// A migration that ends (or is deleted) frees a parallel slot.
		Watches(&kaironv1.MachineMigration{}, handler.EnqueueRequestsFromMapFunc(r.waitingForSlot)).
		Complete(requeue.UntilStopped(r))
}

// waitingForSlot maps any migration to the Pending ones that wait for a
// MigrationPolicy's parallel limit, in any namespace.
func (r *MachineMigrationReconciler) waitingForSlot(ctx context.Context, o client.Object) []reconcile.Request {
	var list kaironv1.MachineMigrationList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		mig := &list.Items[i]
		if mig.Status.Reason == kaironv1.MigrationReasonParallelLimitReached && !mig.Status.Phase.IsTerminal() &&
			mig.Status.Phase != kaironv1.MigrationRunning && mig.UID != o.GetUID() {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: mig.Namespace, Name: mig.Name}})
		}
	}
	return out
}

// migrationsOf maps a Machine to its in-flight migrations.
func (r *MachineMigrationReconciler) migrationsOf(ctx context.Context, o client.Object) []reconcile.Request {
	var list kaironv1.MachineMigrationList
	if err := r.Client.List(ctx, &list, client.InNamespace(o.GetNamespace())); err != nil {
		return nil
	}
	var out []reconcile.Request
	for i := range list.Items {
		mig := &list.Items[i]
		if mig.Spec.MachineName == o.GetName() && rules.MigrationInFlight(mig) {
			out = append(out, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: mig.Namespace, Name: mig.Name}})
		}
	}
	return out
}

// Reconcile moves one migration along its phases.
func (r *MachineMigrationReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	mig := &kaironv1.MachineMigration{}
	if err := r.Client.Get(ctx, req.NamespacedName, mig); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if mig.Status.Phase.IsTerminal() {
		// Ended here or by a node agent: counted once either way.
		r.ended.record(mig)
		return reconcile.Result{}, r.unnameTarget(ctx, mig)
	}
	if mig.DeletionTimestamp != nil {
		return reconcile.Result{}, nil
	}
	desired := mig.DeepCopy()
	recordStrategyChoice(desired)
	result, err := r.step(ctx, desired)
	if err != nil {
		return reconcile.Result{}, err
	}
	if !equality.Semantic.DeepEqual(mig.Status, desired.Status) {
		if err := patch.Status(ctx, r.Client, mig, desired, patch.WithOptimisticLock()); err != nil {
			if apierrors.IsConflict(err) {
				return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
			}
			return reconcile.Result{}, err
		}
		if desired.Status.Phase == kaironv1.MigrationRunning && mig.Status.Phase != kaironv1.MigrationRunning {
			r.started.add(desired)
		}
		if desired.Status.Phase != mig.Status.Phase {
			kind := corev1.EventTypeNormal
			if desired.Status.Phase == kaironv1.MigrationFailed {
				kind = corev1.EventTypeWarning
			}
			r.Recorder.Eventf(desired, nil, kind, string(desired.Status.Reason), "Migrate", "%s", desired.Status.Message)
		}
	}
	return result, nil
}

// step computes mig's next status in place.
func (r *MachineMigrationReconciler) step(ctx context.Context, mig *kaironv1.MachineMigration) (reconcile.Result, error) {
	machine := &kaironv1.Machine{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}, machine)
	if apierrors.IsNotFound(err) {
		failMigration(mig, kaironv1.MigrationReasonMachineNotFound, fmt.Sprintf("machine %s/%s does not exist", mig.Namespace, mig.Spec.MachineName))
		return reconcile.Result{}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	if mig.Status.Phase == kaironv1.MigrationRunning {
		return r.watchRunning(mig, machine), nil
	}
	return reconcile.Result{RequeueAfter: r.Interval}, r.start(ctx, mig, machine)
}

// start checks the Machine, picks the target and sets the phase Running.
func (r *MachineMigrationReconciler) start(ctx context.Context, mig *kaironv1.MachineMigration, machine *kaironv1.Machine) error {
	switch {
	case machine.DeletionTimestamp != nil:
		failMigration(mig, kaironv1.MigrationReasonMachineNotRunning, fmt.Sprintf("machine %s/%s is being deleted", machine.Namespace, machine.Name))
		return nil
	case machine.Spec.NodeName == "" || machine.Status.Phase != kaironv1.MachineRunning:
		failMigration(mig, kaironv1.MigrationReasonMachineNotRunning, fmt.Sprintf("machine %s/%s is %s, not Running on a node; only a Running Machine can be migrated",
			machine.Namespace, machine.Name, orNone(string(machine.Status.Phase))))
		return nil
	}
	// The webhook refuses a second in-flight migration of a Machine, but
	// two can still get in: at the same moment, or with no webhook. Only
	// the one that goes first starts; the other fails.
	var migrations kaironv1.MachineMigrationList
	if err := r.Client.List(ctx, &migrations, client.InNamespace(mig.Namespace)); err != nil {
		return fmt.Errorf("listing machine migrations: %w", err)
	}
	if other := rules.MigrationToYieldTo(mig, migrations.Items); other != nil {
		failMigration(mig, kaironv1.MigrationReasonAlreadyMigrating, rules.ConflictingMigrationMessage(machine.Name, other))
		return nil
	}
	policy, err := r.migrationPolicy(ctx, machine)
	if err != nil {
		return err
	}
	if policy != nil {
		running, err := r.runningMigrations(ctx)
		if err != nil {
			return err
		}
		if why := rules.MigrationParallelLimit(policy, machine.Spec.NodeName, running); why != "" {
			mig.Status.Phase = kaironv1.MigrationPending
			mig.Status.Reason = kaironv1.MigrationReasonParallelLimitReached
			mig.Status.Message = why
			return nil
		}
	}
	target, why, err := r.pickTarget(ctx, mig, machine)
	if err != nil {
		return err
	}
	if target == "" {
		failMigration(mig, kaironv1.MigrationReasonTargetUnavailable, why)
		return nil
	}
	// Named on the Machine before the migration runs: the node confinement
	// policy lets only this node's agent take the Machine over.
	if err := r.nameTarget(ctx, machine, target); err != nil {
		return err
	}
	now := metav1.Now()
	mig.Status.Phase = kaironv1.MigrationRunning
	mig.Status.Reason = kaironv1.MigrationReasonStarted
	strategy := mig.Spec.Strategy
	if strategy == "" {
		strategy = kaironv1.MigrationCold
	}
	mig.Status.Message = fmt.Sprintf("moving machine %s from node %s to node %s (%s)", machine.Name, machine.Spec.NodeName, target, strategy)
	if policy != nil {
		mig.Status.Message += " under MigrationPolicy " + policy.Name
	}
	mig.Status.MigrationPolicy = rules.ApplyMigrationPolicy(policy, machine)
	mig.Status.SourceNode = machine.Spec.NodeName
	mig.Status.TargetNode = target
	mig.Status.StartTime = &now
	return nil
}

// pickTarget is spec.targetNode if the Machine fits there, else the node the
// scheduler would choose among the Kairon nodes other than the source. The
// fit is the scheduler's (rules.NodeRejections, rules.PickNode); "" comes with why not.
func (r *MachineMigrationReconciler) pickTarget(ctx context.Context, mig *kaironv1.MachineMigration, machine *kaironv1.Machine) (string, string, error) {
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.HasLabels{kaironv1.LabelNode}); err != nil {
		return "", "", fmt.Errorf("listing nodes: %w", err)
	}
	var machines kaironv1.MachineList
	if err := r.Client.List(ctx, &machines); err != nil {
		return "", "", fmt.Errorf("listing machines: %w", err)
	}
	var migrations kaironv1.MachineMigrationList
	if err := r.Client.List(ctx, &migrations); err != nil {
		return "", "", fmt.Errorf("listing machine migrations: %w", err)
	}
	source := machine.Spec.NodeName
	byName := map[string]*rules.NodeInfo{}
	var candidates []*rules.NodeInfo
	for i := range nodes.Items {
		n := rules.NewNodeInfo(&nodes.Items[i])
		byName[n.Node.Name] = n
		if n.Node.Name != source {
			candidates = append(candidates, n)
		}
	}
	all := make([]*kaironv1.Machine, len(machines.Items))
	for i := range machines.Items {
		all[i] = &machines.Items[i]
	}
	rules.ChargeNodes(byName, all, migrations.Items)
	if err := chargePods(ctx, r.Client, byName); err != nil {
		return "", "", err
	}
	if want := mig.Spec.TargetNode; want != "" {
		if want == source {
			return "", fmt.Sprintf("spec.targetNode %s is the node the Machine already runs on", want), nil
		}
		n := byName[want]
		if n == nil {
			return "", fmt.Sprintf("spec.targetNode %s is not a Kairon node (no node with label %s)", want, kaironv1.LabelNode), nil
		}
		if rejections := rules.NodeRejections(n, machine); len(rejections) > 0 {
			var report rules.RejectionReport
			report.Add(n, rejections)
			return "", fmt.Sprintf("spec.targetNode %s cannot take the Machine: %s", want, report.Message(1, rules.MachineResources(machine))), nil
		}
		return want, "", nil
	}
	if len(candidates) == 0 {
		// PickNode would say there are no Kairon nodes at all, when there
		// is one: the source.
		return "", fmt.Sprintf("node %s is the only Kairon node (label %s); a migration needs another", source, kaironv1.LabelNode), nil
	}
	best, why := rules.PickNode(candidates, machine)
	if best == nil {
		return "", "no node other than " + source + " can take the Machine: " + why, nil
	}
	return best.Node.Name, "", nil
}

// watchRunning ends a Running migration once the Machine runs on the
// target, or on a timeout.
func (r *MachineMigrationReconciler) watchRunning(mig *kaironv1.MachineMigration, machine *kaironv1.Machine) reconcile.Result {
	target := mig.Status.TargetNode
	started := mig.CreationTimestamp.Time
	if mig.Status.StartTime != nil {
		started = mig.Status.StartTime.Time
	}
	timeout := r.timeoutOf(mig)
	left := time.Until(started.Add(timeout))
	// ObservedGeneration == Generation means the status was written after
	// the switch of spec.nodeName, by the target's agent. The source's
	// state-saved annotation is its side of the hand-over (for a live
	// migration it comes just after the switch, with the downtime); past
	// the timeout the Machine running on the target is enough.
	handedOver := mig.Annotations[kaironv1.AnnotationMigrationStateSaved] == "true" || left <= 0
	if machine.Spec.NodeName == target && machine.Status.Phase == kaironv1.MachineRunning &&
		machine.Status.ObservedGeneration == machine.Generation && handedOver {
		now := metav1.Now()
		mig.Status.Phase = kaironv1.MigrationSucceeded
		mig.Status.Reason = kaironv1.MigrationReasonSucceeded
		mig.Status.Message = fmt.Sprintf("machine %s runs on node %s", machine.Name, target)
		mig.Status.CompletionTime = &now
		mig.Status.DowntimeMillis = downtimeMillis(mig, now.Time)
		return reconcile.Result{}
	}
	if machine.Spec.NodeName != target && machine.Spec.NodeName != mig.Status.SourceNode {
		failMigration(mig, kaironv1.MigrationReasonMachineMovedElsewhere, fmt.Sprintf("machine %s was moved to node %q by someone else", machine.Name, machine.Spec.NodeName))
		return reconcile.Result{}
	}
	if left <= 0 {
		failMigration(mig, kaironv1.MigrationReasonTimeout, fmt.Sprintf("the migration did not finish within %s", timeout))
		return reconcile.Result{}
	}
	return reconcile.Result{RequeueAfter: min(left, r.Interval)}
}

// timeoutOf is how long mig may stay Running: the reconciler's Timeout, or
// longer when its MigrationPolicy gives the live stream a longer
// completion timeout (the source agent cancels it then, with its reason;
// this is the minute after, for an agent that could not).
func (r *MachineMigrationReconciler) timeoutOf(mig *kaironv1.MachineMigration) time.Duration {
	p := mig.Status.MigrationPolicy
	if p == nil || p.CompletionTimeoutSeconds == nil {
		return r.Timeout
	}
	return max(r.Timeout, time.Duration(*p.CompletionTimeoutSeconds)*time.Second+time.Minute)
}

// migrationPolicy is the MigrationPolicy that governs machine's
// migrations (rules.SelectMigrationPolicy), or nil.
func (r *MachineMigrationReconciler) migrationPolicy(ctx context.Context, machine *kaironv1.Machine) (*kaironv1.MigrationPolicy, error) {
	var policies kaironv1.MigrationPolicyList
	if err := r.Client.List(ctx, &policies); err != nil {
		return nil, fmt.Errorf("listing migration policies: %w", err)
	}
	if len(policies.Items) == 0 {
		return nil, nil
	}
	ns := &corev1.Namespace{}
	if err := r.Client.Get(ctx, client.ObjectKey{Name: machine.Namespace}, ns); err != nil {
		return nil, fmt.Errorf("reading namespace %s for its labels: %w", machine.Namespace, err)
	}
	return rules.SelectMigrationPolicy(policies.Items, machine.Labels, ns.Labels), nil
}

// runningMigrations are the migrations Running in the cluster: those the
// cache shows Running, and those this reconciler set Running that it
// still shows Pending.
func (r *MachineMigrationReconciler) runningMigrations(ctx context.Context) ([]*kaironv1.MachineMigration, error) {
	var list kaironv1.MachineMigrationList
	if err := r.Client.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing machine migrations: %w", err)
	}
	return r.started.running(list.Items, time.Now()), nil
}

// startedMigrations remembers the migrations a reconciler set Running
// until its cache shows them so (or assumeTTL passed), as the scheduler's
// assumed bindings: a reconcile right after a start must count it.
type startedMigrations struct {
	mu   sync.Mutex
	byID map[types.UID]startedMigration
}

type startedMigration struct {
	mig *kaironv1.MachineMigration
	at  time.Time
}

func (s *startedMigrations) add(mig *kaironv1.MachineMigration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byID == nil {
		s.byID = map[types.UID]startedMigration{}
	}
	s.byID[mig.UID] = startedMigration{mig: mig.DeepCopy(), at: time.Now()}
}

// running is the Running migrations among cached, with the started ones
// the cache does not show Running yet; it forgets those it shows moved on.
func (s *startedMigrations) running(cached []kaironv1.MachineMigration, now time.Time) []*kaironv1.MachineMigration {
	s.mu.Lock()
	defer s.mu.Unlock()
	for uid, started := range s.byID {
		if now.Sub(started.at) > assumeTTL { // also one deleted meanwhile
			delete(s.byID, uid)
		}
	}
	var out []*kaironv1.MachineMigration
	for i := range cached {
		mig := &cached[i]
		started, ok := s.byID[mig.UID]
		switch {
		case mig.Status.Phase == kaironv1.MigrationRunning:
			out = append(out, mig)
			delete(s.byID, mig.UID)
		case mig.Status.Phase.IsTerminal():
			delete(s.byID, mig.UID)
		case ok:
			out = append(out, started.mig)
		default:
			delete(s.byID, mig.UID)
		}
	}
	return out
}

// downtimeMillis is how long the guest did not run: as the source's
// hypervisor measured it (live), else from when the source stopped it to now.
// Under a millisecond counts as 1, since 0 would read as not measured.
func downtimeMillis(mig *kaironv1.MachineMigration, now time.Time) int64 {
	if ms, err := strconv.ParseInt(mig.Annotations[kaironv1.AnnotationMigrationDowntimeMillis], 10, 64); err == nil && ms >= 0 {
		return max(ms, 1)
	}
	down := mig.Status.StartTime.Time
	if at, err := time.Parse(time.RFC3339Nano, mig.Annotations[kaironv1.AnnotationMigrationStateSavedAt]); err == nil {
		down = at
	}
	return max(now.Sub(down).Milliseconds(), 1)
}

// conditionReason is what metav1.Condition's reason must look like.
var conditionReason = regexp.MustCompile(`^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`)

// recordStrategyChoice writes, on a migration whose strategy cordon
// evacuation chose (strategy auto, rules.ApplyStrategyChoice), the choice it
// recorded in annotations as the StrategyChosen condition: the reason says
// which, the message why. The annotations are written once, with the
// migration; the condition follows them.
func recordStrategyChoice(mig *kaironv1.MachineMigration) {
	requested := mig.Annotations[kaironv1.AnnotationMigrationRequestedStrategy]
	reason := mig.Annotations[kaironv1.AnnotationMigrationStrategyReason]
	if requested == "" || !conditionReason.MatchString(reason) || len(reason) > 1024 {
		return // not Kairon's, or not a reason the API server would take
	}
	message := fmt.Sprintf("strategy %s chose %s", requested, mig.Annotations[kaironv1.AnnotationMigrationStrategyMessage])
	if len(message) > 32768 {
		message = message[:32768]
	}
	meta.SetStatusCondition(&mig.Status.Conditions, metav1.Condition{
		Type:               kaironv1.ConditionStrategyChosen.String(),
		Status:             metav1.ConditionTrue,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: mig.Generation,
	})
}

// failMigration sets mig Failed with reason and message.
func failMigration(mig *kaironv1.MachineMigration, reason kaironv1.MigrationReason, message string) {
	now := metav1.Now()
	mig.Status.Phase = kaironv1.MigrationFailed
	mig.Status.Reason = reason
	mig.Status.Message = message
	mig.Status.CompletionTime = &now
}

func orNone(s string) string {
	if s == "" {
		return "without a phase"
	}
	return s
}

// nameTarget writes the migration's target node on the Machine
// (AnnotationMachineMigrationTarget).
func (r *MachineMigrationReconciler) nameTarget(ctx context.Context, machine *kaironv1.Machine, target string) error {
	if machine.Annotations[kaironv1.AnnotationMachineMigrationTarget] == target {
		return nil
	}
	base := machine.DeepCopy()
	if machine.Annotations == nil {
		machine.Annotations = map[string]string{}
	}
	machine.Annotations[kaironv1.AnnotationMachineMigrationTarget] = target
	if err := r.Client.Patch(ctx, machine, client.MergeFrom(base)); err != nil {
		return fmt.Errorf("naming node %s the migration target of machine %s: %w", target, machine.Name, err)
	}
	return nil
}

// unnameTarget removes an ended migration's target from its Machine, unless
// another migration of the Machine in flight names the same node.
func (r *MachineMigrationReconciler) unnameTarget(ctx context.Context, mig *kaironv1.MachineMigration) error {
	machine := &kaironv1.Machine{}
	if err := r.Client.Get(ctx, client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}, machine); err != nil {
		return client.IgnoreNotFound(err)
	}
	named, ok := machine.Annotations[kaironv1.AnnotationMachineMigrationTarget]
	if !ok || named != mig.Status.TargetNode {
		return nil
	}
	var migrations kaironv1.MachineMigrationList
	if err := r.Client.List(ctx, &migrations, client.InNamespace(mig.Namespace)); err != nil {
		return fmt.Errorf("listing machine migrations: %w", err)
	}
	for i := range migrations.Items {
		other := &migrations.Items[i]
		if other.Spec.MachineName == machine.Name && !other.Status.Phase.IsTerminal() && other.Status.TargetNode == named {
			return nil
		}
	}
	base := machine.DeepCopy()
	delete(machine.Annotations, kaironv1.AnnotationMachineMigrationTarget)
	if err := r.Client.Patch(ctx, machine, client.MergeFrom(base)); err != nil {
		return client.IgnoreNotFound(err)
	}
	return nil
}
