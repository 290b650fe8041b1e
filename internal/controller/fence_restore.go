package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// A Machine of a fenced node with a Ready MachineSnapshot comes back under
// its own name: the old object is deleted (its VM finalizer finished, the
// VM is gone with the node) and a new one created with the same labels,
// annotations, owners and spec, spec.nodeName cleared so the scheduler
// places it elsewhere (never on a fenced node), and spec.restoreFrom naming
// the snapshot, so the node agent there starts it from the saved state
// (internal/node/machine_snapshot.go). spec.restoreFrom cannot be set on an
// existing Machine, hence the new object. A claim bound to it carries
// AnnotationFenceRestoring meanwhile, which keeps the claim controller from
// declaring it Lost while the name is briefly free.

// pendingRestore is a restore whose old Machine is deleted and whose new
// one is not created yet.
type pendingRestore struct {
	old      *kaironv1.Machine
	node     string
	decision rules.FenceDecision
}

// restore carries out one FenceRestore decision. It reports whether the new
// Machine exists.
func (r *FenceReconciler) restore(ctx context.Context, node string, d rules.FenceDecision) (bool, error) {
	m := d.Machine
	if d.Claim != "" {
		if err := r.markClaimRestoring(ctx, m.Namespace, d.Claim, d.Snapshot.Name); err != nil {
			return false, err
		}
	}
	key := types.NamespacedName{Namespace: m.Namespace, Name: m.Name}
	r.mu.Lock()
	if r.restores == nil {
		r.restores = map[types.NamespacedName]*pendingRestore{}
	}
	r.restores[key] = &pendingRestore{old: m.DeepCopy(), node: node, decision: d}
	r.mu.Unlock()
	if err := r.remove(ctx, m); err != nil {
		return false, err
	}
	return r.recreate(ctx, key)
}

// finishRestores creates the new Machines of every pending restore whose
// old Machine is gone; the old one is no longer on the fenced node, so the
// plan does not list it again. It reports whether some are still pending.
func (r *FenceReconciler) finishRestores(ctx context.Context) (bool, error) {
	r.mu.Lock()
	keys := make([]types.NamespacedName, 0, len(r.restores))
	for k := range r.restores {
		keys = append(keys, k)
	}
	r.mu.Unlock()
	pending := false
	var firstErr error
	for _, k := range keys {
		done, err := r.recreate(ctx, k)
		if err != nil && firstErr == nil {
			firstErr = err
		}
		pending = pending || !done
	}
	return pending, firstErr
}

// recreate creates the restored Machine once the old one is gone.
func (r *FenceReconciler) recreate(ctx context.Context, key types.NamespacedName) (bool, error) {
	r.mu.Lock()
	p := r.restores[key]
	r.mu.Unlock()
	if p == nil {
		return true, nil
	}
	old, d := p.old, p.decision
	var cur kaironv1.Machine
	err := r.APIReader.Get(ctx, key, &cur)
	switch {
	case err == nil && cur.UID == old.UID:
		return false, nil // still being deleted
	case err == nil:
		// A Machine under the name that is not the old one: ours, created
		// by an earlier pass, or the user's.
		return r.restored(ctx, key, old.Namespace, d.Claim)
	case !apierrors.IsNotFound(err):
		return false, err
	}
	var snap kaironv1.MachineSnapshot
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: old.Namespace, Name: d.Snapshot.Name}, &snap); err != nil {
		return false, fmt.Errorf("reading snapshot %s: %w", d.Snapshot.Name, err)
	}
	restored, err := restoredMachine(old, p.node, &snap)
	if err != nil {
		return false, err
	}
	if err := r.Client.Create(ctx, restored); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return false, nil
		}
		return false, fmt.Errorf("recreating machine %s from snapshot %s: %w", key, d.Snapshot.Name, err)
	}
	log.FromContext(ctx).Info("Restored a machine of a fenced node", "machine", klog.KObj(restored), "snapshot", d.Snapshot.Name)
	r.Recorder.Eventf(restored, nil, corev1.EventTypeNormal, kaironv1.EventReasonFenceRestored, "Fence", "%s", d.Receipt(p.node))
	return r.restored(ctx, key, old.Namespace, d.Claim)
}

// restored ends a restore whose new Machine exists: its claim loses the
// restoring annotation, then the restore is forgotten (kept, and tried
// again, while that fails).
func (r *FenceReconciler) restored(ctx context.Context, key types.NamespacedName, namespace, claim string) (bool, error) {
	if err := r.clearClaimRestoring(ctx, namespace, claim); err != nil {
		return false, err
	}
	r.mu.Lock()
	delete(r.restores, key)
	r.mu.Unlock()
	return true, nil
}

// restoredMachine is old as a new object restored from snap
// (rules.RestoredMachine: the snapshot's shape and spec.restoreFrom), with
// old's labels, annotations, owners and the rest of its spec, to be placed
// off node.
func restoredMachine(old *kaironv1.Machine, node string, snap *kaironv1.MachineSnapshot) (*kaironv1.Machine, error) {
	m, err := rules.RestoredMachine(snap, old.Name)
	if err != nil {
		return nil, err
	}
	spec := old.Spec.DeepCopy()
	spec.CPU, spec.Memory, spec.Image, spec.RestoreFrom = m.Spec.CPU, m.Spec.Memory, m.Spec.Image, m.Spec.RestoreFrom
	spec.NodeName = ""
	m.Spec = *spec
	m.Labels = old.Labels
	m.OwnerReferences = old.OwnerReferences
	m.Annotations = map[string]string{}
	for k, v := range old.Annotations {
		if k != kaironv1.AnnotationCordonEvacuateAttemptedAt && k != corev1.LastAppliedConfigAnnotation {
			m.Annotations[k] = v
		}
	}
	m.Annotations[kaironv1.AnnotationFencedFrom] = node
	return m, nil
}

// markClaimRestoring puts AnnotationFenceRestoring on the claim.
func (r *FenceReconciler) markClaimRestoring(ctx context.Context, namespace, name, snapshot string) error {
	return r.annotateClaim(ctx, namespace, name, func(a map[string]string) { a[kaironv1.AnnotationFenceRestoring] = snapshot })
}

// clearClaimRestoring takes AnnotationFenceRestoring off the claim.
func (r *FenceReconciler) clearClaimRestoring(ctx context.Context, namespace, name string) error {
	if name == "" {
		return nil
	}
	return r.annotateClaim(ctx, namespace, name, func(a map[string]string) { delete(a, kaironv1.AnnotationFenceRestoring) })
}

func (r *FenceReconciler) annotateClaim(ctx context.Context, namespace, name string, change func(map[string]string)) error {
	var claim kaironv1.MachineClaim
	if err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &claim); err != nil {
		return client.IgnoreNotFound(err)
	}
	updated := claim.DeepCopy()
	if updated.Annotations == nil {
		updated.Annotations = map[string]string{}
	}
	change(updated.Annotations)
	if len(updated.Annotations) == len(claim.Annotations) && updated.Annotations[kaironv1.AnnotationFenceRestoring] == claim.Annotations[kaironv1.AnnotationFenceRestoring] {
		return nil
	}
	// No lock: a merge patch of one annotation leaves the rest of the
	// claim, which its controller writes meanwhile, as it is.
	return client.IgnoreNotFound(r.Client.Patch(ctx, updated, client.MergeFrom(&claim)))
}
