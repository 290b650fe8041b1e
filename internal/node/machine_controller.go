package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/source"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/node/network"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules"
)

// instanceID names a Machine's VM on this node; it is also a safe file name.
func instanceID(namespace, name string) string { return namespace + "_" + name }

// machineKey recovers the Machine from an instance's "namespace/name".
func machineKey(instanceName string) (types.NamespacedName, bool) {
	ns, name, ok := strings.Cut(instanceName, "/")
	return types.NamespacedName{Namespace: ns, Name: name}, ok && ns != "" && name != ""
}

func (a *Agent) setupMachineController() error {
	return ctrl.NewControllerManagedBy(a.mgr).
		Named("node-machine").
		// Tests and kairon-local may run several agents in one process.
		WithOptions(controller.Options{SkipNameValidation: ptr.To(true)}).
		For(&kaironv1.Machine{}).
		WatchesRawSource(source.Channel(a.instanceEvents, &handler.TypedEnqueueRequestForObject[*kaironv1.Machine]{})).
		Complete(requeue.UntilStopped(a))
}

// Reconcile makes the VM of one Machine match its spec and reports what runs.
func (a *Agent) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	a.lifecycle.RLock()
	defer a.lifecycle.RUnlock()
	if a.stopping.Load() {
		// The agent is suspending its VMs (suspend.go): hands off.
		return ctrl.Result{}, nil
	}
	id := instanceID(req.Namespace, req.Name)
	machine := &kaironv1.Machine{}
	err := a.client.Get(ctx, req.NamespacedName, machine)
	if err != nil && !apierrors.IsNotFound(err) {
		return ctrl.Result{}, err
	}
	if err == nil {
		machine = a.ownWrites.latest(machine)
	}
	if apierrors.IsNotFound(err) || machine.Spec.NodeName != a.opts.NodeName {
		a.ownWrites.forget(req.NamespacedName)
		// Gone, or moved to another node: nothing of it may stay here,
		// unless a migration through this node still needs it (the
		// source's paused copy, the target's restored one before the switch).
		if held, err := a.migrationHolds(ctx, req.Namespace, req.Name); err != nil || held {
			return ctrl.Result{RequeueAfter: a.opts.Interval}, err
		}
		a.boots.forget(id)
		a.snapshotting.Delete(id) // machine_snapshot.go
		return ctrl.Result{}, errors.Join(a.teardown(ctx, id), a.removeSnapshot(id))
	}
	if !machine.DeletionTimestamp.IsZero() {
		a.boots.forget(id)
		return ctrl.Result{}, a.reconcileDelete(ctx, machine, id)
	}
	if !controllerutil.ContainsFinalizer(machine, kaironv1.FinalizerMachineVM) {
		base := machine.DeepCopy()
		controllerutil.AddFinalizer(machine, kaironv1.FinalizerMachineVM)
		if err := a.client.Patch(ctx, machine, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return ctrl.Result{}, err
		}
		a.ownWrites.wrote(base.ResourceVersion, machine)
	}

	base := machine.DeepCopy()
	if !rules.MarkedScheduled(machine) {
		// The scheduler leaves recording the placement to the agent that
		// picks the Machine up, in the same write as its first status.
		rules.MarkScheduled(machine)
	}
	requeue, err := a.reconcileVM(ctx, machine, id)
	if patchErr := a.patchStatus(ctx, base, machine); patchErr != nil {
		if apierrors.IsConflict(patchErr) && err == nil {
			// Someone else wrote the Machine meanwhile (the scheduler, a
			// user): look again with the fresh object, quietly.
			return ctrl.Result{RequeueAfter: 100 * time.Millisecond}, nil
		}
		return ctrl.Result{}, errors.Join(err, patchErr)
	}
	a.ownWrites.wrote(base.ResourceVersion, machine)
	if err != nil {
		return ctrl.Result{}, err
	}
	// The tick re-checks every Machine even without events, as a safety net.
	return ctrl.Result{RequeueAfter: min(requeue, a.opts.Interval)}, nil
}

// reconcileVM starts, stops or observes the VM and fills machine.Status.
// It returns how soon to look again.
func (a *Agent) reconcileVM(ctx context.Context, machine *kaironv1.Machine, id string) (time.Duration, error) {
	if machine.Spec.PowerState == kaironv1.PowerStateStopped {
		a.boots.forget(id) // started again, it gets a fresh boot timeout
		if err := a.teardown(ctx, id); err != nil {
			setPhase(machine, kaironv1.MachineStopping, kaironv1.MachineReasonStopFailed, err.Error())
			return time.Second, err
		}
		setPhase(machine, kaironv1.MachineStopped, kaironv1.MachineReasonStopped, "spec.powerState is Stopped")
		machine.Status.Addresses = nil
		machine.Status.StartedAt = nil
		return a.opts.Interval, nil
	}

	if handled, err := a.reconcileSnapshotTemplate(ctx, machine, id); handled {
		return a.opts.Interval, err
	}
	instance, err := a.opts.Backend.Get(ctx, id)
	if err != nil && !errors.Is(err, backend.ErrNotFound) {
		return time.Second, err
	}
	rec, suspended, recErr := a.readSuspend(id)
	if recErr != nil {
		return time.Second, recErr
	}
	if (suspended || errors.Is(err, backend.ErrNotFound)) && a.addresses != nil && a.addresses.ready() != nil {
		// No address is known free before the agent's first look at the
		// cluster's Machines, just after it starts: neither a start nor a
		// resume is attempted before it.
		return addressViewWait, nil
	}
	switch {
	case suspended:
		// Whatever brings the VM up needs its image here first
		// (machine_image.go).
		if wait, ok := a.ensureImage(ctx, machine, false); !ok {
			return wait, nil
		}
		// Saved when the last agent stopped: bring the guest back rather
		// than boot it.
		var ok bool
		if instance, ok = a.resumeSuspended(ctx, machine, id, rec, instance, err); !ok {
			return a.opts.Interval, nil
		}
	case errors.Is(err, backend.ErrNotFound):
		if machine.Status.Phase == kaironv1.MachineFailed {
			// A failed Machine stays failed until it is deleted or stopped and
			// started again; restarting it silently would hide the failure.
			return a.opts.Interval, nil
		}
		if reason, message, ok := a.boots.failedForGood(id); ok {
			setPhase(machine, kaironv1.MachineFailed, reason, message) // its write lost a race
			return a.opts.Interval, nil
		}
		if wait := a.boots.wait(id, time.Now()); wait > 0 {
			return wait, nil // backing off a transient start failure (boot.go)
		}
		fresh := machine.Spec.RestoreFrom == nil && machine.Annotations[kaironv1.AnnotationRestoreFrom] == ""
		if wait, ok := a.ensureImage(ctx, machine, fresh); !ok {
			return wait, nil
		}
		a.boots.begin(id, time.Now())
		switch {
		case machine.Spec.RestoreFrom != nil:
			instance, err = a.restoreSnapshot(ctx, machine, id) // machine_snapshot.go
			var inUse addressInUseError
			if errors.As(err, &inUse) {
				_ = a.teardown(ctx, id)
				return a.addressInUse(machine, id, inUse), nil
			}
			if err != nil {
				_ = a.teardown(ctx, id)
				return a.restoreFailed(machine, id, err), nil
			}
			a.event(machine, corev1.EventTypeNormal, kaironv1.MachineReasonRestored, fmt.Sprintf("VM restored on %s from MachineSnapshot %s (%s)", a.opts.NodeName, machine.Spec.RestoreFrom.SnapshotName, instance.Acceleration))
		case machine.Annotations[kaironv1.AnnotationRestoreFrom] != "":
			instance, err = a.restoreClone(ctx, machine, id)
		default:
			instance, err = a.start(ctx, machine, id)
		}
		var inUse addressInUseError
		if errors.As(err, &inUse) {
			_ = a.teardown(ctx, id)
			return a.addressInUse(machine, id, inUse), nil
		}
		if err != nil {
			_ = a.teardown(ctx, id)
			return a.startFailed(machine, id, err), nil // boot.go: retried, or Failed
		}
		if machine.Spec.RestoreFrom == nil {
			a.event(machine, corev1.EventTypeNormal, kaironv1.EventReasonStarted, fmt.Sprintf("VM started on %s (%s)", a.opts.NodeName, instance.Acceleration))
		}
	}

	a.observe(machine, instance, id)
	if instance.Phase != backend.Booting {
		a.boots.forget(id) // up (or gone): the boot timeout is over
	}
	a.observeGuestAgent(ctx, machine, id)
	if instance.Phase != backend.Exited {
		// A VM adopted from an earlier agent (or one that ran before the
		// baseline existed) gets its tap pinned too; a known one costs nothing.
		if err := a.ensureBaseline(machine.Namespace, id); err != nil {
			return time.Second, err
		}
	}
	if instance.Phase == backend.Exited {
		a.event(machine, corev1.EventTypeWarning, kaironv1.MachineReasonVMExited, machine.Status.Message)
		if err := a.teardown(ctx, id); err != nil {
			return time.Second, err
		}
		machine.Status.Addresses = nil
		return a.opts.Interval, nil
	}
	if instance.Phase == backend.Booting {
		if a.bootTimedOut(id, instance) {
			message := fmt.Sprintf("the VM did not reach Running within %s (kairon-node --boot-timeout)", a.opts.BootTimeout)
			if err := a.teardown(ctx, id); err != nil {
				return time.Second, err
			}
			a.boots.gaveUp(id, kaironv1.MachineReasonBootTimeout, message)
			setPhase(machine, kaironv1.MachineFailed, kaironv1.MachineReasonBootTimeout, message)
			machine.Status.Addresses = nil
			a.event(machine, corev1.EventTypeWarning, kaironv1.MachineReasonBootTimeout, message)
			return a.opts.Interval, nil
		}
		return time.Second, nil
	}
	if wantsSnapshot(machine, instance) {
		return a.opts.Interval, a.saveTemplate(ctx, machine, id)
	}
	return a.opts.Interval, nil
}

// start attaches the Machine to the node network and boots its VM.
func (a *Agent) start(ctx context.Context, machine *kaironv1.Machine, id string) (backend.Instance, error) {
	spec, err := a.attach(machine, id)
	if err != nil {
		return backend.Instance{}, err
	}
	log.FromContext(ctx).Info("starting VM", "machine", klog.KObj(machine), "cpu", spec.CPU, "memoryMiB", spec.MemoryMiB, "image", machine.Spec.Image)
	return a.opts.Backend.Start(ctx, spec)
}

// attach is the Machine's VM spec with its place on the node network. It
// keeps the address the Machine reports if this node's range has it free:
// a guest migrated here still has that address configured inside.
func (a *Agent) attach(machine *kaironv1.Machine, id string) (backend.Spec, error) {
	spec, err := a.vmSpec(machine, id)
	if err != nil {
		return spec, err
	}
	if a.ipam != nil {
		var current netip.Addr
		for _, address := range machine.Status.Addresses {
			if addr, err := netip.ParseAddr(address.Address); err == nil {
				current = addr
				break
			}
		}
		address, err := a.ipam.AllocatePreferring(id, current)
		if err != nil {
			return spec, transient(err) // boot.go: retried
		}
		if a.addresses != nil {
			// The IPAM hands out no address another Machine reports, but
			// one it kept for this Machine, or a migrated guest's own,
			// may have gone to another Machine meanwhile.
			if err := a.addresses.checkFree(id, address.Addr()); err != nil {
				return spec, err
			}
		}
		spec.Network = &backend.Network{MAC: network.MAC(id), Address: address, Gateway: a.ipam.Gateway().Addr()}
		if a.links != nil {
			tap, err := a.links.EnsureTap(id)
			if err != nil {
				return spec, transient(err)
			}
			spec.Network.TapName = tap
			spec.Network.Nameserver = a.nameserver
			if err := a.ensureBaseline(machine.Namespace, id); err != nil {
				return spec, transient(err)
			}
			// Before the VM runs, here or as a migration's target.
			if err := a.confineBeforeStart(machine, id, address.Addr()); err != nil {
				return spec, transient(err)
			}
		}
	}
	return spec, nil
}

// ensureBaseline pins the Machine's tap to its MAC and address and puts it
// in its namespace's group on the bridge (network/baseline.go).
func (a *Agent) ensureBaseline(namespace, id string) error {
	if a.baseline == nil || a.ipam == nil {
		return nil
	}
	address, err := a.ipam.Allocate(id)
	if err != nil {
		return err
	}
	return a.baseline.Ensure(network.Guest{Tap: network.TapName(a.opts.NodeName, id), Namespace: namespace, MAC: network.MAC(id), IP: address.Addr()})
}

// vmSpec turns a Machine's spec into what the backend boots.
func (a *Agent) vmSpec(machine *kaironv1.Machine, id string) (backend.Spec, error) {
	image := machine.Spec.Image
	if image == "" {
		image = kaironv1.DefaultImage
	}
	spec := backend.Spec{
		ID:         id,
		Name:       machine.Namespace + "/" + machine.Name,
		CPU:        max(machine.Spec.CPU, 1),
		MemoryMiB:  machine.Spec.Memory.Value() >> 20,
		KernelArgs: machine.Spec.KernelArgs,
	}
	if spec.MemoryMiB == 0 { // objects written before defaulting existed
		spec.MemoryMiB = 256
	}
	if a.opts.Backend.Name() == "sim" {
		return spec, nil
	}
	if kaironv1.IsOCIImage(image) {
		// Kairon's own kernel and initramfs (which brings the guest
		// agent) boot the image as the root filesystem.
		local, err := a.localImage(machine)
		if err != nil {
			return spec, err
		}
		spec.RootImage = local.Path
		image = kaironv1.DefaultImage
	}
	spec.Kernel = filepath.Join(a.opts.GuestDir, image, "vmlinux")
	spec.Initrd = filepath.Join(a.opts.GuestDir, image, "initramfs.cpio.gz")
	for _, path := range []string{spec.Kernel, spec.Initrd} {
		if _, err := os.Stat(path); err != nil {
			return spec, fmt.Errorf("guest image %q is not on node %s (%s missing): build it with `make guest`", image, a.opts.NodeName, path)
		}
	}
	return spec, nil
}

// observe copies what the backend reports into the Machine's status.
func (a *Agent) observe(machine *kaironv1.Machine, instance backend.Instance, id string) {
	status := &machine.Status
	status.Acceleration = instance.Acceleration
	if !instance.StartedAt.IsZero() {
		// At the second, as the API server stores it: a finer time never
		// equals the stored one, and every tick would write the status again.
		started := metav1.NewTime(instance.StartedAt).Rfc3339Copy()
		status.StartedAt = &started
	}
	status.Addresses = nil
	if a.ipam != nil && instance.Phase != backend.Exited {
		if address, err := a.ipam.Allocate(id); err == nil {
			status.Addresses = []kaironv1.MachineAddress{{Type: "InternalIP", Address: address.Addr().String()}}
		}
	}
	switch instance.Phase {
	case backend.Booting:
		setPhase(machine, kaironv1.MachineBooting, kaironv1.MachineReasonBooting, "the guest is booting")
	case backend.Running, backend.Paused:
		status.BootMillis = instance.ReadyAfter.Milliseconds()
		status.ConsoleTail = ""
		setPhase(machine, kaironv1.MachineRunning, kaironv1.MachineReasonGuestReady, fmt.Sprintf("the guest was ready %dms after start", status.BootMillis))
	case backend.Exited:
		// Guest text: no control characters, at most maxGuestText bytes.
		status.ConsoleTail = sanitizeGuestText(instance.ConsoleTail)
		reason := sanitizeGuestText(instance.Reason)
		if reason == "" {
			reason = "the VM process exited"
		}
		setPhase(machine, kaironv1.MachineFailed, kaironv1.MachineReasonVMExited, reason)
	}
}

// addressViewWait is how soon a start waiting for the first look at the
// cluster's guest addresses looks again.
const addressViewWait = 200 * time.Millisecond

// addressInUse keeps a Machine whose address another Machine holds
// Pending: no boot attempt is counted against its boot timeout, since it
// waits for the cluster, not for its VM. Its own claim on the address is
// held only while it reports it, so a Machine that never ran with it gets
// another address at a later attempt.
func (a *Agent) addressInUse(machine *kaironv1.Machine, id string, err addressInUseError) time.Duration {
	a.boots.forget(id)
	message := err.Error()
	if ready := meta.FindStatusCondition(machine.Status.Conditions, kaironv1.ConditionReady.String()); ready == nil || ready.Reason != kaironv1.MachineReasonAddressInUse || ready.Message != message {
		a.event(machine, corev1.EventTypeWarning, kaironv1.EventReasonAddressInUse, message)
	}
	setPhase(machine, kaironv1.MachinePending, kaironv1.MachineReasonAddressInUse, message)
	return a.opts.Interval
}

// setPhase sets the phase, its message and the matching Ready condition.
func setPhase(machine *kaironv1.Machine, phase kaironv1.MachinePhase, reason, message string) {
	machine.Status.Phase = phase
	machine.Status.Message = message
	ready := metav1.ConditionFalse
	if phase == kaironv1.MachineRunning {
		ready = metav1.ConditionTrue
	}
	meta.SetStatusCondition(&machine.Status.Conditions, metav1.Condition{
		Type: kaironv1.ConditionReady.String(), Status: ready, Reason: reason, Message: message,
		ObservedGeneration: machine.Generation,
	})
	machine.Status.ObservedGeneration = machine.Generation
}

// reconcileDelete stops the VM, frees its tap and address, then lets the
// Machine go.
func (a *Agent) reconcileDelete(ctx context.Context, machine *kaironv1.Machine, id string) error {
	if !controllerutil.ContainsFinalizer(machine, kaironv1.FinalizerMachineVM) {
		return nil
	}
	if machine.Status.Phase != kaironv1.MachineStopping {
		base := machine.DeepCopy()
		setPhase(machine, kaironv1.MachineStopping, kaironv1.MachineReasonDeleting, "the Machine is being deleted")
		if err := a.patchStatus(ctx, base, machine); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		a.ownWrites.wrote(base.ResourceVersion, machine)
	}
	if err := errors.Join(a.teardown(ctx, id), a.removeSnapshot(id)); err != nil {
		return err
	}
	base := machine.DeepCopy()
	controllerutil.RemoveFinalizer(machine, kaironv1.FinalizerMachineVM)
	if err := a.client.Patch(ctx, machine, client.MergeFrom(base)); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	a.ownWrites.forget(client.ObjectKeyFromObject(machine))
	a.event(machine, corev1.EventTypeNormal, kaironv1.EventReasonStopped, "VM stopped and its network removed")
	return nil
}

// teardown removes everything this node holds for an instance, including
// the state it was suspended to. It is idempotent, so every path that must
// leave nothing behind can call it.
func (a *Agent) teardown(ctx context.Context, id string) error {
	var errs []error
	if err := a.opts.Backend.Stop(ctx, id); err != nil {
		errs = append(errs, fmt.Errorf("stopping VM: %w", err))
	}
	if err := a.removeSuspend(id); err != nil {
		errs = append(errs, err)
	}
	if a.links != nil {
		if err := a.links.DeleteTap(id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := a.removeEgress(id); err != nil {
		errs = append(errs, err)
	}
	if a.baseline != nil {
		namespace, _, _ := strings.Cut(id, "_") // instanceID: namespaces have no "_"
		if err := a.baseline.Remove(network.TapName(a.opts.NodeName, id), namespace); err != nil {
			errs = append(errs, err)
		}
	}
	if err := a.releaseAddress(id); err != nil { // guest_addresses.go
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// patchStatus writes the status once, only if it changed. The optimistic lock
// stops a stale view from overwriting what the scheduler wrote meanwhile; a
// conflict just means another reconcile.
func (a *Agent) patchStatus(ctx context.Context, base, machine *kaironv1.Machine) error {
	return patch.Status(ctx, a.client, base, machine, patch.WithOptimisticLock())
}

func (a *Agent) event(machine *kaironv1.Machine, kind, reason, message string) {
	a.recorder.Eventf(machine, nil, kind, reason, "Reconcile", "%s", message)
}
