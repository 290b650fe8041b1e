package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// MachineWebhookPath is where the validating webhook for Machines is served.
const MachineWebhookPath = "/validate-machine"

// MachineValidator refuses Machines the API server's own validation cannot:
// those that need other objects to judge.
//
// On create it refuses a Machine that would take its namespace over a
// MachineQuota. Unlike the scheduler, it charges every Machine that is not
// Stopped, Failed or being deleted, placed or not, so a namespace cannot
// pile up Pending Machines that could never be admitted. A Machine created
// with spec.nodeName already set skips the scheduler, and with it the
// scheduler's quota and capacity checks, so it is charged here like any other.
// A Machine it allows is charged to the quotas at once (an annotation written
// with the quota's resourceVersion), so Machines created in parallel cannot
// together pass a quota: each sees the others' charges.
//
// On an update that starts a stopped Machine again (spec.powerState from
// Stopped to Running) it checks the quotas again: a Stopped Machine is not
// charged, so starting it is admitting it anew. Its size cannot change after
// creation (the API server refuses edits of spec.cpu and spec.memory).
//
// On create and on a change of spec.nodeName it refuses a nodeName that
// names no Node, which would otherwise leave the Machine waiting forever
// for a node agent that does not exist.
type MachineValidator struct {
	// Reader should read from the API server, not a cache: a cache that
	// lags lets a quick series of creates through past a quota.
	Reader client.Reader
	// Writer charges admitted Machines to the quotas (an update with the
	// quota's resourceVersion). Nil judges only: parallel creates can then
	// pass a quota together.
	Writer client.Writer
	// Seen says whether the Machine watch delivered a UID before a time
	// (nil: never); it settles the charge of a Machine created and deleted
	// again between two admissions.
	Seen func(uid types.UID, before time.Time) bool
	// Now is the clock of the charges' expiry (nil: time.Now).
	Now func() time.Time
}

var _ admission.Validator[*kaironv1.Machine] = &MachineValidator{}

// ValidateCreate checks the Machine's nodeName and the quotas of its namespace.
func (v *MachineValidator) ValidateCreate(ctx context.Context, m *kaironv1.Machine) (admission.Warnings, error) {
	if err := v.validateNodeName(ctx, m); err != nil {
		return nil, err
	}
	return nil, v.validateQuota(ctx, m, false)
}

// ValidateUpdate checks a changed nodeName, and the quotas when the update
// starts a stopped Machine again. Other updates are not charged again: a
// Machine's size is charged when it is created and cannot change.
func (v *MachineValidator) ValidateUpdate(ctx context.Context, old, m *kaironv1.Machine) (admission.Warnings, error) {
	if m.Spec.NodeName != old.Spec.NodeName {
		if err := v.validateNodeName(ctx, m); err != nil {
			return nil, err
		}
	}
	if rules.StartsAgain(old, m) {
		return nil, v.validateQuota(ctx, m, true)
	}
	return nil, nil
}

// ValidateDelete allows every deletion.
func (v *MachineValidator) ValidateDelete(context.Context, *kaironv1.Machine) (admission.Warnings, error) {
	return nil, nil
}

func (v *MachineValidator) validateNodeName(ctx context.Context, m *kaironv1.Machine) error {
	if m.Spec.NodeName == "" {
		return nil
	}
	var node corev1.Node
	err := v.Reader.Get(ctx, client.ObjectKey{Name: m.Spec.NodeName}, &node)
	switch {
	case apierrors.IsNotFound(err):
		return machineInvalid(m, field.Invalid(field.NewPath("spec", "nodeName"), m.Spec.NodeName,
			fmt.Sprintf("no Node named %q exists; leave spec.nodeName empty to let the scheduler choose", m.Spec.NodeName)))
	case err != nil:
		return apierrors.NewInternalError(fmt.Errorf("looking up node %q: %w", m.Spec.NodeName, err))
	}
	if !rules.IsKaironNode(&node) {
		return machineInvalid(m, field.Invalid(field.NewPath("spec", "nodeName"), m.Spec.NodeName,
			fmt.Sprintf("node %q is not a Kairon node (it has no %s label), so nothing would run the Machine there", m.Spec.NodeName, kaironv1.LabelNode)))
	}
	return nil
}

// maxQuotaChargeAttempts bounds how often one admission re-judges after
// losing a race for a quota to another admission.
const maxQuotaChargeAttempts = 8

// validateQuota judges m against every quota of its namespace and, if all
// admit it, charges it to them (quota_admission.go in internal/rules says
// why): an admission that loses the race for a quota's update judges again
// with the winner's charge counted.
func (v *MachineValidator) validateQuota(ctx context.Context, m *kaironv1.Machine, restart bool) error {
	for range maxQuotaChargeAttempts {
		err := v.judgeAndCharge(ctx, m, restart)
		if !apierrors.IsConflict(err) {
			return err
		}
	}
	return apierrors.NewTooManyRequests(fmt.Sprintf("the MachineQuotas of namespace %s are being charged by other admissions; try again", m.Namespace), 1)
}

func (v *MachineValidator) judgeAndCharge(ctx context.Context, m *kaironv1.Machine, restart bool) error {
	var quotas kaironv1.MachineQuotaList
	if err := v.Reader.List(ctx, &quotas, client.InNamespace(m.Namespace)); err != nil {
		return apierrors.NewInternalError(fmt.Errorf("listing machine quotas: %w", err))
	}
	if len(quotas.Items) == 0 {
		return nil
	}
	// Only Machines the watch delivered before this list began may settle
	// a charge by having been seen: a later one may be missing from it.
	listedAt := time.Now()
	seen := func(uid types.UID) bool { return v.Seen != nil && v.Seen(uid, listedAt) }
	var machines kaironv1.MachineList
	if err := v.Reader.List(ctx, &machines, client.InNamespace(m.Namespace)); err != nil {
		return apierrors.NewInternalError(fmt.Errorf("listing machines: %w", err))
	}
	// An update judges the Machine as it will be: its own current version
	// is not counted on top of it.
	others := machines.Items[:0]
	for _, other := range machines.Items {
		if other.Name != m.Name || m.Name == "" {
			others = append(others, other)
		}
	}
	now := v.now()
	var refusals []string
	var charge []*kaironv1.MachineQuota
	for i := range quotas.Items {
		q := &quotas.Items[i]
		if q.DeletionTimestamp != nil {
			continue
		}
		used, _ := rules.QuotaUsageIncludingUnplaced(q, others)
		pending := rules.OutstandingCharges(rules.ParseAdmissionCharges(q), others, m.UID, now, seen)
		if len(pending) >= rules.MaxAdmissionCharges {
			return apierrors.NewTooManyRequests(fmt.Sprintf("MachineQuota %q holds %d admitted Machines not yet stored; try again", q.Name, len(pending)), 1)
		}
		if ok, message := rules.QuotaAdmits(q, rules.AddCharges(used, pending), m); !ok {
			refusals = append(refusals, message)
			continue
		}
		charge = append(charge, q)
	}
	if len(refusals) > 0 {
		return apierrors.NewForbidden(kaironv1.GroupVersion.WithResource("machines").GroupResource(), machineName(m),
			fmt.Errorf("%s", strings.Join(refusals, "; ")))
	}
	if req, err := admission.RequestFromContext(ctx); err == nil && req.DryRun != nil && *req.DryRun {
		// A dry run is judged but leaves nothing behind (the webhook says
		// sideEffects: NoneOnDryRun).
		return nil
	}
	for _, q := range charge {
		if err := v.charge(ctx, q, others, m, restart, now, seen); err != nil {
			return err
		}
	}
	return nil
}

// charge records m's charge on q, dropping charges that are settled, with
// q's resourceVersion as read: a conflict means another admission (or the
// quota controller) wrote q since, and the caller judges again.
func (v *MachineValidator) charge(ctx context.Context, q *kaironv1.MachineQuota, machines []kaironv1.Machine, m *kaironv1.Machine, restart bool, now time.Time, seen func(types.UID) bool) error {
	if v.Writer == nil {
		return nil
	}
	charges := append(rules.OutstandingCharges(rules.ParseAdmissionCharges(q), machines, m.UID, now, seen), rules.ChargeFor(m, now, restart))
	q = q.DeepCopy()
	if q.Annotations == nil {
		q.Annotations = map[string]string{}
	}
	q.Annotations[kaironv1.AnnotationQuotaAdmissionCharges] = rules.FormatAdmissionCharges(charges)
	if err := v.Writer.Update(ctx, q); err != nil {
		if apierrors.IsConflict(err) {
			return err
		}
		return apierrors.NewInternalError(fmt.Errorf("charging MachineQuota %q: %w", q.Name, err))
	}
	return nil
}

func (v *MachineValidator) now() time.Time {
	if v.Now != nil {
		return v.Now()
	}
	return time.Now()
}

func machineInvalid(m *kaironv1.Machine, errs ...*field.Error) error {
	return apierrors.NewInvalid(kaironv1.GroupVersion.WithKind("Machine").GroupKind(), machineName(m), errs)
}

// machineName names a Machine in messages even when the API server has yet
// to generate its name.
func machineName(m *kaironv1.Machine) string {
	if m.Name == "" && m.GenerateName != "" {
		return m.GenerateName + "<generated>"
	}
	return m.Name
}
