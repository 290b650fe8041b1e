package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
)

// MachineSnapshots, the node agent's part (docs/guides/snapshots.md).
//
// kairon-controller hands a Pending MachineSnapshot to the node running its
// Machine by writing that node in status.node. The agent of that node,
// once the VM is Running:
//
//  1. saves it with Backend.Save, which pauses the guest, to
//     SnapshotDir/<namespace>_<name>_<uid>.state.partial;
//  2. resumes the guest at once: it was paused only for the save
//     (status.pauseMillis);
//  3. renames the file complete and reports the snapshot Ready with its
//     store (Options.SnapshotStore), file, size, time and the Machine's
//     shape. A failed save fails the snapshot; it is not retried.
//
// A Machine with spec.restoreFrom is placed by the scheduler only on a node
// labelled with the snapshot's store; its agent starts it from the file
// (restoreSnapshot) instead of booting it, as a clone (backend.Cloner): the
// guest's memory is the snapshot's, its address, MAC and hostname are the
// new Machine's.
//
// A file is deleted by any agent of its store once its MachineSnapshot is
// gone (sweepSnapshots): deleting the object deletes the state.

// snapshotSweepInterval is how often an agent looks for state files whose
// MachineSnapshot is gone, besides every deletion it sees.
const snapshotSweepInterval = time.Minute

// snapshotPartialAge is how old a .partial file must be before the sweep
// deletes it: no save takes this long.
const snapshotPartialAge = time.Hour

func (o *Options) snapshotDefaults() error {
	if o.SnapshotDir == "" {
		o.SnapshotDir = filepath.Join(o.StateDir, "machinesnapshots")
	}
	if o.SnapshotStore == "" {
		o.SnapshotStore = kaironv1.NodeLocalSnapshotStore(o.NodeName)
	}
	if errs := validation.IsValidLabelValue(o.SnapshotStore); len(errs) > 0 {
		return fmt.Errorf("--snapshot-store %q: it is the Node label %s, so %s", o.SnapshotStore, kaironv1.LabelNodeSnapshotStore, strings.Join(errs, "; "))
	}
	return nil
}

// snapshotFileName is the state file of snap in its store: unique per
// object, so a snapshot deleted and created again under the same name
// never finds the old state.
func snapshotFileName(snap *kaironv1.MachineSnapshot) string {
	return snap.Namespace + "_" + snap.Name + "_" + string(snap.UID) + ".state"
}

// snapshotFileUID is the UID in a state file's name, "" if it is none.
func snapshotFileUID(name string) types.UID {
	base, ok := strings.CutSuffix(name, ".state")
	if !ok {
		return ""
	}
	i := strings.LastIndexByte(base, '_')
	if i < 0 {
		return ""
	}
	return types.UID(base[i+1:])
}

func (a *Agent) setupSnapshotController() error {
	return ctrl.NewControllerManagedBy(a.mgr).
		Named("node-machinesnapshot").
		// A save blocks its reconcile; snapshots of other VMs go on.
		WithOptions(controller.Options{SkipNameValidation: ptr.To(true), MaxConcurrentReconciles: 2}).
		For(&kaironv1.MachineSnapshot{}).
		Complete(requeue.UntilStopped(reconcile.Func(a.reconcileSnapshot)))
}

// reconcileSnapshot takes a Pending snapshot handed to this node.
func (a *Agent) reconcileSnapshot(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	snap := &kaironv1.MachineSnapshot{}
	if err := a.client.Get(ctx, req.NamespacedName, snap); err != nil {
		if apierrors.IsNotFound(err) {
			// Gone: its file may be this store's to delete.
			return reconcile.Result{}, a.sweepSnapshotFiles(ctx)
		}
		return reconcile.Result{}, err
	}
	if !snapshotIsMine(snap, a.opts.NodeName) {
		return reconcile.Result{}, nil
	}
	a.lifecycle.RLock()
	defer a.lifecycle.RUnlock()
	if a.stopping.Load() {
		return reconcile.Result{}, nil
	}
	machine := &kaironv1.Machine{}
	if err := a.client.Get(ctx, client.ObjectKey{Namespace: snap.Namespace, Name: snap.Spec.MachineName}, machine); err != nil {
		// Not on this node (any more): kairon-controller hands it on.
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if machine.Spec.NodeName != a.opts.NodeName || !machine.DeletionTimestamp.IsZero() {
		return reconcile.Result{}, nil
	}
	id := instanceID(machine.Namespace, machine.Name)
	if held, err := a.migrationHolds(ctx, machine.Namespace, machine.Name); err != nil || held {
		return reconcile.Result{RequeueAfter: a.opts.Interval}, err
	}
	lock := a.snapshotLock(id)
	lock.Lock()
	defer lock.Unlock()
	// The cache may be behind this agent's own write of the last round:
	// never take one snapshot twice.
	if err := a.mgr.GetAPIReader().Get(ctx, req.NamespacedName, snap); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	if !snapshotIsMine(snap, a.opts.NodeName) {
		return reconcile.Result{}, nil
	}
	instance, err := a.opts.Backend.Get(ctx, id)
	if err != nil || instance.Phase != backend.Running {
		// Booting, paused by someone else, or not started yet: look again.
		return reconcile.Result{RequeueAfter: a.opts.Interval}, ignoreInstanceNotFound(err)
	}
	return reconcile.Result{}, a.takeSnapshot(ctx, snap, machine, id)
}

func ignoreInstanceNotFound(err error) error {
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	return err
}

// snapshotIsMine: snap waits to be taken by node.
func snapshotIsMine(snap *kaironv1.MachineSnapshot, node string) bool {
	return snap.Status.Node == node && snap.DeletionTimestamp.IsZero() &&
		(snap.Status.Phase == "" || snap.Status.Phase == kaironv1.SnapshotPending)
}

// snapshotLock serializes the snapshots of VM id.
func (a *Agent) snapshotLock(id string) *sync.Mutex {
	lock, _ := a.snapshotting.LoadOrStore(id, &sync.Mutex{})
	return lock.(*sync.Mutex)
}

// takeSnapshot saves the running VM of machine for snap, resumes it and
// reports the snapshot Ready (or Failed).
func (a *Agent) takeSnapshot(ctx context.Context, snap *kaironv1.MachineSnapshot, machine *kaironv1.Machine, id string) error {
	logger := log.FromContext(ctx).WithValues("machinesnapshot", klog.KObj(snap), "machine", klog.KObj(machine))
	name := snapshotFileName(snap)
	path := filepath.Join(a.opts.SnapshotDir, name)
	if err := os.MkdirAll(a.opts.SnapshotDir, 0o700); err != nil {
		return a.failSnapshot(ctx, snap, machine, fmt.Sprintf("creating the snapshot directory %s on node %s: %v", a.opts.SnapshotDir, a.opts.NodeName, err))
	}
	tmp := path + ".partial"
	pausedAt := time.Now()
	saveErr := a.opts.Backend.Save(ctx, id, tmp)
	// Save leaves the guest paused, whether or not it wrote everything:
	// it runs again before anything else happens.
	resumeErr := a.resumeAfterSnapshot(ctx, id)
	paused := time.Since(pausedAt)
	if saveErr == nil {
		saveErr = os.Rename(tmp, path)
	}
	if resumeErr != nil {
		logger.Error(resumeErr, "resuming the guest after its snapshot")
		a.event(machine, corev1.EventTypeWarning, kaironv1.SnapshotReasonSaveFailed,
			fmt.Sprintf("the guest could not be resumed after MachineSnapshot %s: %v", snap.Name, resumeErr))
	}
	if saveErr != nil {
		_ = os.Remove(tmp)
		return a.failSnapshot(ctx, snap, machine, fmt.Sprintf("saving the guest on node %s: %v (it was resumed)", a.opts.NodeName, saveErr))
	}
	info, err := os.Stat(path)
	if err != nil {
		return a.failSnapshot(ctx, snap, machine, fmt.Sprintf("the saved state %s: %v", path, err))
	}
	memory := machine.Spec.Memory.DeepCopy()
	if memory.IsZero() {
		memory = defaultMachineMemory()
	}
	taken := metav1.NewTime(pausedAt)
	message := fmt.Sprintf("saved on node %s to store %s in %dms (guest paused %dms), %d MiB",
		a.opts.NodeName, a.opts.SnapshotStore, paused.Milliseconds(), paused.Milliseconds(), info.Size()>>20)
	err = a.writeSnapshotStatus(ctx, snap, func(s *kaironv1.MachineSnapshotStatus) {
		s.Phase = kaironv1.SnapshotReady
		s.Message = message
		s.Store = a.opts.SnapshotStore
		s.File = name
		s.SizeBytes = info.Size()
		s.TakenAt = &taken
		s.PauseMillis = paused.Milliseconds()
		s.CPU = max(machine.Spec.CPU, 1)
		s.Memory = &memory
		s.Image = machineImage(machine)
		s.ImageDigest = machine.Status.ImageDigest
		setSnapshotReady(snap, metav1.ConditionTrue, kaironv1.SnapshotReasonTaken, message)
	})
	if err != nil {
		return err
	}
	logger.Info("snapshot taken", "path", path, "bytes", info.Size(), "paused", paused)
	a.recorder.Eventf(snap, machine, corev1.EventTypeNormal, kaironv1.SnapshotReasonTaken, "Snapshot", "%s", message)
	a.event(machine, corev1.EventTypeNormal, kaironv1.SnapshotReasonTaken, fmt.Sprintf("MachineSnapshot %s: %s", snap.Name, message))
	return nil
}

// resumeAfterSnapshot resumes VM id, trying a few times: a guest left
// paused by a snapshot is down.
func (a *Agent) resumeAfterSnapshot(ctx context.Context, id string) error {
	var err error
	for attempt := range 3 {
		if attempt > 0 {
			time.Sleep(200 * time.Millisecond)
		}
		if err = a.opts.Backend.Resume(context.WithoutCancel(ctx), id); err == nil || errors.Is(err, backend.ErrNotFound) {
			return nil
		}
	}
	return err
}

// failSnapshot reports snap Failed for good.
func (a *Agent) failSnapshot(ctx context.Context, snap *kaironv1.MachineSnapshot, machine *kaironv1.Machine, message string) error {
	err := a.writeSnapshotStatus(ctx, snap, func(s *kaironv1.MachineSnapshotStatus) {
		s.Phase = kaironv1.SnapshotFailed
		s.Message = message
		setSnapshotReady(snap, metav1.ConditionFalse, kaironv1.SnapshotReasonSaveFailed, message)
	})
	if err != nil {
		return err
	}
	log.FromContext(ctx).Info("snapshot failed", "machinesnapshot", klog.KObj(snap), "why", message)
	a.recorder.Eventf(snap, machine, corev1.EventTypeWarning, kaironv1.SnapshotReasonSaveFailed, "Snapshot", "%s", message)
	a.event(machine, corev1.EventTypeWarning, kaironv1.SnapshotReasonSaveFailed, fmt.Sprintf("MachineSnapshot %s: %s", snap.Name, message))
	return nil
}

// writeSnapshotStatus applies set to snap's status and writes it, reading
// the snapshot afresh after a conflict (kairon-controller's writes) as long
// as it still waits for this node.
func (a *Agent) writeSnapshotStatus(ctx context.Context, snap *kaironv1.MachineSnapshot, set func(*kaironv1.MachineSnapshotStatus)) error {
	first := true
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if !first {
			if err := a.mgr.GetAPIReader().Get(ctx, client.ObjectKeyFromObject(snap), snap); err != nil {
				return client.IgnoreNotFound(err)
			}
			if !snapshotIsMine(snap, a.opts.NodeName) {
				return nil
			}
		}
		first = false
		base := snap.DeepCopy()
		set(&snap.Status)
		snap.Status.Node = a.opts.NodeName
		return patch.Status(ctx, a.client, base, snap, patch.WithOptimisticLock(), patch.IgnoreNotFound())
	})
}

func setSnapshotReady(snap *kaironv1.MachineSnapshot, status metav1.ConditionStatus, reason, message string) {
	meta.SetStatusCondition(&snap.Status.Conditions, metav1.Condition{
		Type: kaironv1.ConditionReady.String(), Status: status, Reason: reason, Message: message,
		ObservedGeneration: snap.Generation,
	})
}

// machineImage is the Machine's spec.image with its default.
func machineImage(machine *kaironv1.Machine) string {
	if machine.Spec.Image == "" {
		return "default"
	}
	return machine.Spec.Image
}

// errOtherStore: the snapshot is in another store; its node has the file.
var errOtherStore = errors.New("the snapshot is in another store")

// restoreRefusal is a restore that cannot work however often it is tried.
type restoreRefusal struct{ error }

// restoreSnapshot starts a Machine with spec.restoreFrom from its
// snapshot's state file, as a clone: the guest carries on from the
// snapshot with the Machine's own network identity.
func (a *Agent) restoreSnapshot(ctx context.Context, machine *kaironv1.Machine, id string) (backend.Instance, error) {
	name := machine.Spec.RestoreFrom.SnapshotName
	snap := &kaironv1.MachineSnapshot{}
	if err := a.client.Get(ctx, client.ObjectKey{Namespace: machine.Namespace, Name: name}, snap); err != nil {
		if apierrors.IsNotFound(err) {
			return backend.Instance{}, restoreRefusal{fmt.Errorf("spec.restoreFrom.snapshotName: MachineSnapshot %s not found", name)}
		}
		return backend.Instance{}, err
	}
	path, err := a.snapshotFileFor(snap, machine)
	if errors.Is(err, errOtherStore) {
		// Fetched from the node that took it (machine_snapshot_fetch.go);
		// that node may be back soon, so a failure is retried.
		path, err = a.fetchSnapshot(ctx, snap, machine)
		if err != nil {
			return backend.Instance{}, transient(err)
		}
	} else if err != nil {
		return backend.Instance{}, restoreRefusal{err}
	}
	spec, err := a.attach(machine, id)
	if err != nil {
		return backend.Instance{}, err
	}
	log.FromContext(ctx).Info("restoring Machine from snapshot", "machine", klog.KObj(machine), "machinesnapshot", klog.KObj(snap), "path", path)
	if cloner, ok := a.opts.Backend.(backend.Cloner); ok {
		return cloner.RestoreClone(ctx, spec, path)
	}
	return a.opts.Backend.Restore(ctx, spec, path)
}

// snapshotFileFor checks that machine can be restored from snap here and
// returns the state file.
func (a *Agent) snapshotFileFor(snap *kaironv1.MachineSnapshot, machine *kaironv1.Machine) (string, error) {
	if snap.Status.Phase != kaironv1.SnapshotReady || snap.Status.File == "" {
		return "", fmt.Errorf("MachineSnapshot %s is %s, not Ready", snap.Name, orPending(snap.Status.Phase))
	}
	if cpu := max(machine.Spec.CPU, 1); cpu != snap.Status.CPU {
		return "", fmt.Errorf("spec.cpu is %d, MachineSnapshot %s was taken with %d", cpu, snap.Name, snap.Status.CPU)
	}
	memory := machine.Spec.Memory
	if memory.IsZero() {
		memory = defaultMachineMemory()
	}
	if snap.Status.Memory != nil && memory.Cmp(*snap.Status.Memory) != 0 {
		return "", fmt.Errorf("spec.memory is %s, MachineSnapshot %s was taken with %s", memory.String(), snap.Name, snap.Status.Memory.String())
	}
	if image := machineImage(machine); snap.Status.Image != "" && image != snap.Status.Image {
		return "", fmt.Errorf("spec.image is %s, MachineSnapshot %s was taken with %s", image, snap.Name, snap.Status.Image)
	}
	if snap.Status.Store != a.opts.SnapshotStore {
		if snap.Status.Node == "" || snap.Status.Node == a.opts.NodeName {
			return "", fmt.Errorf("MachineSnapshot %s is in store %s, which node %s does not reach (it reaches %s)",
				snap.Name, snap.Status.Store, a.opts.NodeName, a.opts.SnapshotStore)
		}
		return "", errOtherStore
	}
	path := filepath.Join(a.opts.SnapshotDir, filepath.Base(snap.Status.File))
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("the state file of MachineSnapshot %s is not in store %s on node %s: %w", snap.Name, a.opts.SnapshotStore, a.opts.NodeName, err)
	}
	return path, nil
}

func orPending(phase kaironv1.MachineSnapshotPhase) string {
	if phase == "" {
		return string(kaironv1.SnapshotPending)
	}
	return string(phase)
}

// restoreFailed reports a failed restore: a refusal fails the Machine
// (RestoreFailed); anything else is a start failure, retried if it can pass.
func (a *Agent) restoreFailed(machine *kaironv1.Machine, id string, err error) time.Duration {
	var refusal restoreRefusal
	if !errors.As(err, &refusal) {
		return a.startFailed(machine, id, err)
	}
	message := "restoring from the snapshot: " + err.Error()
	a.boots.gaveUp(id, kaironv1.MachineReasonRestoreFailed, message)
	setPhase(machine, kaironv1.MachineFailed, kaironv1.MachineReasonRestoreFailed, message)
	a.event(machine, corev1.EventTypeWarning, kaironv1.MachineReasonRestoreFailed, message)
	return a.opts.Interval
}

// sweepSnapshots deletes, every snapshotSweepInterval, the state files of
// this agent's store whose MachineSnapshot is gone.
func (a *Agent) sweepSnapshots(ctx context.Context) error {
	ticker := time.NewTicker(snapshotSweepInterval)
	defer ticker.Stop()
	for {
		if err := a.sweepSnapshotFiles(ctx); err != nil {
			log.FromContext(ctx).Error(err, "sweeping snapshot files")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
	}
}

// sweepSnapshotFiles deletes the state files in SnapshotDir and the
// fetched copies (machine_snapshot_fetch.go) whose MachineSnapshot no
// longer exists, and .partial files of saves long over.
// The directory is read before the snapshots are listed: a file exists
// only after its snapshot was created, so the list has every snapshot whose
// file was read, unless it was deleted.
func (a *Agent) sweepSnapshotFiles(ctx context.Context) error {
	type file struct {
		dir   string
		entry os.DirEntry
	}
	var files []file
	for _, dir := range []string{a.opts.SnapshotDir, a.fetchedSnapshotDir()} {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		for _, e := range entries {
			files = append(files, file{dir, e})
		}
	}
	if len(files) == 0 {
		return nil
	}
	var list kaironv1.MachineSnapshotList
	if err := a.mgr.GetAPIReader().List(ctx, &list); err != nil {
		return err
	}
	live := make(map[types.UID]bool, len(list.Items))
	for _, snap := range list.Items {
		live[snap.UID] = true
	}
	var errs []error
	for _, f := range files {
		entry := f.entry
		path := filepath.Join(f.dir, entry.Name())
		remove := false
		if strings.HasSuffix(entry.Name(), ".partial") {
			info, err := entry.Info()
			remove = err == nil && time.Since(info.ModTime()) > snapshotPartialAge
		} else if uid := snapshotFileUID(entry.Name()); uid != "" && !live[uid] {
			remove = true
		}
		if !remove {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		log.FromContext(ctx).Info("deleted the state file of a deleted MachineSnapshot", "path", path)
	}
	return errors.Join(errs...)
}

// defaultMachineMemory is spec.memory's default, for Machines written
// before defaulting existed.
func defaultMachineMemory() resource.Quantity { return resource.MustParse("256Mi") }
