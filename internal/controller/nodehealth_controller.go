package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules"
)

// machineNodeIndex indexes Machines by spec.nodeName in the cache.
const machineNodeIndex = "kairon.spec.nodeName"

// registeredNodeVersion is the kubeletVersion an agent run with --register
// writes on the Node it creates: there the Node's Ready condition is
// Kairon's, not a kubelet's.
const registeredNodeVersion = "kairon-node"

// NodeHealthReconciler judges each Kairon node by its agent's Lease
// (kube-node-lease/kairon-<node>), the way the node lifecycle controller
// judges kubelets: a Lease that has not changed for GracePeriod, by this
// controller's own clock, makes the node unreachable. Then the Node's
// KaironAgentReady condition goes Unknown (and its Ready condition too,
// where the agent registered the Node and so owns Ready), and every
// Machine on it gets NodeReachable=False; all of it goes back to True once
// the Lease changes again. It deletes and recreates nothing: the node may
// still be running its VMs. The scheduler, pools, MachineSets and the
// binder act on the conditions (rules.NodeAgentReachable,
// rules.MachineNodeReachable).
type NodeHealthReconciler struct {
	Client client.Client
	// APIReader reads the Leases: the cache does not hold them.
	APIReader   client.Reader
	Recorder    events.EventRecorder
	GracePeriod time.Duration

	now  func() time.Time
	mu   sync.Mutex
	seen map[string]leaseSighting
}

// leaseSighting is when this controller last saw a node's Lease change.
type leaseSighting struct {
	resourceVersion string
	at              time.Time
}

// SetupWithManager registers the reconciler with mgr.
func (r *NodeHealthReconciler) SetupWithManager(mgr manager.Manager) error {
	if r.GracePeriod <= 0 {
		r.GracePeriod = rules.DefaultNodeGracePeriod
	}
	if r.now == nil {
		r.now = time.Now
	}
	r.seen = map[string]leaseSighting{}
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &kaironv1.Machine{}, machineNodeIndex, func(o client.Object) []string {
		if n := o.(*kaironv1.Machine).Spec.NodeName; n != "" {
			return []string{n}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing machines by node: %w", err)
	}
	return builder.ControllerManagedBy(mgr).
		Named("nodehealth").
		For(&corev1.Node{}, builder.WithPredicates(nodeHealthChanged())).
		Complete(requeue.UntilStopped(r))
}

// nodeHealthChanged passes a Kairon node's arrival and departure and
// changes of its Ready or KaironAgentReady condition; the requeues do the
// rest, so heartbeats cost nothing.
func nodeHealthChanged() predicate.Funcs {
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return rules.IsKaironNode(e.Object) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return rules.IsKaironNode(e.Object) },
		GenericFunc: func(e event.GenericEvent) bool { return rules.IsKaironNode(e.Object) },
		UpdateFunc: func(e event.UpdateEvent) bool {
			old, okOld := e.ObjectOld.(*corev1.Node)
			cur, okNew := e.ObjectNew.(*corev1.Node)
			if !okOld || !okNew || !rules.IsKaironNode(cur) {
				return okOld && okNew && rules.IsKaironNode(old) != rules.IsKaironNode(cur)
			}
			return rules.IsKaironNode(old) != rules.IsKaironNode(cur) ||
				rules.NodeReady(old) != rules.NodeReady(cur) ||
				rules.NodeAgentReachable(old) != rules.NodeAgentReachable(cur)
		},
	}
}

// unreachablePoll is how often an unreachable node's Lease is read again,
// so a returning agent is seen within moments.
func (r *NodeHealthReconciler) unreachablePoll() time.Duration {
	return min(r.GracePeriod/4, 2*time.Second)
}

// Reconcile judges one node.
func (r *NodeHealthReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var node corev1.Node
	if err := r.Client.Get(ctx, req.NamespacedName, &node); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.Name)
		}
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !rules.IsKaironNode(&node) || node.DeletionTimestamp != nil {
		r.forget(node.Name)
		return reconcile.Result{}, nil
	}
	var lease coordinationv1.Lease
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: rules.NodeLeaseNamespace, Name: rules.NodeLeaseName(node.Name)}, &lease)
	if apierrors.IsNotFound(err) {
		// No agent ever took a Lease here (or someone deleted it):
		// nothing to judge the node by. Look again later.
		r.forget(node.Name)
		return reconcile.Result{RequeueAfter: r.GracePeriod}, nil
	}
	if err != nil {
		return reconcile.Result{}, err
	}
	now := r.now()
	seenAt := r.sight(&node, &lease, now)
	reachable := !rules.LeaseExpired(seenAt, now, r.GracePeriod)
	nodeUnreachable.WithLabelValues(node.Name).Set(map[bool]float64{true: 0, false: 1}[reachable])

	message := fmt.Sprintf("kairon-node renews its Lease %s/%s", rules.NodeLeaseNamespace, lease.Name)
	if !reachable {
		message = fmt.Sprintf("kairon-node has not renewed its Lease %s/%s for %s (grace period %s)",
			rules.NodeLeaseNamespace, lease.Name, now.Sub(seenAt).Truncate(time.Second), r.GracePeriod)
	}
	errs := []error{r.markNode(ctx, &node, reachable, message)}
	retrySoon, err := r.markMachines(ctx, node.Name, reachable, message)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		if apierrors.IsConflict(err) {
			return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
		}
		return reconcile.Result{}, err
	}
	if retrySoon {
		return reconcile.Result{RequeueAfter: 100 * time.Millisecond}, nil
	}
	if !reachable {
		return reconcile.Result{RequeueAfter: r.unreachablePoll()}, nil
	}
	// Look again when the grace would run out if the Lease did not change.
	return reconcile.Result{RequeueAfter: seenAt.Add(r.GracePeriod).Sub(now) + 100*time.Millisecond}, nil
}

// sight records the Lease and returns when it last changed, by this
// controller's clock. Seen for the first time, it counts as changed now,
// unless the node was already judged unreachable: after a restart of this
// controller a dead node stays dead until its Lease really changes.
func (r *NodeHealthReconciler) sight(node *corev1.Node, lease *coordinationv1.Lease, now time.Time) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	last, ok := r.seen[node.Name]
	switch {
	case ok && last.resourceVersion == lease.ResourceVersion:
		return last.at
	case !ok && !rules.NodeAgentReachable(node):
		last = leaseSighting{resourceVersion: lease.ResourceVersion} // zero time: expired
	default:
		last = leaseSighting{resourceVersion: lease.ResourceVersion, at: now}
	}
	r.seen[node.Name] = last
	return last.at
}

func (r *NodeHealthReconciler) forget(node string) {
	r.mu.Lock()
	delete(r.seen, node)
	r.mu.Unlock()
	nodeUnreachable.DeleteLabelValues(node)
}

// markNode sets the Node's KaironAgentReady condition and, on a Node its
// agent registered, Ready Unknown while unreachable (the agent writes Ready
// True again itself). Only a change is written.
func (r *NodeHealthReconciler) markNode(ctx context.Context, node *corev1.Node, reachable bool, message string) error {
	desired := node.DeepCopy()
	status, reason := corev1.ConditionTrue, kaironv1.NodeReachableReasonLeaseRenewed
	if !reachable {
		status, reason = corev1.ConditionUnknown, kaironv1.NodeReachableReasonLeaseExpired
	}
	now := metav1.NewTime(r.now())
	changed := setNodeCondition(desired, corev1.NodeCondition{
		Type: corev1.NodeConditionType(kaironv1.NodeConditionAgentReady), Status: status, Reason: reason, Message: message,
		LastHeartbeatTime: now, LastTransitionTime: now,
	})
	if !reachable && node.Status.NodeInfo.KubeletVersion == registeredNodeVersion {
		// As the node lifecycle controller does to a silent kubelet's: True
		// or False, Ready is Unknown now. What a stopping agent said last
		// (its VMs kept running, or saved) stays in the message.
		readyMessage := message
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionFalse && c.Message != "" {
				readyMessage = c.Message + "; " + message
			}
		}
		if setNodeCondition(desired, corev1.NodeCondition{
			Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown", Message: readyMessage,
			LastHeartbeatTime: now, LastTransitionTime: now,
		}) {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := patch.Status(ctx, r.Client, node, desired, patch.WithOptimisticLock()); err != nil {
		return err
	}
	logger := log.FromContext(ctx)
	if reachable {
		logger.Info("Node agent reachable again", "node", klog.KObj(node))
		r.Recorder.Eventf(desired, nil, corev1.EventTypeNormal, kaironv1.EventReasonNodeReachable, "NodeHealth", "%s", message)
	} else {
		logger.Info("Node agent unreachable", "node", klog.KObj(node), "why", message)
		r.Recorder.Eventf(desired, nil, corev1.EventTypeWarning, kaironv1.EventReasonNodeUnreachable, "NodeHealth", "%s", message)
	}
	return nil
}

// setNodeCondition sets c among node's conditions, keeping the transition
// time of one with the same status. It reports whether the status or the
// reason changed: the heartbeat and message alone are not worth a write.
func setNodeCondition(node *corev1.Node, c corev1.NodeCondition) bool {
	for i, old := range node.Status.Conditions {
		if old.Type != c.Type {
			continue
		}
		if old.Status == c.Status && old.Reason == c.Reason {
			return false
		}
		if old.Status == c.Status {
			c.LastTransitionTime = old.LastTransitionTime
		}
		node.Status.Conditions[i] = c
		return true
	}
	node.Status.Conditions = append(node.Status.Conditions, c)
	return true
}

// markMachines gives every Machine on the node NodeReachable=False while it
// is unreachable, and turns it True on those that have it once it is
// reachable again. Machines that never saw their node unreachable get no
// condition. It reports whether a write lost a race (look again soon).
func (r *NodeHealthReconciler) markMachines(ctx context.Context, node string, reachable bool, message string) (bool, error) {
	var list kaironv1.MachineList
	if err := r.Client.List(ctx, &list, client.MatchingFields{machineNodeIndex: node}); err != nil {
		return false, fmt.Errorf("listing machines on node %s: %w", node, err)
	}
	status, reason := metav1.ConditionTrue, kaironv1.NodeReachableReasonLeaseRenewed
	if !reachable {
		status, reason = metav1.ConditionFalse, kaironv1.NodeReachableReasonLeaseExpired
	}
	var errs []error
	conflicts := false
	for i := range list.Items {
		m := &list.Items[i]
		cur := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionNodeReachable.String())
		if (cur == nil && reachable) || (cur != nil && cur.Status == status) {
			continue
		}
		desired := m.DeepCopy()
		meta.SetStatusCondition(&desired.Status.Conditions, metav1.Condition{
			Type: kaironv1.ConditionNodeReachable.String(), Status: status, Reason: reason,
			Message: fmt.Sprintf("node %s: %s", node, message), ObservedGeneration: m.Generation,
		})
		err := patch.Status(ctx, r.Client, m, desired, patch.WithOptimisticLock())
		switch {
		case apierrors.IsConflict(err):
			conflicts = true
			continue
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			errs = append(errs, fmt.Errorf("machine %s/%s: %w", m.Namespace, m.Name, err))
			continue
		}
		kind := corev1.EventTypeNormal
		eventReason := kaironv1.EventReasonNodeReachable
		if !reachable {
			kind, eventReason = corev1.EventTypeWarning, kaironv1.EventReasonNodeUnreachable
		}
		r.Recorder.Eventf(desired, nil, kind, eventReason, "NodeHealth", "node %s: %s", node, message)
	}
	return conflicts, errors.Join(errs...)
}
