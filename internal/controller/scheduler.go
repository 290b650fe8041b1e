package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/rules"
)

// schedulingPassKey is the only request the scheduler's queue ever holds.
// Placement decisions depend on each other (room on a node, quota left in a
// namespace, who is oldest), so every event asks for one pass over all
// unscheduled Machines instead of a reconcile per Machine; the workqueue
// folds a burst of events into a single pass.
var schedulingPassKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "scheduling-pass"}}

// conflictRetryDelay is how soon a pass runs again after losing a write to
// a concurrent one, rather than waiting a whole interval.
const conflictRetryDelay = time.Second

// SchedulerReconciler binds unscheduled Machines to Kairon nodes.
type SchedulerReconciler struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// APIReader reads from the API server, for retries after a conflict.
	APIReader client.Reader
	Recorder  events.EventRecorder
	// Interval is how often a pass runs without any event.
	Interval time.Duration

	assumed *assumedBindings
	pickups *nodePickups
}

// SetupWithManager registers the scheduler with mgr.
func (r *SchedulerReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := IndexPodsByNode(mgr); err != nil {
		return err
	}
	if r.assumed == nil {
		r.assumed = newAssumedBindings()
	}
	if r.pickups == nil {
		r.pickups = newNodePickups()
	}
	// The assumed bindings and the pass's own bookkeeping rely on passes
	// never overlapping.
	return singlePass(mgr, "scheduler", schedulingPassKey, r, func(b *builder.Builder, enqueuePass handler.EventHandler) *builder.Builder {
		return b.
			Watches(&kaironv1.Machine{}, enqueuePass, builder.WithPredicates(machinePlacementChanged())).
			Watches(&corev1.Node{}, enqueuePass, builder.WithPredicates(nodeSchedulingChanged())).
			Watches(&kaironv1.MachineQuota{}, enqueuePass, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
			Watches(&kaironv1.MachineSnapshot{}, enqueuePass, builder.WithPredicates(snapshotPhaseChanged())).
			// Pods bound to a node take room Machines cannot have.
			Watches(&corev1.Pod{}, enqueuePass, builder.WithPredicates(podRoomChanged()))
	})
}

// machinePlacementChanged passes the Machine events that can change where
// Machines fit: new and deleted Machines, spec changes (nodeName, size,
// selector), phase changes (Stopped and Failed Machines free their room)
// and the start of a deletion. Status chatter from the node agent is not.
func machinePlacementChanged() predicate.Funcs {
	return updatesThat(func(old, cur *kaironv1.Machine) bool {
		return old.Generation != cur.Generation ||
			old.Status.Phase != cur.Status.Phase ||
			(old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil)
	})
}

// nodeSchedulingChanged passes the events of Kairon nodes that change what
// they can take; heartbeats are not.
func nodeSchedulingChanged() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return rules.IsKaironNode(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return rules.IsKaironNode(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return rules.IsKaironNode(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			if !rules.IsKaironNode(e.ObjectOld) && !rules.IsKaironNode(e.ObjectNew) {
				return false
			}
			old, okOld := e.ObjectOld.(*corev1.Node)
			cur, okNew := e.ObjectNew.(*corev1.Node)
			if !okOld || !okNew {
				return true
			}
			return !equality.Semantic.DeepEqual(old.Labels, cur.Labels) ||
				old.Spec.Unschedulable != cur.Spec.Unschedulable ||
				rules.NodeAllocatable(old) != rules.NodeAllocatable(cur) ||
				rules.NodeReady(old) != rules.NodeReady(cur) ||
				rules.NodeAgentReachable(old) != rules.NodeAgentReachable(cur) ||
				rules.NodeFenced(old) != rules.NodeFenced(cur) ||
				(old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil)
		},
	}
}

// podNodeNameIndex indexes pods by spec.nodeName, so a pass reads only the
// pods of Kairon's nodes.
const podNodeNameIndex = "spec.nodeName"

// IndexPodsByNode registers podNodeNameIndex with mgr's cache. The
// scheduler, the migration controller and cordon evacuation all read it,
// and each registers it in its own SetupWithManager, so that any of them
// runs alone; a cache takes an index once, so the later calls for the same
// manager do nothing.
func IndexPodsByNode(mgr ctrl.Manager) error {
	indexer := mgr.GetFieldIndexer()
	if _, done := podIndexes.LoadOrStore(indexer, true); done {
		return nil
	}
	if err := indexer.IndexField(context.Background(), &corev1.Pod{}, podNodeNameIndex, podNodeName); err != nil {
		podIndexes.Delete(indexer)
		return fmt.Errorf("indexing pods by node: %w", err)
	}
	return nil
}

// podIndexes holds the field indexers (one per manager's cache) that have
// podNodeNameIndex.
var podIndexes sync.Map

func podNodeName(o client.Object) []string {
	if pod, ok := o.(*corev1.Pod); ok && pod.Spec.NodeName != "" {
		return []string{pod.Spec.NodeName}
	}
	return nil
}

// chargePods books on each node what the pods bound to it request
// (rules.ChargePods).
func chargePods(ctx context.Context, c client.Reader, byName map[string]*rules.NodeInfo) error {
	for name := range byName {
		var pods corev1.PodList
		// Only read, so the cache's own objects do: a pass runs often and
		// a node may hold many pods.
		if err := c.List(ctx, &pods, client.MatchingFields{podNodeNameIndex: name}, client.UnsafeDisableDeepCopy); err != nil {
			return fmt.Errorf("listing pods on node %s: %w", name, err)
		}
		rules.ChargePods(byName, pods.Items)
	}
	return nil
}

// podRoomChanged passes the pod events that change the room left on a
// node: a pod bound or gone, finished, or resized. Booking pods are left
// out: the Machine each stands for is what the scheduler counts.
func podRoomChanged() predicate.Funcs {
	counts := func(o client.Object) bool {
		pod, ok := o.(*corev1.Pod)
		return ok && pod.Spec.NodeName != "" && !rules.IsBookingPod(pod)
	}
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return counts(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return counts(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return counts(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, okOld := e.ObjectOld.(*corev1.Pod)
			cur, okNew := e.ObjectNew.(*corev1.Pod)
			if !okOld || !okNew || (!counts(old) && !counts(cur)) {
				return false
			}
			return old.Spec.NodeName != cur.Spec.NodeName ||
				rules.PodHoldsNodeResources(old) != rules.PodHoldsNodeResources(cur) ||
				rules.EffectivePodRequests(old) != rules.EffectivePodRequests(cur)
		},
	}
}

// Reconcile runs one scheduling pass.
func (r *SchedulerReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	pass, err := r.snapshot(ctx)
	if err != nil {
		return reconcile.Result{}, err
	}
	var errs []error
	retrySoon := false
	for _, m := range pass.placedNotMarked {
		err := r.markScheduled(ctx, m)
		switch {
		case apierrors.IsConflict(err):
			retrySoon = true
		case err != nil:
			errs = append(errs, fmt.Errorf("machine %s/%s: %w", m.Namespace, m.Name, err))
		}
	}
	// Every placement is decided first, in order, each one booking its
	// room; then the writes go out together. A pass no longer waits for
	// one Machine's writes before placing the next: at a few tens of ms
	// per write on a busy API server, that made the scheduler the
	// bottleneck of a pool refilling after a claim burst.
	binds, pending := pass.decide()
	failed := func(m *kaironv1.Machine, err error) {
		switch {
		case apierrors.IsConflict(err), apierrors.IsNotFound(err):
			// Someone changed or deleted the Machine since the cache saw
			// it; the next pass works from the new version.
			retrySoon = true
		case err != nil:
			errs = append(errs, fmt.Errorf("machine %s/%s: %w", m.Namespace, m.Name, err))
		}
	}
	bindErrs := inParallel(binds, func(p placement) error { return r.bindAndMark(ctx, p.machine, p.node) })
	bindFailed := false
	for i, err := range bindErrs {
		if err != nil {
			bindFailed = true
			failed(binds[i].machine, err)
		}
	}
	// A bind that failed booked room the pass then thought taken, so a
	// Machine it found no room for may have had some: say nothing about
	// those this pass and look again soon.
	if bindFailed {
		retrySoon = true
	} else {
		pendErrs := inParallel(pending, func(p placement) error { return r.markPending(ctx, p.machine, p.reason, p.message) })
		for i, err := range pendErrs {
			failed(pending[i].machine, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	next := r.Interval
	if retrySoon && conflictRetryDelay < next {
		next = conflictRetryDelay
	}
	if pass.markIn > 0 && pass.markIn < next {
		next = pass.markIn
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

// schedulingPass is the cluster as one pass sees it, updated as the pass
// places Machines so later decisions in the same pass account for them.
type schedulingPass struct {
	nodes       []*rules.NodeInfo
	nodesByName map[string]*rules.NodeInfo
	quotas      map[string][]*quotaState // by namespace
	unscheduled []*kaironv1.Machine      // oldest first
	// placedNotMarked have a node but a status that still says Pending:
	// placed by hand, or placed by this scheduler more than
	// nodePickupGrace ago and not picked up by their node agent.
	placedNotMarked []*kaironv1.Machine
	// markIn is when the next Machine placed by this scheduler is due to
	// be marked by it, unless its agent does first; 0 for none.
	markIn time.Duration
	// snapshots are those restored Machines name (snapshot_placement.go).
	snapshots map[types.NamespacedName]*kaironv1.MachineSnapshot
}

type quotaState struct {
	quota *kaironv1.MachineQuota
	used  kaironv1.MachineResources
}

func (r *SchedulerReconciler) snapshot(ctx context.Context) (*schedulingPass, error) {
	var nodes corev1.NodeList
	if err := r.Client.List(ctx, &nodes, client.HasLabels{kaironv1.LabelNode}); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	// Read-only views of the cache (every Machine of the cluster, on every
	// pass): whatever a pass writes, it writes to a copy (bind,
	// markScheduled, markPending).
	var machineList kaironv1.MachineList
	if err := r.Client.List(ctx, &machineList, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing machines: %w", err)
	}
	var quotas kaironv1.MachineQuotaList
	if err := r.Client.List(ctx, &quotas); err != nil {
		return nil, fmt.Errorf("listing machine quotas: %w", err)
	}
	var migrations kaironv1.MachineMigrationList
	if err := r.Client.List(ctx, &migrations); err != nil {
		return nil, fmt.Errorf("listing machine migrations: %w", err)
	}

	pass := &schedulingPass{nodesByName: map[string]*rules.NodeInfo{}, quotas: map[string][]*quotaState{}}
	machines := make([]*kaironv1.Machine, len(machineList.Items))
	unmarked := map[types.UID]bool{}
	for i := range machineList.Items {
		m := &machineList.Items[i]
		machines[i] = m
		// Judged before the assumed bindings are overlaid: a binding the
		// cache has not shown yet is the node agent's to mark.
		if m.Spec.NodeName != "" && m.DeletionTimestamp == nil && (m.Status.Phase == "" || m.Status.Phase == kaironv1.MachinePending) {
			unmarked[m.UID] = true
			if due, wait := r.pickups.due(m); !due {
				if pass.markIn == 0 || wait < pass.markIn {
					pass.markIn = wait
				}
				continue
			}
			pass.placedNotMarked = append(pass.placedNotMarked, m)
		}
	}
	r.pickups.keepOnly(unmarked)
	machines = r.assumed.apply(machines)

	for i := range nodes.Items {
		n := rules.NewNodeInfo(&nodes.Items[i])
		pass.nodes = append(pass.nodes, n)
		pass.nodesByName[n.Node.Name] = n
	}
	if err := chargePods(ctx, r.Client, pass.nodesByName); err != nil {
		return nil, err
	}
	rules.ChargeNodes(pass.nodesByName, machines, migrations.Items)
	byNamespace := map[string][]kaironv1.Machine{}
	for _, m := range machines {
		byNamespace[m.Namespace] = append(byNamespace[m.Namespace], *m)
		if m.Spec.NodeName == "" && m.DeletionTimestamp == nil {
			pass.unscheduled = append(pass.unscheduled, m)
		}
	}
	rules.SortByAge(pass.unscheduled)
	if err := r.loadSnapshots(ctx, pass); err != nil {
		return nil, err
	}
	for i := range quotas.Items {
		q := &quotas.Items[i]
		if q.DeletionTimestamp != nil {
			continue
		}
		used, _ := rules.QuotaUsage(q, byNamespace[q.Namespace])
		pass.quotas[q.Namespace] = append(pass.quotas[q.Namespace], &quotaState{quota: q, used: used})
	}
	return pass, nil
}

// admitQuota checks m against every quota of its namespace, naming each one
// it would exceed.
func (p *schedulingPass) admitQuota(m *kaironv1.Machine) (bool, string) {
	var refusals []string
	for _, q := range p.quotas[m.Namespace] {
		if ok, message := rules.QuotaAdmits(q.quota, q.used, m); !ok {
			refusals = append(refusals, message)
		}
	}
	if len(refusals) == 0 {
		return true, ""
	}
	return false, strings.Join(refusals, "; ")
}

// charge books m on node and on its namespace's quotas for the rest of the pass.
func (p *schedulingPass) charge(m *kaironv1.Machine, node *rules.NodeInfo) {
	node.Requested = node.Requested.Add(rules.MachineResources(m))
	for _, q := range p.quotas[m.Namespace] {
		*q.used.Machines++
		*q.used.CPU += rules.MachineCPU(m)
		q.used.Memory.Add(rules.MachineMemory(m))
	}
}

// placement is what a pass decided for one unscheduled Machine: a node, or
// why it stays Pending.
type placement struct {
	machine         *kaironv1.Machine
	node            *rules.NodeInfo
	reason, message string
}

// decide places the pass's unscheduled Machines, oldest first, each on the
// room the ones before it left (node capacity and namespace quotas).
func (p *schedulingPass) decide() (binds, pending []placement) {
	for _, m := range p.unscheduled {
		if ok, message := p.admitQuota(m); !ok {
			pending = append(pending, placement{machine: m, reason: kaironv1.MachineReasonQuotaExceeded, message: message})
			continue
		}
		node, reason, message := p.pick(m) // snapshot_placement.go
		if node == nil {
			pending = append(pending, placement{machine: m, reason: reason, message: message})
			continue
		}
		p.charge(m, node)
		binds = append(binds, placement{machine: m, node: node})
	}
	return binds, pending
}

// schedulerWriters bounds the writes a pass has in flight at once.
const schedulerWriters = 16

// inParallel runs do for each item, at most schedulerWriters at once, and
// returns each one's error at its index.
func inParallel(items []placement, do func(placement) error) []error {
	errs := make([]error, len(items))
	sem := make(chan struct{}, schedulerWriters)
	var wg sync.WaitGroup
	for i, it := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = do(it)
		})
	}
	wg.Wait()
	return errs
}

// bindAndMark binds m to node and records it in m's status.
func (r *SchedulerReconciler) bindAndMark(ctx context.Context, m *kaironv1.Machine, node *rules.NodeInfo) error {
	bound, err := r.bind(ctx, m, node.Node.Name)
	if err != nil {
		return err
	}
	r.assumed.assume(bound, node.Node.Name)
	// The node agent records the placement in its first status write; the
	// scheduler does only if the agent does not (nodePickups).
	r.pickups.placedNow(bound)
	log := ctrl.LoggerFrom(ctx).WithValues("machine", klog.KObj(m), "node", klog.KObj(node.Node))
	log.Info("Bound machine to node", "cpu", rules.MachineCPU(m), "memory", rules.FormatMemory(rules.MachineMemory(m)))
	r.Recorder.Eventf(bound, nil, corev1.EventTypeNormal, kaironv1.MachineReasonScheduled, "Binding", "Bound to node %s", node.Node.Name)
	return nil
}

// bind sets spec.nodeName, failing with a conflict if the Machine changed
// since the cache saw it, so a Machine someone else placed is never moved.
// The same write puts on the node agent's VM finalizer, which the agent
// would otherwise add in a write of its own as it picks the Machine up:
// one write fewer for every Machine a pool or set creates. The agent (or,
// for a dead node, the fence controller) removes it as before.
func (r *SchedulerReconciler) bind(ctx context.Context, m *kaironv1.Machine, node string) (*kaironv1.Machine, error) {
	bound := m.DeepCopy()
	bound.Spec.NodeName = node
	controllerutil.AddFinalizer(bound, kaironv1.FinalizerMachineVM)
	if err := r.Client.Patch(ctx, bound, client.MergeFromWithOptions(m, client.MergeFromWithOptimisticLock{})); err != nil {
		return nil, err
	}
	return bound, nil
}

// markScheduled records a placement in status that the node agent has not
// recorded. The agent may pick the Machine up meanwhile, so a conflict is
// retried on a fresh read.
func (r *SchedulerReconciler) markScheduled(ctx context.Context, m *kaironv1.Machine) error {
	m = m.DeepCopy() // the cache's own object; a conflict reads over it
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if m.Spec.NodeName == "" || m.DeletionTimestamp != nil || rules.MarkedScheduled(m) {
			return nil // unbound, going away, or marked meanwhile
		}
		desired := m.DeepCopy()
		rules.MarkScheduled(desired)
		err := r.patchStatus(ctx, m, desired)
		if apierrors.IsConflict(err) {
			if getErr := r.APIReader.Get(ctx, client.ObjectKeyFromObject(m), m); getErr != nil {
				return getErr
			}
		}
		return err
	})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// markPending explains why m stays unscheduled. Only a changed explanation
// is written and announced, so a Machine waiting for room is not rewritten
// every pass.
func (r *SchedulerReconciler) markPending(ctx context.Context, m *kaironv1.Machine, reason, message string) error {
	desired := m.DeepCopy()
	if schedulerOwnsPhase(desired.Status.Phase) {
		desired.Status.Phase = kaironv1.MachinePending
		desired.Status.Message = message
	}
	previous := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionScheduled.String())
	meta.SetStatusCondition(&desired.Status.Conditions, metav1.Condition{
		Type:               kaironv1.ConditionScheduled.String(),
		Status:             metav1.ConditionFalse,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: desired.Generation,
	})
	if err := r.patchStatus(ctx, m, desired); err != nil {
		return err
	}
	if previous == nil || previous.Message != message {
		ctrl.LoggerFrom(ctx).Info("Machine stays pending", "machine", klog.KObj(m), "reason", reason, "why", message)
		r.Recorder.Eventf(desired, nil, corev1.EventTypeWarning, kaironv1.EventReasonFailedScheduling, "Scheduling", "%s", message)
	}
	return nil
}

// patchStatus writes the status fields that differ between current and
// desired, so fields only the node agent writes are never sent. It is
// locked because the node agent shares the status, conditions included.
func (r *SchedulerReconciler) patchStatus(ctx context.Context, current, desired *kaironv1.Machine) error {
	return patch.Status(ctx, r.Client, current, desired, patch.WithOptimisticLock())
}

// schedulerOwnsPhase says whether the scheduler may write the phase: only
// before the node agent has taken over. A Machine never goes back from
// Booting or Running because the scheduler looked at a stale copy.
func schedulerOwnsPhase(phase kaironv1.MachinePhase) bool {
	return phase == "" || phase == kaironv1.MachinePending || phase == kaironv1.MachineScheduled
}
