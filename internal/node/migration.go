package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
)

// Cold migration, the node agents' part. kairon-controller picks the target
// and sets the migration Running (internal/controller/machinemigration_controller.go);
// then:
//
//  1. the SOURCE agent saves the VM (Backend.Save leaves it paused) to
//     StateDir/migrations/<namespace>_<migration>.state, serves that file on
//     its migration listener to the migration's target node only
//     (migration_state.go) and annotates the migration state-saved=true
//     (and state-saved-at);
//  2. the TARGET agent downloads the file from the source agent, restores it
//     (Backend.Restore), waits for the instance to run, and switches the
//     Machine's spec.nodeName to itself. The target switches, not the
//     controller: it is the only one that knows the restore worked, and
//     doing it there needs no further handshake while the guest is down;
//  3. the controller sees the Machine Running on the target and marks the
//     migration Succeeded; the source then stops its paused copy and
//     removes the file.
//
// A failure before the switch marks the migration Failed (by the agent that
// failed, with its reason, or by the controller on a timeout); the source
// then resumes its VM, which never left it. While a migration is Running,
// neither agent's Machine reconciler tears down the copy it holds
// (migrationHolds). Before the source pauses or sends the guest it puts its
// finalizer on the migration (holdAsSource), so that deleting a migration
// in flight still ends with the guest running somewhere (releaseSource).
//
// Live migrations share this file's dispatch, finalizer and clean-up; their
// transfer is in live_migration.go.

// migrationRetry is how soon an agent looks again at a migration waiting
// for something that sends no event it watches (a restored VM booting).
const migrationRetry = 250 * time.Millisecond

func (a *Agent) setupMigrationController() error {
	return ctrl.NewControllerManagedBy(a.mgr).
		Named("node-migration").
		// A migration's reconcile blocks while the guest moves; others go on.
		WithOptions(controller.Options{SkipNameValidation: ptr.To(true), MaxConcurrentReconciles: 4}).
		For(&kaironv1.MachineMigration{}).
		Complete(requeue.UntilStopped(reconcile.Func(a.reconcileMigration)))
}

// migrationStatePath is where the source keeps a migration's saved state.
func (a *Agent) migrationStatePath(namespace, name string) string {
	return filepath.Join(a.opts.StateDir, "migrations", namespace+"_"+name+".state")
}

// migrationIncomingPath is where the target downloads it to.
func (a *Agent) migrationIncomingPath(namespace, name string) string {
	return filepath.Join(a.opts.StateDir, "migrations", namespace+"_"+name+".incoming")
}

func isCold(mig *kaironv1.MachineMigration) bool {
	return mig.Spec.Strategy == "" || mig.Spec.Strategy == kaironv1.MigrationCold
}

// reconcileMigration plays this node's part, source or target, in a
// migration. The target's part of a live migration runs when the source
// connects (receiveLive); here it only cleans up after a failure.
func (a *Agent) reconcileMigration(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	mig := &kaironv1.MachineMigration{}
	if err := a.client.Get(ctx, req.NamespacedName, mig); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if mig.Spec.MachineName == "" {
		return reconcile.Result{}, nil
	}
	if mig.Status.SourceNode == a.opts.NodeName && !mig.Status.Phase.IsTerminal() {
		// The source acts on what it last wrote itself (its finalizer, the
		// hand-over annotation), and the event of one write can bring it
		// here before the cache has the next: a stale view would save or
		// send the guest a second time.
		if err := a.mgr.GetAPIReader().Get(ctx, req.NamespacedName, mig); err != nil {
			return reconcile.Result{}, client.IgnoreNotFound(err)
		}
	}
	ctx = log.IntoContext(ctx, log.FromContext(ctx).WithValues("machine", mig.Spec.MachineName))
	if !mig.DeletionTimestamp.IsZero() {
		// Deleted in flight: the source must not leave its guest paused.
		if a.opts.NodeName == mig.Status.SourceNode {
			return reconcile.Result{}, a.releaseSource(ctx, mig)
		}
		return reconcile.Result{}, nil
	}
	switch a.opts.NodeName {
	case mig.Status.SourceNode:
		if !isCold(mig) {
			return a.migrateSourceLive(ctx, mig)
		}
		return a.migrateSource(ctx, mig)
	case mig.Status.TargetNode:
		return a.migrateTarget(ctx, mig)
	}
	return reconcile.Result{}, nil
}

// migrateSource saves the VM and, once the migration ended, stops the
// paused copy (Succeeded) or resumes it (Failed before the switch).
func (a *Agent) migrateSource(ctx context.Context, mig *kaironv1.MachineMigration) (reconcile.Result, error) {
	id := instanceID(mig.Namespace, mig.Spec.MachineName)
	path := a.migrationStatePath(mig.Namespace, mig.Name)
	if mig.Status.Phase.IsTerminal() {
		return reconcile.Result{}, a.releaseSource(ctx, mig)
	}
	if mig.Status.Phase != kaironv1.MigrationRunning || mig.Annotations[kaironv1.AnnotationMigrationStateSaved] == "true" {
		return reconcile.Result{}, nil
	}
	machine := &kaironv1.Machine{}
	if err := a.client.Get(ctx, client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}, machine); err != nil {
		// Not (or no longer) on this node: the controller fails the migration.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if machine.Spec.NodeName != a.opts.NodeName {
		return reconcile.Result{}, nil
	}
	if err := a.holdAsSource(ctx, mig); err != nil {
		return reconcile.Result{}, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return reconcile.Result{}, err
	}
	savedAt := time.Now()
	if info, err := os.Stat(path); err == nil {
		// Saved before, and the annotation below failed: the file is
		// complete (it only gets its name once it is), so announce it.
		savedAt = info.ModTime()
	} else if err := a.save(ctx, id, path); err != nil {
		if resumeErr := a.opts.Backend.Resume(ctx, id); resumeErr != nil && !errors.Is(resumeErr, backend.ErrNotFound) {
			log.FromContext(ctx).Error(resumeErr, "resuming VM after a failed save")
		}
		return reconcile.Result{}, a.failMigration(ctx, mig, kaironv1.MigrationReasonSaveFailed, fmt.Sprintf("saving the VM on node %s: %v; it keeps running there", a.opts.NodeName, err))
	}
	base := mig.DeepCopy()
	if mig.Annotations == nil {
		mig.Annotations = map[string]string{}
	}
	mig.Annotations[kaironv1.AnnotationMigrationStateSaved] = "true"
	mig.Annotations[kaironv1.AnnotationMigrationStateSavedAt] = savedAt.UTC().Format(time.RFC3339Nano)
	if err := a.client.Patch(ctx, mig, client.MergeFrom(base)); err != nil {
		// The retry announces the saved file; the VM stays paused meanwhile.
		return reconcile.Result{}, err
	}
	log.FromContext(ctx).Info("VM saved for migration", "migration", klog.KObj(mig), "target", klog.KRef("", mig.Status.TargetNode))
	return reconcile.Result{}, nil
}

// save writes the VM's state under a temporary name and renames it to path
// once complete, so that the target never fetches half a file.
func (a *Agent) save(ctx context.Context, id, path string) error {
	tmp := path + ".saving"
	if err := a.opts.Backend.Save(ctx, id, tmp); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// holdAsSource puts the source's finalizer on the migration before the
// guest is paused or sent, so deleting the migration cannot strand it.
func (a *Agent) holdAsSource(ctx context.Context, mig *kaironv1.MachineMigration) error {
	if controllerutil.ContainsFinalizer(mig, kaironv1.FinalizerMigrationSource) {
		return nil
	}
	base := mig.DeepCopy()
	controllerutil.AddFinalizer(mig, kaironv1.FinalizerMigrationSource)
	// No optimistic lock: the controller writes the status meanwhile, and
	// only this agent ever puts a finalizer on the migration.
	return a.client.Patch(ctx, mig, client.MergeFrom(base))
}

// releaseSource cleans up after a migration this node was the source of
// (ended, or deleted in flight) and lets the migration go.
func (a *Agent) releaseSource(ctx context.Context, mig *kaironv1.MachineMigration) error {
	id := instanceID(mig.Namespace, mig.Spec.MachineName)
	if err := a.finishSource(ctx, mig, id, a.migrationStatePath(mig.Namespace, mig.Name)); err != nil {
		return err
	}
	if !controllerutil.ContainsFinalizer(mig, kaironv1.FinalizerMigrationSource) {
		return nil
	}
	base := mig.DeepCopy()
	controllerutil.RemoveFinalizer(mig, kaironv1.FinalizerMigrationSource)
	return client.IgnoreNotFound(a.client.Patch(ctx, mig, client.MergeFrom(base)))
}

// finishSource cleans up after a migration this node was the source of.
// The saved file is the marker that there is something to clean up.
func (a *Agent) finishSource(ctx context.Context, mig *kaironv1.MachineMigration, id, path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	machine := &kaironv1.Machine{}
	err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}, machine)
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err == nil && machine.Spec.NodeName == a.opts.NodeName && machine.DeletionTimestamp.IsZero() {
		// Failed before the switch: the VM never left; let it run again.
		if err := a.opts.Backend.Resume(ctx, id); err != nil && !errors.Is(err, backend.ErrNotFound) {
			return fmt.Errorf("resuming VM after migration %s failed: %w", mig.Name, err)
		}
		log.FromContext(ctx).Info("VM resumed on the source after a failed migration", "migration", klog.KObj(mig), "reason", mig.Status.Reason)
	} else if err := a.teardown(ctx, id); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	a.wake(mig.Namespace + "/" + mig.Spec.MachineName)
	return nil
}

// migrateTarget fetches and restores the saved VM, then switches the
// Machine's spec.nodeName to this node.
func (a *Agent) migrateTarget(ctx context.Context, mig *kaironv1.MachineMigration) (reconcile.Result, error) {
	id := instanceID(mig.Namespace, mig.Spec.MachineName)
	incoming := a.migrationIncomingPath(mig.Namespace, mig.Name)
	key := client.ObjectKey{Namespace: mig.Namespace, Name: mig.Spec.MachineName}
	// The Machine is not in this agent's cache until it is switched here.
	machine := &kaironv1.Machine{}
	err := a.mgr.GetAPIReader().Get(ctx, key, machine)
	if err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, err
	}
	onThisNode := err == nil && machine.Spec.NodeName == a.opts.NodeName
	if mig.Status.Phase.IsTerminal() {
		_ = os.Remove(incoming)
		if !onThisNode {
			// Failed before the switch: drop a restored copy, if any.
			return reconcile.Result{}, a.teardown(ctx, id)
		}
		return reconcile.Result{}, nil
	}
	if !isCold(mig) || mig.Status.Phase != kaironv1.MigrationRunning || mig.Annotations[kaironv1.AnnotationMigrationStateSaved] != "true" || err != nil {
		return reconcile.Result{}, nil
	}
	if onThisNode {
		_ = os.Remove(incoming)
		return reconcile.Result{}, nil // switched; the controller finishes
	}
	if machine.Spec.NodeName != mig.Status.SourceNode {
		return reconcile.Result{}, nil // moved by someone else; the controller fails it
	}

	instance, err := a.opts.Backend.Get(ctx, id)
	if errors.Is(err, backend.ErrNotFound) {
		if err := a.fetchState(ctx, mig, incoming); err != nil {
			_ = os.Remove(incoming)
			return reconcile.Result{}, a.failMigration(ctx, mig, kaironv1.MigrationReasonTransferFailed,
				fmt.Sprintf("fetching the saved VM from node %s: %v", mig.Status.SourceNode, err))
		}
		instance, err = a.restore(ctx, machine, id, incoming)
		if err != nil {
			_ = a.teardown(ctx, id)
			_ = os.Remove(incoming)
			return reconcile.Result{}, a.failMigration(ctx, mig, kaironv1.MigrationReasonRestoreFailed,
				fmt.Sprintf("restoring the VM on node %s: %v", a.opts.NodeName, err))
		}
	} else if err != nil {
		return reconcile.Result{}, err
	}
	switch instance.Phase {
	case backend.Booting:
		return reconcile.Result{RequeueAfter: migrationRetry}, nil
	case backend.Exited:
		_ = a.teardown(ctx, id)
		_ = os.Remove(incoming)
		return reconcile.Result{}, a.failMigration(ctx, mig, kaironv1.MigrationReasonRestoreFailed,
			fmt.Sprintf("the restored VM exited on node %s: %s", a.opts.NodeName, instance.Reason))
	case backend.Paused:
		if err := a.opts.Backend.Resume(ctx, id); err != nil {
			return reconcile.Result{}, err
		}
	}

	if err := a.switchToThisNode(ctx, machine, mig); err != nil {
		return reconcile.Result{}, err
	}
	_ = os.Remove(incoming)
	log.FromContext(ctx).Info("Machine switched to this node after migration", "migration", klog.KObj(mig), "source", klog.KRef("", mig.Status.SourceNode))
	return reconcile.Result{}, nil
}

// restore starts the Machine's VM from the downloaded state.
func (a *Agent) restore(ctx context.Context, machine *kaironv1.Machine, id, path string) (backend.Instance, error) {
	if err := a.awaitImage(ctx, machine); err != nil {
		return backend.Instance{}, err
	}
	spec, err := a.attach(machine, id)
	if err != nil {
		return backend.Instance{}, err
	}
	return a.opts.Backend.Restore(ctx, spec, path)
}

// failMigration marks a Running migration Failed with this agent's reason.
// A conflict (the other agent consumed a transfer token or added its
// finalizer meanwhile) is retried on the migration read afresh, as long as
// it is the same migration and still Running: a failure the agent saw must
// not be lost to a write that had nothing to do with it.
func (a *Agent) failMigration(ctx context.Context, mig *kaironv1.MachineMigration, reason kaironv1.MigrationReason, message string) error {
	uid := mig.UID
	failed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if failed {
			if err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(mig), mig); err != nil {
				return client.IgnoreNotFound(err)
			}
		}
		failed = true
		if mig.UID != uid || mig.Status.Phase != kaironv1.MigrationRunning {
			return nil
		}
		base := mig.DeepCopy()
		now := metav1.Now()
		mig.Status.Phase = kaironv1.MigrationFailed
		mig.Status.Reason = reason
		mig.Status.Message = message
		mig.Status.CompletionTime = &now
		if err := patch.Status(ctx, a.client, base, mig, patch.WithOptimisticLock()); err != nil {
			*mig = *base
			return err
		}
		log.FromContext(ctx).Info("migration failed", "migration", klog.KObj(mig), "reason", reason, "message", message)
		a.recorder.Eventf(mig, nil, corev1.EventTypeWarning, string(reason), "Migrate", "%s", message)
		return nil
	})
	return err
}

// migrationHolds reports whether a Running migration of the Machine
// passes through this node, so its VM here must not be torn down even
// though the Machine is (or is not yet) placed elsewhere.
func (a *Agent) migrationHolds(ctx context.Context, namespace, name string) (bool, error) {
	return a.migrationHoldsIn(ctx, a.client, namespace, name)
}

// migrationHoldsIn is migrationHolds reading through reader.
func (a *Agent) migrationHoldsIn(ctx context.Context, reader client.Reader, namespace, name string) (bool, error) {
	var list kaironv1.MachineMigrationList
	if err := reader.List(ctx, &list, client.InNamespace(namespace)); err != nil {
		return false, err
	}
	for _, mig := range list.Items {
		if mig.Spec.MachineName == name && mig.Status.Phase == kaironv1.MigrationRunning &&
			(mig.Status.SourceNode == a.opts.NodeName || mig.Status.TargetNode == a.opts.NodeName) {
			return true, nil
		}
	}
	return false, nil
}
