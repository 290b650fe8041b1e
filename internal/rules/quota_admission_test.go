package rules

import (
	"reflect"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

func TestOutstandingCharges(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	charge := func(uid string, expiresIn time.Duration) AdmissionCharge {
		return AdmissionCharge{UID: types.UID(uid), Name: uid, CPU: 1, Memory: resource.MustParse("1Gi"), Expires: now.Add(expiresIn)}
	}
	restart := func(uid string) AdmissionCharge {
		c := charge(uid, time.Minute)
		c.Restart = true
		return c
	}
	stored := *rulestest.Machine("stored", 1, "1Gi", rulestest.Placed("a", kaironv1.MachineRunning))
	stopped := *rulestest.Machine("stopped", 1, "1Gi", rulestest.Placed("a", kaironv1.MachineStopped))
	tests := []struct {
		name     string
		charges  []AdmissionCharge
		machines []kaironv1.Machine
		self     types.UID
		seen     types.UID
		want     []string
	}{
		{name: "none", want: nil},
		{name: "a Machine not stored yet stays charged", charges: []AdmissionCharge{charge("uid-new", time.Second)}, want: []string{"uid-new"}},
		{name: "a stored and counted Machine is settled", charges: []AdmissionCharge{charge("uid-stored", time.Minute)}, machines: []kaironv1.Machine{stored}, want: nil},
		{name: "a created Machine stored but not counted is settled", charges: []AdmissionCharge{charge("uid-stopped", time.Minute)}, machines: []kaironv1.Machine{stopped}, want: nil},
		{name: "a created Machine seen by the watch and deleted again is settled", charges: []AdmissionCharge{charge("uid-gone", time.Minute)}, seen: "uid-gone", want: nil},
		{name: "a restarted Machine still reported Stopped stays charged", charges: []AdmissionCharge{restart("uid-stopped")}, machines: []kaironv1.Machine{stopped}, want: []string{"uid-stopped"}},
		{name: "a restarted Machine now counted is settled", charges: []AdmissionCharge{restart("uid-stored")}, machines: []kaironv1.Machine{stored}, want: nil},
		{name: "a restarted Machine deleted since is settled", charges: []AdmissionCharge{restart("uid-stopped")}, seen: "uid-stopped", want: nil},
		{name: "expired at the instant", charges: []AdmissionCharge{charge("uid-old", 0)}, want: nil},
		{name: "the Machine being admitted is not charged twice", charges: []AdmissionCharge{charge("uid-self", time.Minute), charge("uid-other", time.Minute)}, self: "uid-self", want: []string{"uid-other"}},
		{name: "a charge without a UID is ignored", charges: []AdmissionCharge{charge("", time.Minute)}, want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			seen := func(uid types.UID) bool { return uid == tt.seen }
			for _, c := range OutstandingCharges(tt.charges, tt.machines, tt.self, now, seen) {
				got = append(got, string(c.UID))
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("OutstandingCharges = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestAdmissionChargesRoundTrip(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	m := rulestest.Machine("web", 2, "512Mi")
	later := ChargeFor(m, now.Add(time.Second), false)
	first := ChargeFor(rulestest.Machine("db", 1, "1Gi"), now, true)
	q := testQuota(kaironv1.MachineResources{})
	q.Annotations = map[string]string{kaironv1.AnnotationQuotaAdmissionCharges: FormatAdmissionCharges([]AdmissionCharge{later, first})}
	got := ParseAdmissionCharges(q)
	if len(got) != 2 || got[0].Name != "db" || got[1].Name != "web" || !got[0].Restart || got[1].Restart {
		t.Fatalf("parsed %+v, want db then web (oldest expiry first)", got)
	}
	if got[1].CPU != 2 || got[1].Memory.Cmp(resource.MustParse("512Mi")) != 0 || !got[1].Expires.Equal(now.Add(time.Second+AdmissionChargeTTL)) {
		t.Errorf("web's charge came back as %+v", got[1])
	}
	used := AddCharges(kaironv1.MachineResources{Machines: ptr.To[int32](1), CPU: ptr.To[int32](1), Memory: ptr.To(resource.MustParse("1Gi"))}, got)
	if *used.Machines != 3 || *used.CPU != 4 || used.Memory.Cmp(resource.MustParse("2560Mi")) != 0 {
		t.Errorf("usage with charges = %d machines, %d cpu, %s", *used.Machines, *used.CPU, used.Memory.String())
	}
	// A broken annotation must not lock the namespace out.
	q.Annotations[kaironv1.AnnotationQuotaAdmissionCharges] = "{not json"
	if got := ParseAdmissionCharges(q); got != nil {
		t.Errorf("broken annotation parsed as %+v, want no charges", got)
	}
}
