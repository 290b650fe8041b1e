package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Snapshot-clone pools (spec.warmFrom Snapshot). The pool keeps one
// template Machine per template hash: built from spec.template, labelled
// LabelMachinePoolTemplate (and not LabelMachinePool, so it is no member:
// never counted, bound or claimed), annotated AnnotationSnapshotSave.
// Its node boots it, saves it once Running, stops it and reports the file
// in its status.snapshot (internal/node/snapshot.go), which the pool
// copies into its own status.snapshot. From then on every new member is a
// clone: AnnotationRestoreFrom names the template Machine. The scheduler
// places a clone like any Machine, on any node with room; a node other
// than the template's fetches the file from it (internal/node/
// template_fetch.go). Until
// then (the template boots, or failed and is replaced) members boot. A
// template change deletes the old template Machine (its node deletes the
// file) and creates the new one, so the pool re-snapshots; the warm
// members of the old template are replaced as with warmFrom Boot.

// templateMachineName is the pool's template Machine for hash: one name
// per hash, so that a create that already happened is found again.
func templateMachineName(pool, hash string) string {
	const suffix = "-template-"
	if max := 253 - len(suffix) - len(hash); len(pool) > max {
		pool = pool[:max]
	}
	return pool + suffix + hash
}

// reconcileSnapshot keeps the pool's template Machine for hash (or none,
// with warmFrom Boot) and returns the snapshot new members are cloned from,
// nil while there is none, and the SnapshotReady condition (nil with
// warmFrom Boot). The template Machine runs img.image, the template's
// image as members run it (pinned by digest); while its digest is unknown
// none is created.
func (r *MachinePoolReconciler) reconcileSnapshot(ctx context.Context, pool *kaironv1.MachinePool, hash string, img poolImageState) (*kaironv1.MachinePoolSnapshot, *metav1.Condition, error) {
	var list kaironv1.MachineList
	if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace),
		client.MatchingLabels{kaironv1.LabelMachinePoolTemplate: pool.Name}); err != nil {
		return nil, nil, fmt.Errorf("listing template machines: %w", err)
	}
	wanted := pool.Spec.WarmFrom == kaironv1.WarmFromSnapshot
	var current *kaironv1.Machine
	var errs []error
	failed := ""
	for i := range list.Items {
		m := &list.Items[i]
		if ref := metav1.GetControllerOf(m); ref == nil || ref.UID != pool.UID || m.DeletionTimestamp != nil {
			continue
		}
		switch {
		case !wanted:
			errs = append(errs, r.deleteTemplate(ctx, pool, m, "spec.warmFrom is not Snapshot"))
		case m.Labels[kaironv1.LabelMachinePoolTemplateHash] != hash:
			errs = append(errs, r.deleteTemplate(ctx, pool, m, "its template is out of date"))
		case m.Status.Phase == kaironv1.MachineFailed:
			failed = fmt.Sprintf("template machine %s failed: %s", m.Name, m.Status.Message)
			errs = append(errs, r.deleteTemplate(ctx, pool, m, "it failed"))
		default:
			current = m
		}
	}
	if !wanted {
		return nil, nil, errors.Join(errs...)
	}
	cond := &metav1.Condition{Type: kaironv1.ConditionSnapshotReady.String(), Status: metav1.ConditionFalse, ObservedGeneration: pool.Generation}
	switch {
	case current == nil && failed != "":
		cond.Reason, cond.Message = kaironv1.SnapshotReasonFailed, failed+"; it is replaced, and members boot meanwhile"
	case current == nil && img.unknown:
		cond.Reason, cond.Message = kaironv1.SnapshotReasonTemplateBooting, "waiting for the digest of spec.template.spec.image before creating the template machine"
	case current == nil:
		m, err := r.createTemplate(ctx, pool, hash, img.image)
		if err != nil {
			errs = append(errs, err)
			cond.Reason, cond.Message = kaironv1.SnapshotReasonFailed, fmt.Sprintf("creating the template machine: %v", err)
		} else {
			cond.Reason, cond.Message = kaironv1.SnapshotReasonTemplateBooting, fmt.Sprintf("template machine %s created; members boot meanwhile", m.Name)
		}
	case current.Status.Snapshot != nil && current.Spec.NodeName != "":
		s := current.Status.Snapshot
		cond.Status, cond.Reason = metav1.ConditionTrue, kaironv1.SnapshotReasonSaved
		cond.Message = fmt.Sprintf("template machine %s saved on node %s; new members are its clones", current.Name, current.Spec.NodeName)
		return &kaironv1.MachinePoolSnapshot{
			Machine: current.Name, NodeName: current.Spec.NodeName, Path: s.Path, TemplateHash: hash,
			TakenAt: ptr.To(s.SavedAt), SizeBytes: s.SizeBytes,
		}, cond, errors.Join(errs...)
	case current.Status.Phase == kaironv1.MachineRunning:
		cond.Reason, cond.Message = kaironv1.SnapshotReasonSaving, fmt.Sprintf("template machine %s runs on node %s, which saves it; members boot meanwhile", current.Name, current.Spec.NodeName)
	default:
		cond.Reason, cond.Message = kaironv1.SnapshotReasonTemplateBooting, fmt.Sprintf("template machine %s is %s; members boot meanwhile", current.Name, phaseWord(current.Status.Phase))
	}
	return nil, cond, errors.Join(errs...)
}

func phaseWord(p kaironv1.MachinePhase) string {
	if p == "" {
		return "Pending"
	}
	return string(p)
}

// createTemplate creates the pool's template Machine for hash, running
// image.
func (r *MachinePoolReconciler) createTemplate(ctx context.Context, pool *kaironv1.MachinePool, hash, image string) (*kaironv1.Machine, error) {
	labels := maps.Clone(pool.Spec.Template.Metadata.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	delete(labels, kaironv1.LabelMachineClaim)
	delete(labels, kaironv1.LabelMachinePool)
	delete(labels, kaironv1.LabelPoolState)
	labels[kaironv1.LabelMachinePoolTemplate] = pool.Name
	labels[kaironv1.LabelMachinePoolTemplateHash] = hash
	annotations := maps.Clone(pool.Spec.Template.Metadata.Annotations)
	if annotations == nil {
		annotations = map[string]string{}
	}
	delete(annotations, kaironv1.AnnotationRestoreFrom)
	annotations[kaironv1.AnnotationSnapshotSave] = "true"
	m := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: pool.Namespace, Name: templateMachineName(pool.Name, hash),
			Labels: labels, Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(pool, machinePoolKind)},
		},
		Spec: *pool.Spec.Template.Spec.DeepCopy(),
	}
	m.Spec.Image = image
	if err := r.Client.Create(ctx, m); err != nil {
		if apierrors.IsAlreadyExists(err) {
			// Created by an earlier pass the cache does not show yet, or
			// the old one of this name is still being deleted.
			return m, nil
		}
		r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, kaironv1.ReplicaReasonFailedCreate, "Create", "Creating the template machine: %v", err)
		return nil, err
	}
	log.FromContext(ctx).Info("Created template machine", "machine", klog.KObj(m), "templateHash", hash)
	r.Recorder.Eventf(pool, m, corev1.EventTypeNormal, kaironv1.EventReasonSuccessfulCreate, "Create", "Created template machine %s to snapshot", m.Name)
	return m, nil
}

func (r *MachinePoolReconciler) deleteTemplate(ctx context.Context, pool *kaironv1.MachinePool, m *kaironv1.Machine, why string) error {
	err := r.Client.Delete(ctx, m, client.Preconditions{UID: ptr.To(m.UID)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting template machine %s: %w", m.Name, err)
	}
	log.FromContext(ctx).Info("Deleted template machine", "machine", klog.KObj(m), "why", why)
	r.Recorder.Eventf(pool, m, corev1.EventTypeNormal, kaironv1.EventReasonSuccessfulDelete, "Delete", "Deleted template machine %s: %s", m.Name, why)
	return nil
}

// cloneFrom makes m, a new member, a clone of snap: restored from it
// wherever the scheduler places it. It is not pinned to the template's
// node: the node it lands on fetches the file if it lacks it, so a full
// template node does not leave clones Pending while others have room.
func cloneFrom(m *kaironv1.Machine, snap *kaironv1.MachinePoolSnapshot) {
	if snap == nil {
		return
	}
	if m.Annotations == nil {
		m.Annotations = map[string]string{}
	}
	m.Annotations[kaironv1.AnnotationRestoreFrom] = snap.Machine
}

// setSnapshotStatus records snap and cond (both nil with warmFrom Boot).
func setSnapshotStatus(status *kaironv1.MachinePoolStatus, snap *kaironv1.MachinePoolSnapshot, cond *metav1.Condition) {
	if cond == nil {
		status.Snapshot = nil
		meta.RemoveStatusCondition(&status.Conditions, kaironv1.ConditionSnapshotReady.String())
		return
	}
	status.Snapshot = snap
	meta.SetStatusCondition(&status.Conditions, *cond)
}
