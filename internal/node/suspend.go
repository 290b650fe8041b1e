package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/reference"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
)

// Suspending VMs when the agent stops (Options.OnShutdown = suspend, what
// kairon-local runs its agents with). On a graceful stop the agent first
// waits for the Machine reconciles in flight and lets no new one act, then,
// for every VM it runs:
//
//  1. writes StateDir/suspended/<id>.json, the record, with state "saving"
//     and the moment the guest is paused;
//  2. saves the VM with Backend.Save to <id>.state (under a temporary name
//     until complete) — the guest is paused from here on;
//  3. marks the record "saved", stops QEMU (Backend.Stop) and puts a
//     Suspended event on the Machine.
//
// The tap and the address stay allocated. A save that fails or runs out of
// time (Options.SuspendTimeout) resumes the guest and leaves QEMU running,
// as with ShutdownKeep: the next agent re-adopts it.
//
// The next agent's Machine reconciler finds the record before it would
// boot the Machine (resumeSuspended): a "saved" record with no VM running
// is restored with Backend.Restore; a VM that still runs (the save failed,
// or the agent was killed between save and stop) is resumed in place; a
// "saving" record whose VM is gone (the agent was killed mid-save) means the
// guest is lost, and the Machine is reported Failed. Either way the record
// and the state file go, and a Resumed event names how long the guest was
// paused. A record whose Machine is gone is removed with the rest of the
// Machine's VM (teardown).

const (
	suspendDirName = "suspended"
	// suspendSaving: the save began; the state file may be incomplete.
	suspendSaving = "saving"
	// suspendSaved: the state file is complete; the VM is (being) stopped.
	suspendSaved = "saved"
	// suspendParallel is how many VMs are saved at once.
	suspendParallel = 4
	// suspendStopTimeout bounds stopping one saved VM.
	suspendStopTimeout = 30 * time.Second
)

// suspendRecord is StateDir/suspended/<id>.json.
type suspendRecord struct {
	// Machine is "namespace/name".
	Machine string `json:"machine"`
	// State is suspendSaving or suspendSaved.
	State string `json:"state"`
	// PausedAt is when the save paused the guest.
	PausedAt time.Time `json:"pausedAt"`
}

func (a *Agent) suspendDir() string { return filepath.Join(a.opts.StateDir, suspendDirName) }

func (a *Agent) suspendRecordPath(id string) string {
	return filepath.Join(a.suspendDir(), id+".json")
}

func (a *Agent) suspendStatePath(id string) string {
	return filepath.Join(a.suspendDir(), id+".state")
}

// readSuspend returns the record of id, if there is one.
func (a *Agent) readSuspend(id string) (suspendRecord, bool, error) {
	var rec suspendRecord
	data, err := os.ReadFile(a.suspendRecordPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return rec, false, nil
	}
	if err != nil {
		return rec, false, err
	}
	if err := json.Unmarshal(data, &rec); err != nil {
		return rec, false, fmt.Errorf("%s: %w", a.suspendRecordPath(id), err)
	}
	return rec, true, nil
}

// writeSuspend writes the record durably: a complete file under its name,
// synced, so that a crash leaves the old record or the new one.
func (a *Agent) writeSuspend(id string, rec suspendRecord) error {
	if err := os.MkdirAll(a.suspendDir(), 0o700); err != nil {
		return err
	}
	data, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	path := a.suspendRecordPath(id)
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// removeSuspend removes what the agent kept for a suspended VM. Removing
// nothing is not an error.
func (a *Agent) removeSuspend(id string) error {
	var errs []error
	for _, p := range []string{a.suspendStatePath(id), a.suspendStatePath(id) + ".saving", a.suspendRecordPath(id) + ".tmp", a.suspendRecordPath(id)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// suspendedMachines lists the Machines ("namespace/name") with a record.
func (a *Agent) suspendedMachines() []string {
	entries, _ := os.ReadDir(a.suspendDir())
	var names []string
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		if rec, ok, err := a.readSuspend(id); err == nil && ok {
			names = append(names, rec.Machine)
		}
	}
	return names
}

// suspendAll saves and stops every VM of this node, within
// Options.SuspendTimeout. It runs while the manager still runs (its cache,
// the API server) and returns once every VM is saved and stopped, or left
// running because it could not be.
func (a *Agent) suspendAll(ctx context.Context) {
	logger := log.FromContext(ctx).WithName("suspend")
	ctx, cancel := context.WithTimeout(ctx, a.opts.SuspendTimeout)
	defer cancel()

	// No Machine reconcile may start or replace a VM from here on; wait for
	// those in flight.
	a.stopping.Store(true)
	locked := make(chan struct{})
	go func() { a.lifecycle.Lock(); close(locked) }()
	select {
	case <-locked:
		defer a.lifecycle.Unlock()
	case <-ctx.Done():
		go func() { <-locked; a.lifecycle.Unlock() }()
		logger.Error(ctx.Err(), "Machine reconciles still busy; leaving every VM running for the next agent to adopt")
		return
	}

	instances, err := a.opts.Backend.List(ctx)
	if err != nil {
		logger.Error(err, "listing VMs to suspend; leaving them running for the next agent to adopt")
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, suspendParallel)
	for _, inst := range instances {
		key, ok := machineKey(inst.Name)
		if !ok || inst.Phase == backend.Exited {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			a.suspendVM(ctx, inst, key)
		}()
	}
	wg.Wait()
}

// suspendVM saves and stops one VM; see the top of this file.
func (a *Agent) suspendVM(ctx context.Context, inst backend.Instance, key types.NamespacedName) {
	id := inst.ID
	machine := &kaironv1.Machine{}
	err := a.mgr.GetAPIReader().Get(ctx, key, machine)
	logger := log.FromContext(ctx).WithName("suspend").WithValues("machine", klog.KRef(key.Namespace, key.Name))
	switch {
	case apierrors.IsNotFound(err) || (err == nil && (!machine.DeletionTimestamp.IsZero() || machine.Spec.NodeName != a.opts.NodeName)):
		// Gone, going or moved: nothing worth saving, but the next agent
		// would only stop it, and a migration may still need it.
		if held, herr := a.heldByMigration(ctx, key); herr != nil || held {
			logger.Info("leaving the VM running for the next agent: a migration through this node may hold it", "err", herr)
			return
		}
		if err := a.teardown(ctx, id); err != nil {
			logger.Error(err, "stopping the VM of a Machine that is gone or elsewhere")
		}
		return
	case err != nil:
		logger.Error(err, "reading the Machine; saving its VM without events")
		machine = nil
	}
	if held, err := a.heldByMigration(ctx, key); err != nil || held {
		logger.Info("leaving the VM running for the next agent to adopt: a migration through this node may hold it", "err", err)
		return
	}

	path := a.suspendStatePath(id)
	rec := suspendRecord{Machine: key.String(), State: suspendSaving, PausedAt: time.Now()}
	if err := a.writeSuspend(id, rec); err != nil {
		logger.Error(err, "recording the suspension; leaving the VM running for the next agent to adopt")
		return
	}
	if err := a.save(ctx, id, path); err != nil {
		// Save leaves the guest paused as far as it got: let it run again,
		// with a context of its own since ctx may be what ended the save.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		resumeErr := a.opts.Backend.Resume(rctx, id)
		cancel()
		if resumeErr != nil && !errors.Is(resumeErr, backend.ErrNotFound) {
			logger.Error(resumeErr, "resuming the VM after its save failed")
		}
		_ = a.removeSuspend(id)
		logger.Error(err, "saving the VM failed; it keeps running, for the next agent to adopt")
		if machine != nil {
			a.eventNow(ctx, machine, corev1.EventTypeWarning, kaironv1.EventReasonSuspendFailed,
				fmt.Sprintf("kairon-node on %s stopped but could not save the VM (%v); the VM keeps running", a.opts.NodeName, err))
		}
		return
	}
	rec.State = suspendSaved
	if err := a.writeSuspend(id, rec); err != nil {
		logger.Error(err, "recording the saved VM; it stays paused, for the next agent to resume")
		return
	}
	savedIn := time.Since(rec.PausedAt)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), suspendStopTimeout)
	err = a.opts.Backend.Stop(sctx, id)
	cancel()
	if err != nil {
		logger.Error(err, "stopping the saved VM; it stays paused, for the next agent to resume")
		return
	}
	size := int64(0)
	if info, err := os.Stat(path); err == nil {
		size = info.Size()
	}
	logger.Info("VM suspended", "path", path, "bytes", size, "took", savedIn)
	if machine != nil {
		a.eventNow(ctx, machine, corev1.EventTypeNormal, kaironv1.EventReasonSuspended,
			fmt.Sprintf("kairon-node on %s stopped: the VM was saved (%s in %s) and stopped; it resumes where it was when the agent starts again",
				a.opts.NodeName, sizeText(size), roundPause(savedIn)))
	}
}

// heldByMigration is migrationHolds from the API server rather than the
// cache, which a stop early in the agent's life may find not yet synced.
func (a *Agent) heldByMigration(ctx context.Context, key types.NamespacedName) (bool, error) {
	var list kaironv1.MachineMigrationList
	if err := a.mgr.GetAPIReader().List(ctx, &list, client.InNamespace(key.Namespace)); err != nil {
		return false, err
	}
	for _, mig := range list.Items {
		if mig.Spec.MachineName == key.Name && mig.Status.Phase == kaironv1.MigrationRunning &&
			(mig.Status.SourceNode == a.opts.NodeName || mig.Status.TargetNode == a.opts.NodeName) {
			return true, nil
		}
	}
	return false, nil
}

// resumeSuspended brings back a Machine's VM that a stopping agent
// suspended (rec is its record). instance and getErr are what the backend
// reported for id. It returns the VM, or false when the Machine could not
// be brought back: then it is Failed, with nothing left of it on the node.
func (a *Agent) resumeSuspended(ctx context.Context, machine *kaironv1.Machine, id string, rec suspendRecord, instance backend.Instance, getErr error) (backend.Instance, bool) {
	logger := log.FromContext(ctx).WithValues("machine", klog.KObj(machine))
	paused := func() string { return roundPause(time.Since(rec.PausedAt)) }
	fail := func(reason, message string) (backend.Instance, bool) {
		logger.Info("could not resume the suspended VM", "reason", reason, "message", message)
		if err := a.teardown(ctx, id); err != nil {
			logger.Error(err, "removing what was left of the suspended VM")
		}
		setPhase(machine, kaironv1.MachineFailed, reason, message)
		a.event(machine, corev1.EventTypeWarning, reason, message)
		return backend.Instance{}, false
	}

	if getErr == nil && instance.Phase != backend.Exited {
		// The VM outlived the stop: its save failed or the agent ended
		// before it could stop it. It holds the guest as it was.
		if instance.Phase == backend.Paused {
			if err := a.opts.Backend.Resume(ctx, id); err != nil {
				return fail(kaironv1.MachineReasonResumeFailed, fmt.Sprintf("resuming the VM paused when kairon-node stopped: %v", err))
			}
			if got, err := a.opts.Backend.Get(ctx, id); err == nil {
				instance = got
			}
		}
		if err := a.removeSuspend(id); err != nil {
			logger.Error(err, "removing the suspension record")
		}
		a.event(machine, corev1.EventTypeNormal, kaironv1.EventReasonResumed,
			fmt.Sprintf("the VM still ran on %s and was resumed in place; the guest was paused for %s", a.opts.NodeName, paused()))
		return instance, true
	}

	if rec.State != suspendSaved {
		return fail(kaironv1.MachineReasonSuspendIncomplete, fmt.Sprintf("kairon-node on %s was killed while saving the VM (at %s) and the VM is gone: the guest's state is lost; stop and start the Machine to boot it again",
			a.opts.NodeName, rec.PausedAt.Format(time.RFC3339)))
	}
	path := a.suspendStatePath(id)
	began := time.Now()
	restored, err := a.restore(ctx, machine, id, path)
	if err != nil {
		return fail(kaironv1.MachineReasonResumeFailed, fmt.Sprintf("restoring the VM saved when kairon-node stopped: %v; stop and start the Machine to boot it again", err))
	}
	if restored.Phase == backend.Exited {
		return fail(kaironv1.MachineReasonResumeFailed, fmt.Sprintf("the VM restored from its saved state exited: %s; stop and start the Machine to boot it again", restored.Reason))
	}
	if err := a.removeSuspend(id); err != nil {
		logger.Error(err, "removing the saved state of the resumed VM")
	}
	logger.Info("VM resumed from its saved state", "paused", time.Since(rec.PausedAt), "restoreTook", time.Since(began))
	a.event(machine, corev1.EventTypeNormal, kaironv1.EventReasonResumed,
		fmt.Sprintf("the VM was restored on %s from the state saved when kairon-node stopped; the guest was paused for %s", a.opts.NodeName, paused()))
	return restored, true
}

// sizeText shows a file size: 231 MiB, 12 KiB.
func sizeText(n int64) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", (n+1023)>>10)
}

// roundPause shows a pause the way people read it: 1m3s, 4s, 850ms.
func roundPause(d time.Duration) string {
	if d >= time.Second {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

// eventNow writes an event on the Machine at once, rather than through the
// recorder, whose queue a stopping agent would not wait for.
func (a *Agent) eventNow(ctx context.Context, machine *kaironv1.Machine, eventType, reason, note string) {
	ref, err := reference.GetReference(a.mgr.GetScheme(), machine)
	if err != nil {
		log.FromContext(ctx).Error(err, "event reference", "machine", klog.KObj(machine))
		return
	}
	now := time.Now()
	host, _ := os.Hostname()
	ev := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: fmt.Sprintf("%s.%x", machine.Name, now.UnixNano()), Namespace: machine.Namespace},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: "kairon-node",
		ReportingInstance:   "kairon-node-" + host,
		Action:              "Shutdown",
		Reason:              reason,
		Regarding:           *ref,
		Note:                note,
		Type:                eventType,
	}
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := a.client.Create(ectx, ev); err != nil {
		log.FromContext(ctx).Error(err, "writing event", "machine", klog.KObj(machine), "reason", reason)
	}
}
