package rules

import (
	"encoding/json"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// Admission charges make the quota check of parallel creates atomic.
//
// The webhook sees the Machines the API server has stored, but not those it
// admitted a moment ago that are still on their way to etcd. Two Machines
// admitted side by side would each see the other's room as free. So before
// it allows a Machine, the webhook writes a charge for it onto every quota of
// the namespace, with an update that carries the quota's resourceVersion: of
// two admissions racing, one update wins and the other conflicts, reads the
// winner's charge and judges again. Kubernetes' ResourceQuota admission
// serialises the same way, through the quota's status.
//
// A charge stands until the Machine it is for is stored and counted by the
// usage itself, or until it expires (the create failed after admission, or a
// restarted Machine was never started by its agent).

// AdmissionChargeTTL is how long a charge is held for a Machine that does not
// show up counted. The API server gives a webhook at most 30 s, so a create
// that was admitted is stored or failed well within it; a restart waits for
// the agent to report the Machine no longer Stopped.
const AdmissionChargeTTL = 60 * time.Second

// MaxAdmissionCharges bounds the charges one quota carries. More admissions
// than this within a TTL are refused until some are stored: it keeps the
// annotation, and every admission's work, small.
const MaxAdmissionCharges = 256

// AdmissionCharge is one Machine admitted against a quota.
type AdmissionCharge struct {
	// UID is the Machine's (the API server assigns it before validating
	// admission), so a charge follows the object, not a reused name.
	UID     types.UID         `json:"uid"`
	Name    string            `json:"name"`
	CPU     int32             `json:"cpu"`
	Memory  resource.Quantity `json:"memory"`
	Expires time.Time         `json:"expires"`
	// Restart marks the charge of a stored Machine started again
	// (spec.powerState Stopped to Running): it is settled once the usage
	// counts the Machine, or the Machine is gone. A create's charge is
	// settled as soon as the Machine is seen stored at all.
	Restart bool `json:"restart,omitempty"`
}

// ParseAdmissionCharges reads a quota's charges. Anything unreadable counts as
// no charges: only the controller writes the annotation, and a broken one
// must not lock a namespace out for good.
func ParseAdmissionCharges(q *kaironv1.MachineQuota) []AdmissionCharge {
	raw, ok := q.Annotations[kaironv1.AnnotationQuotaAdmissionCharges]
	if !ok || raw == "" {
		return nil
	}
	var charges []AdmissionCharge
	if err := json.Unmarshal([]byte(raw), &charges); err != nil {
		return nil
	}
	return charges
}

// FormatAdmissionCharges is the annotation value for charges, oldest first.
func FormatAdmissionCharges(charges []AdmissionCharge) string {
	sort.SliceStable(charges, func(i, j int) bool { return charges[i].Expires.Before(charges[j].Expires) })
	b, err := json.Marshal(charges)
	if err != nil {
		// Only plain values are marshalled; this cannot fail.
		panic(err)
	}
	return string(b)
}

// OutstandingCharges are the charges of a quota still to be added to its
// usage at now: not expired, not for the Machine being admitted (self), and
// not settled. machines is what the usage was computed from; seen says
// whether a Machine's UID was ever seen stored (or deleted) by a watch, which
// settles the charge of a create even when the Machine is gone again before
// the next admission lists the namespace.
func OutstandingCharges(charges []AdmissionCharge, machines []kaironv1.Machine, self types.UID, now time.Time, seen func(types.UID) bool) []AdmissionCharge {
	stored := make(map[types.UID]bool, len(machines))
	counted := make(map[types.UID]bool, len(machines))
	for i := range machines {
		stored[machines[i].UID] = true
		if ok, _ := quotaCounts(&machines[i], true); ok {
			counted[machines[i].UID] = true
		}
	}
	var out []AdmissionCharge
	for _, c := range charges {
		switch {
		case c.UID == "" || c.UID == self || !now.Before(c.Expires) || counted[c.UID]:
			continue
		case c.Restart && !stored[c.UID]:
			continue // deleted since it was started again
		case !c.Restart && (stored[c.UID] || (seen != nil && seen(c.UID))):
			continue
		}
		out = append(out, c)
	}
	return out
}

// AddCharges adds outstanding charges to used, as if their Machines were
// stored.
func AddCharges(used kaironv1.MachineResources, charges []AdmissionCharge) kaironv1.MachineResources {
	count, cpu := ptr.Deref(used.Machines, 0), ptr.Deref(used.CPU, 0)
	memory := ptr.Deref(used.Memory, resource.Quantity{}).DeepCopy()
	for _, c := range charges {
		count++
		cpu += c.CPU
		memory.Add(c.Memory)
	}
	return kaironv1.MachineResources{Machines: &count, CPU: &cpu, Memory: &memory}
}

// ChargeFor is the charge that admitting m at now adds; restart says m is a
// stored Machine started again rather than a new one.
func ChargeFor(m *kaironv1.Machine, now time.Time, restart bool) AdmissionCharge {
	return AdmissionCharge{UID: m.UID, Name: m.Name, CPU: MachineCPU(m), Memory: MachineMemory(m), Expires: now.Add(AdmissionChargeTTL), Restart: restart}
}
