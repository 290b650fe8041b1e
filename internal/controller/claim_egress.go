package controller

import (
	"context"
	"fmt"
	"hash/fnv"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
)

// claimEgressPrefix starts the name of every claim's egress policy.
const claimEgressPrefix = "claim-egress-"

// egressPolicyName is claim-egress-<claim>. A claim name too long for that
// is cut and given a hash of the whole, so that the name stays unique.
func egressPolicyName(claim string) string {
	name := claimEgressPrefix + claim
	if len(name) <= 253 {
		return name
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(claim))
	return fmt.Sprintf("%s-%08x", name[:253-9], h.Sum32())
}

// desiredEgressPolicy is the default-deny policy that confines machine to
// the claim's spec.egress. The claim controls it, so the garbage collector
// deletes it with the claim should the finalizer ever be bypassed.
func desiredEgressPolicy(claim *kaironv1.MachineClaim, machine string) *kaironv1.MachineNetworkPolicy {
	return &kaironv1.MachineNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       claim.Namespace,
			Name:            egressPolicyName(claim.Name),
			Labels:          map[string]string{kaironv1.LabelMachineClaim: claim.Name},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(claim, machineClaimKind)},
		},
		Spec: kaironv1.MachineNetworkPolicySpec{MachineName: machine, Egress: *claim.Spec.Egress.DeepCopy()},
	}
}

// ensureEgressPolicy creates or updates the claim's egress policy for
// machine and returns its name. It reads c (the cache) first and falls back
// to live when the cache turns out to be behind.
func ensureEgressPolicy(ctx context.Context, c client.Client, live client.Reader, claim *kaironv1.MachineClaim, machine string) (string, error) {
	desired := desiredEgressPolicy(claim, machine)
	var cur kaironv1.MachineNetworkPolicy
	err := c.Get(ctx, client.ObjectKeyFromObject(desired), &cur)
	for range 3 {
		if apierrors.IsNotFound(err) {
			err = c.Create(ctx, desired.DeepCopy())
			if !apierrors.IsAlreadyExists(err) {
				break
			}
			err = live.Get(ctx, client.ObjectKeyFromObject(desired), &cur)
		}
		if err != nil {
			break
		}
		err = updateEgressPolicy(ctx, c, claim, &cur, desired)
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			break
		}
		// Changed, or deleted (a failed bind's policy the cache still
		// showed): read it as it is now.
		err = live.Get(ctx, client.ObjectKeyFromObject(desired), &cur)
	}
	if err != nil {
		return "", err
	}
	return desired.Name, nil
}

// updateEgressPolicy brings an existing policy to desired. It takes over a
// policy left by an earlier claim of the same name, but not one someone
// else made.
func updateEgressPolicy(ctx context.Context, c client.Client, claim *kaironv1.MachineClaim, cur, desired *kaironv1.MachineNetworkPolicy) error {
	ref := metav1.GetControllerOf(cur)
	ours := ref != nil && ref.UID == claim.UID
	if !ours && (ref == nil || ref.Kind != machineClaimKind.Kind || ref.Name != claim.Name) {
		return fmt.Errorf("MachineNetworkPolicy %q exists and does not belong to claim %q", cur.Name, claim.Name)
	}
	if cur.DeletionTimestamp != nil {
		return fmt.Errorf("MachineNetworkPolicy %q is being deleted; it is recreated once gone", cur.Name)
	}
	if ours && equality.Semantic.DeepEqual(cur.Spec, desired.Spec) {
		return nil
	}
	updated := cur.DeepCopy()
	updated.Spec = desired.Spec
	updated.OwnerReferences = append(withoutControllerRef(cur.OwnerReferences), desired.OwnerReferences...)
	if updated.Labels == nil {
		updated.Labels = map[string]string{}
	}
	updated.Labels[kaironv1.LabelMachineClaim] = claim.Name
	return c.Patch(ctx, updated, client.MergeFromWithOptions(cur, client.MergeFromWithOptimisticLock{}))
}

// deleteEgressPolicy deletes the claim's egress policy and says whether it
// is gone: a policy with finalizers (a future node-side enforcer's) lingers
// after the delete, and a release must wait for it.
func deleteEgressPolicy(ctx context.Context, c client.Client, reader client.Reader, claim *kaironv1.MachineClaim) (gone bool, err error) {
	var cur kaironv1.MachineNetworkPolicy
	err = reader.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: egressPolicyName(claim.Name)}, &cur)
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	if ref := metav1.GetControllerOf(&cur); ref == nil || ref.UID != claim.UID {
		return true, nil // not this claim's
	}
	if cur.DeletionTimestamp != nil {
		return false, nil
	}
	err = c.Delete(ctx, &cur, client.Preconditions{UID: ptr.To(cur.UID)})
	if apierrors.IsNotFound(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return len(cur.Finalizers) == 0, nil
}

// PolicyMachinesReconciler keeps a MachineNetworkPolicy's status.machines
// (the MACHINES column) at the number of Machines the nodes report it
// enforced for, summed over status.nodes, which the agents write. Each
// agent writes the count with its own entry, as it sees the others' (the
// node confinement policy takes no other value), so this writes only when
// that view was behind: several nodes reporting at once, or an entry
// removed by someone else.
type PolicyMachinesReconciler struct {
	Client client.Client
}

// SetupWithManager registers the reconciler with mgr.
func (r *PolicyMachinesReconciler) SetupWithManager(mgr manager.Manager) error {
	return builder.ControllerManagedBy(mgr).
		Named("machinenetworkpolicy-machines").
		For(&kaironv1.MachineNetworkPolicy{}).
		Complete(requeue.UntilStopped(r))
}

func (r *PolicyMachinesReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	p := &kaironv1.MachineNetworkPolicy{}
	if err := r.Client.Get(ctx, req.NamespacedName, p); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	var n int32
	for _, node := range p.Status.Nodes {
		n += int32(len(node.Machines))
	}
	// A policy no node has reported on yet needs no write: the API server
	// defaults its status to {machines: 0} (the CRD's defaults), so
	// MACHINES shows 0. That saves a write on the path of every egress
	// bind, to the very object the node is about to report on.
	if p.Status.Machines == n {
		return reconcile.Result{}, nil
	}
	// A merge patch of what differs, this one field, unlocked: the agents'
	// entries are theirs, and a count computed from a stale read is
	// corrected by the reconcile the newer write brings.
	counted := p.DeepCopy()
	counted.Status.Machines = n
	return reconcile.Result{}, patch.Status(ctx, r.Client, p, counted, patch.IgnoreNotFound())
}
