package controller

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/rules"
)

// endMigrations ends the MachineMigrations through a fenced node: its
// agent, which would have moved the guest or failed the migration, is gone
// (the operator said so). A migration in flight whose source or target is
// the node goes Failed with reason NodeFenced; one still Pending whose
// Machine is on the node too. The exception is a Running migration whose
// Machine already switched to a target that is not fenced: the guest runs
// there, and the migration controller ends it. Then the
// FinalizerMigrationSource the dead source agent put on its migrations is
// released in its place: only that agent would have removed it, and the
// VM it held runs nowhere now (the agent, should it come back, destroys
// what is left of it; internal/node/rejoin_fence.go). Until the migration
// has ended, the rejoining agent would keep that VM for it.
func (r *FenceReconciler) endMigrations(ctx context.Context, node string, plan []rules.FenceDecision) error {
	var list kaironv1.MachineMigrationList
	if err := r.APIReader.List(ctx, &list); err != nil {
		return fmt.Errorf("listing machine migrations: %w", err)
	}
	onNode := map[types.NamespacedName]bool{}
	for _, d := range plan {
		onNode[client.ObjectKeyFromObject(d.Machine)] = true
	}
	var errs []error
	for i := range list.Items {
		mig := &list.Items[i]
		end := migrationEndOnFence(mig, node, onNode[types.NamespacedName{Namespace: mig.Namespace, Name: mig.Spec.MachineName}])
		if end == "" {
			continue
		}
		if !mig.Status.Phase.IsTerminal() {
			switched, err := r.switchedAway(ctx, mig, node)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !switched {
				if err := r.failFencedMigration(ctx, mig, node, end); err != nil {
					errs = append(errs, fmt.Errorf("migration %s/%s: %w", mig.Namespace, mig.Name, err))
					continue
				}
			}
		}
		if mig.Status.SourceNode == node {
			if err := r.releaseSourceFinalizer(ctx, mig); err != nil {
				errs = append(errs, fmt.Errorf("migration %s/%s: %w", mig.Namespace, mig.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}

// migrationEndOnFence says which end of mig the fenced node is: "source",
// "target", or "" if neither. A Pending migration has no source yet: its
// Machine's node (machineOnNode) will be.
func migrationEndOnFence(mig *kaironv1.MachineMigration, node string, machineOnNode bool) string {
	switch {
	case mig.Status.SourceNode == node:
		return "source"
	case mig.Status.TargetNode == node:
		return "target"
	case mig.Status.SourceNode == "" && !mig.Status.Phase.IsTerminal() && machineOnNode:
		return "source"
	}
	return ""
}

// switchedAway: mig is Running and its Machine already runs on the target,
// which is not the fenced node: the move is done but for the paperwork.
func (r *FenceReconciler) switchedAway(ctx context.Context, mig *kaironv1.MachineMigration, node string) (bool, error) {
	if mig.Status.Phase != kaironv1.MigrationRunning || mig.Status.TargetNode == "" || mig.Status.TargetNode == node {
		return false, nil
	}
	var m kaironv1.Machine
	err := r.APIReader.Get(ctx, client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}, &m)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return m.Spec.NodeName == mig.Status.TargetNode, nil
}

// failFencedMigration marks mig Failed, reason NodeFenced.
func (r *FenceReconciler) failFencedMigration(ctx context.Context, mig *kaironv1.MachineMigration, node, end string) error {
	desired := mig.DeepCopy()
	var message string
	if end == "source" {
		message = fmt.Sprintf("node %s, the migration's source, was fenced (kaironctl fence): the guest there is gone with it; "+
			"the fence brings machine %s back or replaces it (kaironctl fence prints what becomes of it)", node, mig.Spec.MachineName)
	} else {
		message = fmt.Sprintf("node %s, the migration's target, was fenced (kaironctl fence) before machine %s ran there; it stays on node %s",
			node, mig.Spec.MachineName, mig.Status.SourceNode)
	}
	failMigration(desired, kaironv1.MigrationReasonNodeFenced, message)
	if err := patch.Status(ctx, r.Client, mig, desired, patch.WithOptimisticLock()); err != nil {
		return err
	}
	log.FromContext(ctx).Info("Migration ended by a fence", "migration", klog.KObj(mig), "node", node, "end", end)
	r.Recorder.Eventf(desired, nil, corev1.EventTypeWarning, string(kaironv1.MigrationReasonNodeFenced), "Fence", "%s", message)
	*mig = *desired
	return nil
}

// releaseSourceFinalizer removes FinalizerMigrationSource from mig, in
// the fenced source agent's place.
func (r *FenceReconciler) releaseSourceFinalizer(ctx context.Context, mig *kaironv1.MachineMigration) error {
	if !controllerutil.ContainsFinalizer(mig, kaironv1.FinalizerMigrationSource) {
		return nil
	}
	updated := mig.DeepCopy()
	controllerutil.RemoveFinalizer(updated, kaironv1.FinalizerMigrationSource)
	// Locked to the version read: a finalizer put on since is another
	// agent's, for a migration this one did not see.
	err := r.Client.Patch(ctx, updated, client.MergeFromWithOptions(mig, client.MergeFromWithOptimisticLock{}))
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("releasing finalizer %s: %w", kaironv1.FinalizerMigrationSource, err)
	}
	log.FromContext(ctx).Info("Released the fenced source's hold on a migration", "migration", klog.KObj(mig))
	return nil
}
