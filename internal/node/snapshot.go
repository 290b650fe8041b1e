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
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
)

// Snapshot clones (MachinePool spec.warmFrom Snapshot).
//
// A pool's template Machine carries AnnotationSnapshotSave. Once its VM is
// Running (for QEMU: its guest agent reported this boot ready), the node
// saves it to StateDir/snapshots/<id>.state (under a temporary name until
// complete), stops it and frees its tap and address, and reports the file
// in the Machine's status.snapshot, Stopped (SnapshotSaved) from then on:
// it never boots again. A failed save fails the Machine (SnapshotFailed). The file goes with
// the template Machine (deleted, or gone from this node).
//
// The save also records the file's SHA-256 (status.snapshot.sha256).
//
// A clone is a pool member with AnnotationRestoreFrom naming the template
// Machine, placed by the scheduler on any node: instead of booting it, the
// node attaches it to the network as any Machine (its own tap, MAC and
// address) and starts it with backend.Cloner.RestoreClone from the
// template's file, which gives the guest that identity before it counts as
// ready. A node other than the template's fetches the file from the
// template's node first and keeps the copy for the template's next clones
// (template_fetch.go).

const snapshotDirName = "snapshots"

func (a *Agent) snapshotPath(id string) string {
	return filepath.Join(a.opts.StateDir, snapshotDirName, id+".state")
}

// reconcileSnapshotTemplate handles a template Machine this node already
// saved (status.snapshot): it stays stopped. It reports whether it
// handled the Machine.
func (a *Agent) reconcileSnapshotTemplate(ctx context.Context, machine *kaironv1.Machine, id string) (bool, error) {
	if machine.Annotations[kaironv1.AnnotationSnapshotSave] == "" {
		return false, nil
	}
	if machine.Status.Snapshot == nil {
		// Saved by this agent a moment ago, and the cache does not show
		// that status write yet: booting it again would run the template
		// on after its save.
		machine.Status.Snapshot = a.savedTemplates.get(id, machine.UID)
	}
	snap := machine.Status.Snapshot
	if snap == nil {
		return false, nil
	}
	if _, err := os.Stat(snap.Path); err != nil || snap.Path != a.snapshotPath(id) {
		// Not this node's (or lost with its state directory): saved anew.
		machine.Status.Snapshot = nil
		a.savedTemplates.forget(id)
		return false, nil
	}
	if snap.SHA256 == "" {
		// Saved by an agent that did not record digests: a node fetching
		// the file for a clone checks its copy against it.
		digest, err := fileSHA256(snap.Path)
		if err != nil {
			return true, err
		}
		snap.SHA256 = digest
	}
	// Saved, then stopped; a stop the agent did not get to is finished here.
	if _, err := a.opts.Backend.Get(ctx, id); err == nil {
		if err := a.teardown(ctx, id); err != nil {
			return true, err
		}
	} else if !errors.Is(err, backend.ErrNotFound) {
		return true, err
	}
	machine.Status.Addresses = nil
	machine.Status.StartedAt = nil
	setPhase(machine, kaironv1.MachineStopped, kaironv1.MachineReasonSnapshotSaved,
		fmt.Sprintf("saved for its pool's clones to %s (%d MiB)", snap.Path, snap.SizeBytes>>20))
	return true, nil
}

// wantsSnapshot: machine is a template Machine that runs here and is not
// saved yet.
func wantsSnapshot(machine *kaironv1.Machine, instance backend.Instance) bool {
	return machine.Annotations[kaironv1.AnnotationSnapshotSave] != "" && machine.Status.Snapshot == nil && instance.Phase == backend.Running
}

// saveTemplate saves the template Machine's VM for its clones, stops it and
// reports the file in its status; a failed save fails the Machine (its pool
// replaces it).
func (a *Agent) saveTemplate(ctx context.Context, machine *kaironv1.Machine, id string) error {
	path := a.snapshotPath(id)
	began := time.Now()
	size, digest, err := a.saveTemplateFile(ctx, id, path)
	if err != nil {
		msg := fmt.Sprintf("saving the template for its pool's clones: %v", err)
		a.event(machine, corev1.EventTypeWarning, kaironv1.MachineReasonSnapshotFailed, msg)
		terr := a.teardown(ctx, id)
		machine.Status.Addresses = nil
		setPhase(machine, kaironv1.MachineFailed, kaironv1.MachineReasonSnapshotFailed, msg)
		return terr
	}
	log.FromContext(ctx).Info("saved template for clones", "machine", klog.KObj(machine), "path", path, "bytes", size, "took", time.Since(began))
	a.event(machine, corev1.EventTypeNormal, kaironv1.MachineReasonSnapshotSaved,
		fmt.Sprintf("saved for its pool's clones in %dms (%d MiB); the VM is stopped", time.Since(began).Milliseconds(), size>>20))
	machine.Status.Snapshot = &kaironv1.TemplateSnapshot{Path: path, SizeBytes: size, SHA256: digest, SavedAt: metav1.Now()}
	a.savedTemplates.remember(id, machine.UID, machine.Status.Snapshot)
	_, err = a.reconcileSnapshotTemplate(ctx, machine, id)
	return err
}

// saveSnapshotFile saves VM id to path (complete or not at all) and
// returns its size.
func (a *Agent) saveSnapshotFile(ctx context.Context, id, path string) (int64, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return 0, err
	}
	tmp := path + ".partial"
	if err := a.opts.Backend.Save(ctx, id, tmp); err != nil {
		os.Remove(tmp)
		return 0, err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return 0, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return fi.Size(), nil
}

// saveTemplateFile saves VM id to path as saveSnapshotFile does and
// returns its size and SHA-256 digest.
func (a *Agent) saveTemplateFile(ctx context.Context, id, path string) (int64, string, error) {
	size, err := a.saveSnapshotFile(ctx, id, path)
	if err != nil {
		return 0, "", err
	}
	digest, err := fileSHA256(path)
	if err != nil {
		return 0, "", err
	}
	return size, digest, nil
}

// savedTemplates holds, per instance ID, what this agent saved a template
// Machine to, and which Machine (UID) that was.
type savedTemplates struct{ m sync.Map }

type savedTemplate struct {
	uid  types.UID
	snap *kaironv1.TemplateSnapshot
}

func (s *savedTemplates) remember(id string, uid types.UID, snap *kaironv1.TemplateSnapshot) {
	s.m.Store(id, savedTemplate{uid: uid, snap: snap.DeepCopy()})
}

// get returns a copy of what the Machine uid, instance id, was saved to, or
// nil.
func (s *savedTemplates) get(id string, uid types.UID) *kaironv1.TemplateSnapshot {
	if v, ok := s.m.Load(id); ok && v.(savedTemplate).uid == uid {
		return v.(savedTemplate).snap.DeepCopy()
	}
	return nil
}

func (s *savedTemplates) forget(id string) { s.m.Delete(id) }

// removeSnapshot deletes the state a template Machine was saved to.
func (a *Agent) removeSnapshot(id string) error {
	a.savedTemplates.forget(id)
	path := a.snapshotPath(id)
	for _, p := range []string{path, path + ".partial"} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// restoreClone starts a clone from its template's saved state: the
// template's file if it was saved here, else a copy fetched from its node.
func (a *Agent) restoreClone(ctx context.Context, machine *kaironv1.Machine, id string) (backend.Instance, error) {
	template := machine.Annotations[kaironv1.AnnotationRestoreFrom]
	if msgs := validation.IsDNS1123Subdomain(template); len(msgs) > 0 {
		// It names a file below the state directory.
		return backend.Instance{}, fmt.Errorf("annotation %s %q is no Machine name: %s", kaironv1.AnnotationRestoreFrom, template, strings.Join(msgs, "; "))
	}
	cloner, ok := a.opts.Backend.(backend.Cloner)
	if !ok {
		return backend.Instance{}, fmt.Errorf("the %s backend cannot restore clones", a.opts.Backend.Name())
	}
	path, err := a.templateStateFor(ctx, machine, template)
	if err != nil {
		return backend.Instance{}, err
	}
	spec, err := a.attach(machine, id)
	if err != nil {
		return backend.Instance{}, err
	}
	log.FromContext(ctx).Info("restoring clone", "machine", klog.KObj(machine), "template", template, "path", path)
	return cloner.RestoreClone(ctx, spec, path)
}
