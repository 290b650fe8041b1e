package rules

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// QuotaCharge says whether one Machine counts against a quota, and why.
type QuotaCharge struct {
	Machine string
	Counted bool
	Reason  string
	CPU     int32
	Memory  resource.Quantity
}

// QuotaUsage adds up what a quota charges for: Machines that are placed on a
// node, not Stopped or Failed and not being deleted. Machines waiting for a
// node are not charged, so the scheduler can admit them one by one, oldest
// first. Machines of other namespaces than the quota's are ignored. Every
// field of used is set, so callers can print it without nil checks.
func QuotaUsage(quota *kaironv1.MachineQuota, machines []kaironv1.Machine) (used kaironv1.MachineResources, charges []QuotaCharge) {
	return quotaUsage(quota, machines, false)
}

// QuotaUsageIncludingUnplaced is QuotaUsage that also charges Machines
// waiting for a node. The admission webhook uses it: it refuses at creation
// what could never be admitted, so a namespace cannot pile up Pending
// Machines beyond its quota.
func QuotaUsageIncludingUnplaced(quota *kaironv1.MachineQuota, machines []kaironv1.Machine) (used kaironv1.MachineResources, charges []QuotaCharge) {
	return quotaUsage(quota, machines, true)
}

// QuotaAdmits says whether m fits in quota on top of used, which must not
// already include m. The message names the quota and every limit m would
// exceed, with the numbers, e.g.
//
//	exceeds MachineQuota "team": machines 10/10 used, memory 7Gi/8Gi used (needs 2Gi)
//
// It is empty when m fits.
func QuotaAdmits(quota *kaironv1.MachineQuota, used kaironv1.MachineResources, m *kaironv1.Machine) (ok bool, message string) {
	hard := quota.Spec.Hard
	var exceeded []string
	if hard.Machines != nil {
		if n := ptr.Deref(used.Machines, 0); n+1 > *hard.Machines {
			exceeded = append(exceeded, fmt.Sprintf("machines %d/%d used", n, *hard.Machines))
		}
	}
	if hard.CPU != nil {
		need := MachineCPU(m)
		if n := ptr.Deref(used.CPU, 0); n+need > *hard.CPU {
			exceeded = append(exceeded, fmt.Sprintf("cpu %d/%d used (needs %d)", n, *hard.CPU, need))
		}
	}
	if hard.Memory != nil {
		need := MachineMemory(m)
		total := ptr.Deref(used.Memory, resource.Quantity{})
		total = total.DeepCopy()
		total.Add(need)
		if total.Cmp(*hard.Memory) > 0 {
			n := ptr.Deref(used.Memory, resource.Quantity{})
			exceeded = append(exceeded, fmt.Sprintf("memory %s/%s used (needs %s)", FormatMemory(n), FormatMemory(*hard.Memory), FormatMemory(need)))
		}
	}
	if len(exceeded) == 0 {
		return true, ""
	}
	return false, fmt.Sprintf("exceeds MachineQuota %q: %s", quota.Name, strings.Join(exceeded, ", "))
}

// StartsAgain says whether an update of a Machine from old to m starts it
// again: spec.powerState goes from Stopped to Running (an empty powerState is
// Running, its default). A Stopped Machine is not charged against quotas, so
// admission must judge such an update like a create.
func StartsAgain(old, m *kaironv1.Machine) bool {
	return old.Spec.PowerState == kaironv1.PowerStateStopped && m.Spec.PowerState != kaironv1.PowerStateStopped
}

// quotaUsage is QuotaUsage, optionally also charging Machines that wait for a
// node.
func quotaUsage(quota *kaironv1.MachineQuota, machines []kaironv1.Machine, chargeUnplaced bool) (used kaironv1.MachineResources, charges []QuotaCharge) {
	var count, cpu int32
	memory := resource.NewQuantity(0, resource.BinarySI)
	for i := range machines {
		m := &machines[i]
		if quota.Namespace != "" && m.Namespace != quota.Namespace {
			continue
		}
		charge := QuotaCharge{Machine: m.Name, CPU: MachineCPU(m), Memory: MachineMemory(m)}
		charge.Counted, charge.Reason = quotaCounts(m, chargeUnplaced)
		if charge.Counted {
			count++
			cpu += charge.CPU
			memory.Add(charge.Memory)
		}
		charges = append(charges, charge)
	}
	return kaironv1.MachineResources{Machines: &count, CPU: &cpu, Memory: memory}, charges
}

func quotaCounts(m *kaironv1.Machine, chargeUnplaced bool) (counted bool, reason string) {
	switch {
	case m.DeletionTimestamp != nil:
		return false, "not counted: being deleted"
	case m.Status.Phase == kaironv1.MachineStopped || m.Status.Phase == kaironv1.MachineFailed:
		return false, "not counted: " + string(m.Status.Phase)
	case m.Spec.NodeName == "" && !chargeUnplaced:
		return false, "not counted: not yet scheduled"
	case m.Spec.NodeName == "":
		return true, "counted: waiting to be scheduled"
	}
	return true, fmt.Sprintf("counted: %s on %s", phaseOrScheduled(m.Status.Phase), m.Spec.NodeName)
}

// phaseOrScheduled names a placed Machine's phase even before anyone wrote
// one: a nodeName means it is at least Scheduled.
func phaseOrScheduled(phase kaironv1.MachinePhase) kaironv1.MachinePhase {
	if phase == "" || phase == kaironv1.MachinePending {
		return kaironv1.MachineScheduled
	}
	return phase
}

// QuotaExceeded is how far used is over hard, as "machines 12/10" parts; nil
// when it is within every limit. A quota can be over after it was lowered or
// when Machines were placed by hand.
func QuotaExceeded(hard, used kaironv1.MachineResources) []string {
	var over []string
	if hard.Machines != nil && ptr.Deref(used.Machines, 0) > *hard.Machines {
		over = append(over, fmt.Sprintf("machines %d/%d", ptr.Deref(used.Machines, 0), *hard.Machines))
	}
	if hard.CPU != nil && ptr.Deref(used.CPU, 0) > *hard.CPU {
		over = append(over, fmt.Sprintf("cpu %d/%d", ptr.Deref(used.CPU, 0), *hard.CPU))
	}
	if hard.Memory != nil && used.Memory != nil && used.Memory.Cmp(*hard.Memory) > 0 {
		over = append(over, fmt.Sprintf("memory %s/%s", FormatMemory(*used.Memory), FormatMemory(*hard.Memory)))
	}
	return over
}

// QuotaSummary is "machines 3/10, cpu 4/16, memory 1Gi" — used against
// hard where a limit is set, plain use where it is not.
func QuotaSummary(hard, used kaironv1.MachineResources) string {
	part := func(name, used string, hard *string) string {
		if hard == nil {
			return name + " " + used
		}
		return name + " " + used + "/" + *hard
	}
	var hardMachines, hardCPU, hardMemory *string
	if hard.Machines != nil {
		hardMachines = ptr.To(fmt.Sprint(*hard.Machines))
	}
	if hard.CPU != nil {
		hardCPU = ptr.To(fmt.Sprint(*hard.CPU))
	}
	if hard.Memory != nil {
		hardMemory = ptr.To(FormatMemory(*hard.Memory))
	}
	return strings.Join([]string{
		part("machines", fmt.Sprint(ptr.Deref(used.Machines, 0)), hardMachines),
		part("cpu", fmt.Sprint(ptr.Deref(used.CPU, 0)), hardCPU),
		part("memory", FormatMemory(ptr.Deref(used.Memory, resource.Quantity{})), hardMemory),
	}, ", ")
}
