package rules

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

func testQuota(hard kaironv1.MachineResources) *kaironv1.MachineQuota {
	return &kaironv1.MachineQuota{ObjectMeta: metav1.ObjectMeta{Name: "team", Namespace: "team"}, Spec: kaironv1.MachineQuotaSpec{Hard: hard}}
}

func TestQuotaUsage(t *testing.T) {
	deleting := func(m *kaironv1.Machine) { m.DeletionTimestamp = ptr.To(metav1.Now()) }
	otherNamespace := func(m *kaironv1.Machine) { m.Namespace = "other" }
	machines := []kaironv1.Machine{
		*rulestest.Machine("running", 2, "1Gi", rulestest.Placed("node-1", kaironv1.MachineRunning)),
		*rulestest.Machine("just-bound", 1, "512Mi", rulestest.Placed("node-2", "")),
		*rulestest.Machine("stopped", 4, "4Gi", rulestest.Placed("node-1", kaironv1.MachineStopped)),
		*rulestest.Machine("failed", 4, "4Gi", rulestest.Placed("node-1", kaironv1.MachineFailed)),
		*rulestest.Machine("pending", 4, "4Gi", rulestest.Placed("", kaironv1.MachinePending)),
		*rulestest.Machine("leaving", 4, "4Gi", rulestest.Placed("node-1", kaironv1.MachineRunning), deleting),
		*rulestest.Machine("neighbour", 4, "4Gi", rulestest.Placed("node-1", kaironv1.MachineRunning), otherNamespace),
	}
	used, charges := QuotaUsage(testQuota(kaironv1.MachineResources{}), machines)

	if *used.Machines != 2 || *used.CPU != 3 || used.Memory.Cmp(resource.MustParse("1536Mi")) != 0 {
		t.Errorf("used = machines %d, cpu %d, memory %s; want 2, 3, 1536Mi", *used.Machines, *used.CPU, used.Memory)
	}
	type row struct {
		Machine string
		Counted bool
		Reason  string
	}
	var got []row
	for _, c := range charges {
		got = append(got, row{c.Machine, c.Counted, c.Reason})
	}
	want := []row{
		{"running", true, "counted: Running on node-1"},
		{"just-bound", true, "counted: Scheduled on node-2"},
		{"stopped", false, "not counted: Stopped"},
		{"failed", false, "not counted: Failed"},
		{"pending", false, "not counted: not yet scheduled"},
		{"leaving", false, "not counted: being deleted"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("charges:\n got %+v\nwant %+v", got, want)
	}

	// The webhook's view also charges the Machine waiting for a node.
	used, _ = quotaUsage(testQuota(kaironv1.MachineResources{}), machines, true)
	if *used.Machines != 3 || *used.CPU != 7 {
		t.Errorf("with unplaced: machines %d, cpu %d; want 3, 7", *used.Machines, *used.CPU)
	}
}

func TestQuotaUsageOfNothingIsZero(t *testing.T) {
	used, charges := QuotaUsage(testQuota(kaironv1.MachineResources{}), nil)
	if used.Machines == nil || used.CPU == nil || used.Memory == nil || *used.Machines != 0 || *used.CPU != 0 || !used.Memory.IsZero() || len(charges) != 0 {
		t.Errorf("QuotaUsage(nil) = %+v, %v; want zeros, set", used, charges)
	}
}

func TestQuotaAdmits(t *testing.T) {
	usage := func(machines, cpu int32, memory string) kaironv1.MachineResources {
		return kaironv1.MachineResources{Machines: ptr.To(machines), CPU: ptr.To(cpu), Memory: ptr.To(resource.MustParse(memory))}
	}
	tests := []struct {
		name    string
		hard    kaironv1.MachineResources
		used    kaironv1.MachineResources
		machine *kaironv1.Machine
		wantOK  bool
		wantMsg string
	}{
		{
			name:    "no limits",
			used:    usage(100, 100, "100Gi"),
			machine: rulestest.Machine("m", 64, "64Gi"),
			wantOK:  true,
		},
		{
			name:    "fits exactly",
			hard:    usage(10, 16, "8Gi"),
			used:    usage(9, 14, "7Gi"),
			machine: rulestest.Machine("m", 2, "1Gi"),
			wantOK:  true,
		},
		{
			name:    "machines",
			hard:    kaironv1.MachineResources{Machines: ptr.To[int32](10)},
			used:    usage(10, 10, "2560Mi"),
			machine: rulestest.Machine("m", 1, "256Mi"),
			wantMsg: `exceeds MachineQuota "team": machines 10/10 used`,
		},
		{
			name:    "every exceeded resource is named",
			hard:    usage(10, 16, "8Gi"),
			used:    usage(10, 15, "7Gi"),
			machine: rulestest.Machine("m", 2, "2Gi"),
			wantMsg: `exceeds MachineQuota "team": machines 10/10 used, cpu 15/16 used (needs 2), memory 7Gi/8Gi used (needs 2Gi)`,
		},
		{
			name:    "defaults charged when the spec has none",
			hard:    kaironv1.MachineResources{Memory: ptr.To(resource.MustParse("1Gi"))},
			used:    usage(4, 4, "1Gi"),
			machine: &kaironv1.Machine{},
			wantMsg: `exceeds MachineQuota "team": memory 1Gi/1Gi used (needs 256Mi)`,
		},
		{
			name:    "a zero limit admits nothing",
			hard:    kaironv1.MachineResources{Machines: ptr.To[int32](0)},
			used:    kaironv1.MachineResources{},
			machine: rulestest.Machine("m", 1, "256Mi"),
			wantMsg: `exceeds MachineQuota "team": machines 0/0 used`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, msg := QuotaAdmits(testQuota(tt.hard), tt.used, tt.machine)
			if ok != tt.wantOK || msg != tt.wantMsg {
				t.Errorf("QuotaAdmits = %v, %q\nwant          %v, %q", ok, msg, tt.wantOK, tt.wantMsg)
			}
		})
	}
}

func TestStartsAgain(t *testing.T) {
	for _, tt := range []struct {
		old, new kaironv1.PowerState
		want     bool
	}{
		{kaironv1.PowerStateStopped, kaironv1.PowerStateRunning, true},
		{kaironv1.PowerStateStopped, "", true}, // empty is Running
		{kaironv1.PowerStateStopped, kaironv1.PowerStateStopped, false},
		{kaironv1.PowerStateRunning, kaironv1.PowerStateRunning, false},
		{kaironv1.PowerStateRunning, kaironv1.PowerStateStopped, false},
		{"", kaironv1.PowerStateRunning, false},
	} {
		old := &kaironv1.Machine{Spec: kaironv1.MachineSpec{PowerState: tt.old}}
		m := &kaironv1.Machine{Spec: kaironv1.MachineSpec{PowerState: tt.new}}
		if got := StartsAgain(old, m); got != tt.want {
			t.Errorf("StartsAgain(%q -> %q) = %v, want %v", tt.old, tt.new, got, tt.want)
		}
	}
}
