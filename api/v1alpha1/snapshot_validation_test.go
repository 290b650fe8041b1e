package v1alpha1_test

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/zyvor/kairon/internal/testenv"
)

// The API server's checks of SnapshotSchedules, MachineSnapshots and a
// Machine's spec.restoreFrom, each refusal naming the field.
func TestSnapshotValidation(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	for _, tt := range []struct {
		name, doc string
		want      []string
	}{
		{"cron with four fields", `
kind: SnapshotSchedule
metadata: {name: four}
spec: {schedule: "* * * *"}`, []string{"spec.schedule", "must be a cron schedule"}},
		{"cron with words", `
kind: SnapshotSchedule
metadata: {name: words}
spec: {schedule: "every five minutes"}`, []string{"spec.schedule", "must be a cron schedule"}},
		{"unknown macro", `
kind: SnapshotSchedule
metadata: {name: macro}
spec: {schedule: "@sometimes"}`, []string{"spec.schedule", "must be a cron schedule"}},
		{"no schedule", `
kind: SnapshotSchedule
metadata: {name: none}
spec: {retention: 2}`, []string{"spec.schedule", "Required"}},
		{"retention zero", `
kind: SnapshotSchedule
metadata: {name: zero}
spec: {schedule: "@hourly", retention: 0}`, []string{"spec.retention", "greater than or equal to 1"}},
		{"snapshot without a machine", `
kind: MachineSnapshot
metadata: {name: nomachine}
spec: {machineName: ""}`, []string{"spec.machineName", "at least 1"}},
		{"restore from a bad name", `
kind: Machine
metadata: {name: badrestore}
spec: {restoreFrom: {snapshotName: "Not_A_Name"}}`, []string{"spec.restoreFrom.snapshotName", "should match"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			u := object(t, tt.doc)
			u.SetNamespace(ns)
			err := env.Client.Create(ctx, u)
			if err == nil {
				t.Fatalf("accepted; want an error mentioning %q", tt.want)
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}

	for i, schedule := range []string{"*/15 * * * *", "0 3 * * MON-FRI", "5,35 0-23/2 1 JAN *", "@daily", "@every 5m"} {
		u := object(t, "kind: SnapshotSchedule\nmetadata: {name: good-"+string(rune('a'+i))+"}\nspec: {schedule: \""+schedule+"\"}")
		u.SetNamespace(ns)
		err := env.Client.Create(ctx, u)
		if schedule == "@every 5m" {
			// Not cron syntax: refused, as the controller could not keep
			// the promise of the field's documentation.
			if err == nil || !strings.Contains(err.Error(), "spec.schedule") {
				t.Errorf("schedule %q: got %v, want a refusal naming spec.schedule", schedule, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("schedule %q refused: %v", schedule, err)
			continue
		}
		if got, _, _ := unstructured.NestedInt64(u.Object, "spec", "retention"); got != 3 {
			t.Errorf("schedule %q: spec.retention defaulted to %d, want 3", schedule, got)
		}
	}

	// spec.restoreFrom and spec.machineName cannot change.
	m := object(t, "kind: Machine\nmetadata: {name: restored}\nspec: {restoreFrom: {snapshotName: snap-a}}")
	m.SetNamespace(ns)
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatalf("a restored Machine refused: %v", err)
	}
	_ = unstructured.SetNestedField(m.Object, "snap-b", "spec", "restoreFrom", "snapshotName")
	if err := env.Client.Update(ctx, m); err == nil || !strings.Contains(err.Error(), "spec.restoreFrom is immutable") {
		t.Errorf("changing spec.restoreFrom: got %v, want it refused as immutable", err)
	}
	unstructured.RemoveNestedField(m.Object, "spec", "restoreFrom")
	if err := env.Client.Update(ctx, m); err == nil || !strings.Contains(err.Error(), "spec.restoreFrom is immutable") {
		t.Errorf("removing spec.restoreFrom: got %v, want it refused as immutable", err)
	}
	plain := object(t, "kind: Machine\nmetadata: {name: plain}\nspec: {cpu: 1}")
	plain.SetNamespace(ns)
	if err := env.Client.Create(ctx, plain); err != nil {
		t.Fatalf("a Machine refused: %v", err)
	}
	plain.SetLabels(map[string]string{"touched": "yes"})
	if err := env.Client.Update(ctx, plain); err != nil {
		t.Errorf("updating a label of a Machine without spec.restoreFrom: %v", err)
	}
	_ = unstructured.SetNestedField(plain.Object, "snap-a", "spec", "restoreFrom", "snapshotName")
	if err := env.Client.Update(ctx, plain); err == nil || !strings.Contains(err.Error(), "spec.restoreFrom is immutable") {
		t.Errorf("adding spec.restoreFrom: got %v, want it refused as immutable", err)
	}
	// A template's digest names its copy on other nodes: hex only.
	for digest, ok := range map[string]bool{
		strings.Repeat("ab", 32): true,
		"../../../../etc/passwd": false,
		strings.Repeat("AB", 32): false,
	} {
		_ = unstructured.SetNestedMap(plain.Object, map[string]any{
			"path": "/var/lib/kairon/t.state", "sizeBytes": int64(1), "savedAt": "2026-12-03T10:00:00Z", "sha256": digest,
		}, "status", "snapshot")
		err := env.Client.Status().Update(ctx, plain)
		switch {
		case ok && err != nil:
			t.Errorf("status.snapshot.sha256 %q refused: %v", digest, err)
		case !ok && (err == nil || !strings.Contains(err.Error(), "status.snapshot.sha256")):
			t.Errorf("status.snapshot.sha256 %q: got %v, want a refusal naming status.snapshot.sha256", digest, err)
		}
	}
	s := object(t, "kind: MachineSnapshot\nmetadata: {name: snap}\nspec: {machineName: a}")
	s.SetNamespace(ns)
	if err := env.Client.Create(ctx, s); err != nil {
		t.Fatalf("a MachineSnapshot refused: %v", err)
	}
	_ = unstructured.SetNestedField(s.Object, "b", "spec", "machineName")
	if err := env.Client.Update(ctx, s); err == nil || !strings.Contains(err.Error(), "spec.machineName is immutable") {
		t.Errorf("changing spec.machineName: got %v, want it refused as immutable", err)
	}
}
