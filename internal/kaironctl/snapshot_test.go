package kaironctl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

// readySnapshot creates a MachineSnapshot of machine and reports it Ready,
// taken ago, as its node agent would.
func readySnapshot(t *testing.T, env *testenv.Env, ns, name, machine, schedule string, ago time.Duration) *kaironv1.MachineSnapshot {
	t.Helper()
	s := &kaironv1.MachineSnapshot{ObjectMeta: meta(ns, name), Spec: kaironv1.MachineSnapshotSpec{MachineName: machine}}
	if schedule != "" {
		s.Labels = map[string]string{kaironv1.LabelSnapshotSchedule: schedule}
	}
	env.Create(t, s)
	taken := metav1.NewTime(time.Now().Add(-ago))
	memory := resource.MustParse("512Mi")
	s.Status = kaironv1.MachineSnapshotStatus{
		Phase: kaironv1.SnapshotReady, Node: "node-1", Store: "kairon-local", File: name + ".state",
		SizeBytes: 64 << 20, PauseMillis: 250, TakenAt: &taken, CPU: 2, Memory: &memory, Image: "default",
	}
	env.SetStatus(t, s)
	return s
}

// describe snapshotschedule: the raw object, then every matching Machine
// with its newest Ready snapshot of the schedule and its age, or why it has
// none; with no match, the hint every describe exception prints.
func TestDescribeSnapshotSchedule(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	web := map[string]string{"tier": "web"}
	for _, m := range []struct {
		name  string
		phase kaironv1.MachinePhase
	}{{"web-1", kaironv1.MachineRunning}, {"web-2", kaironv1.MachineRunning}, {"web-3", kaironv1.MachineBooting}} {
		mach := machine(t, env, ns, m.name, "node-1", 1, "256Mi", "")
		mach.Labels = web
		if err := env.Client.Update(context.Background(), mach); err != nil {
			t.Fatal(err)
		}
		mach.Status.Phase = m.phase
		env.SetStatus(t, mach)
	}
	machine(t, env, ns, "db", "node-1", 1, "256Mi", kaironv1.MachineRunning)
	readySnapshot(t, env, ns, "nightly-web-1-a", "web-1", "nightly", 26*time.Hour)
	readySnapshot(t, env, ns, "nightly-web-1-b", "web-1", "nightly", 2*time.Hour)
	readySnapshot(t, env, ns, "by-hand-web-2", "web-2", "", time.Hour) // not the schedule's
	failed := &kaironv1.MachineSnapshot{ObjectMeta: meta(ns, "nightly-web-2-a"), Spec: kaironv1.MachineSnapshotSpec{MachineName: "web-2"}}
	failed.Labels = map[string]string{kaironv1.LabelSnapshotSchedule: "nightly"}
	env.Create(t, failed)
	failed.Status = kaironv1.MachineSnapshotStatus{Phase: kaironv1.SnapshotFailed, Message: "saving the guest on node node-1: disk full (it was resumed)"}
	env.SetStatus(t, failed)
	s := &kaironv1.SnapshotSchedule{ObjectMeta: meta(ns, "nightly"), Spec: kaironv1.SnapshotScheduleSpec{Selector: web, Schedule: "0 3 * * *", Retention: 7}}
	env.Create(t, s)

	r := kctl(t, env, "describe", "snapshotschedule", "nightly", "-n", ns).ok(t)
	jsonPart, text, found := strings.Cut(r.stdout, "}\n\n")
	if !found {
		t.Fatalf("no blank line after the JSON:\n%s", r.stdout)
	}
	var got kaironv1.SnapshotSchedule
	if err := json.Unmarshal([]byte(jsonPart+"}"), &got); err != nil || got.Name != "nightly" || got.Kind != "SnapshotSchedule" {
		t.Fatalf("JSON part: %v\n%s", err, jsonPart)
	}
	if !strings.HasPrefix(r.stdout, "{\n  \"apiVersion\": \"kairon.zyvor.dev/v1alpha1\",\n  \"kind\": \"SnapshotSchedule\",\n") {
		t.Errorf("does not start with the raw JSON:\n%s", r.stdout)
	}
	schedule, _ := rules.ParseSnapshotSchedule("0 3 * * *")
	_, next := rules.ScheduleDue(schedule, got.CreationTimestamp.Time, time.Now())
	nextRun := next.UTC().Format(time.RFC3339)
	want := "" +
		"Status (recomputed fresh from Machines/MachineSnapshots right now): 3 matching, 1 with a Ready snapshot, schedule \"0 3 * * *\", retention 7, next run " + nextRun + "\n" +
		"Matching machines (3):\n" +
		"  web-1                    nightly-web-1-b (Ready, 120m ago, 64Mi, 2 kept)\n" +
		"  web-2                    none Ready yet: the newest, nightly-web-2-a, is Failed (saving the guest on node node-1: disk full (it was resumed))\n" +
		"  web-3                    none yet: the Machine is Booting; it is snapshotted only while Running, next run " + nextRun + "\n"
	if text != want {
		t.Errorf("describe snapshotschedule:\n%s\nwant\n%s", text, want)
	}

	// Suspended, the receipts say so.
	got.Spec.Suspend = true
	if err := env.Client.Update(context.Background(), &got); err != nil {
		t.Fatal(err)
	}
	r = kctl(t, env, "describe", "snapsched", "nightly", "-n", ns).ok(t)
	if !strings.Contains(r.stdout, "next run none (suspended)\n") || !strings.Contains(r.stdout, "  web-3                    none: the schedule is suspended (spec.suspend)\n") {
		t.Errorf("describe of a suspended schedule:\n%s", r.stdout)
	}

	// A selector that matches nothing: the shared hint instead of a list.
	env.Create(t, &kaironv1.SnapshotSchedule{ObjectMeta: meta(ns, "nothing"), Spec: kaironv1.SnapshotScheduleSpec{Selector: map[string]string{"app": "none"}, Schedule: "@daily"}})
	r = kctl(t, env, "describe", "snapshotschedule", "nothing", "-n", ns).ok(t)
	_, text, _ = strings.Cut(r.stdout, "}\n\n")
	wantHint := "No Machines match snapshotschedule nothing (selector app=none, in namespace " + ns + "); check with: kaironctl get machines -n " + ns + " -l app=none\n"
	if !strings.HasPrefix(text, "Status (recomputed fresh from Machines/MachineSnapshots right now): 0 matching, 0 with a Ready snapshot, schedule \"@daily\", retention 3, next run ") ||
		!strings.HasSuffix(text, "\n"+wantHint) || strings.Count(text, "\n") != 2 {
		t.Errorf("describe snapshotschedule with no matches:\n%s\nwant the status line, then\n%s", text, wantHint)
	}
	kctl(t, env, "describe", "snapshotschedule", "missing", "-n", ns).failed(t, `snapshotschedule "missing" not found in namespace "`+ns+`"`)

	// get: both kinds as tables.
	r = kctl(t, env, "get", "msnap", "-n", ns).ok(t)
	if !strings.Contains(r.stdout, "NAME") || !strings.Contains(r.stdout, "MACHINE") || !strings.Contains(r.stdout, "nightly-web-1-b") || !strings.Contains(r.stdout, "64Mi") || !strings.Contains(r.stdout, "250ms") {
		t.Errorf("get machinesnapshots:\n%s", r.stdout)
	}
	r = kctl(t, env, "get", "snapshotschedules", "-n", ns, "-o", "wide").ok(t)
	if !strings.Contains(r.stdout, "SCHEDULE") || !strings.Contains(r.stdout, "0 3 * * *") || !strings.Contains(r.stdout, "NEXT") {
		t.Errorf("get snapshotschedules -o wide:\n%s", r.stdout)
	}
}

// kaironctl restore creates a Machine from a Ready snapshot, with its
// shape, and refuses what cannot work, naming the argument.
func TestRestoreCommand(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	readySnapshot(t, env, ns, "snap", "web-1", "", 5*time.Minute)

	r := kctl(t, env, "restore", "snap", "--name", "web-1-back", "-n", ns).ok(t)
	if !strings.HasPrefix(r.stdout, "machine/web-1-back created from machinesnapshot/snap (taken 5m") || !strings.HasSuffix(r.stdout, " ago on node-1)\n") {
		t.Errorf("restore printed %q", r.stdout)
	}
	m := &kaironv1.Machine{}
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "web-1-back"}, m); err != nil {
		t.Fatal(err)
	}
	if m.Spec.RestoreFrom == nil || m.Spec.RestoreFrom.SnapshotName != "snap" || m.Spec.CPU != 2 || m.Spec.Memory.String() != "512Mi" || m.Spec.Image != "default" {
		t.Errorf("restored Machine spec %+v: want restoreFrom snap, cpu 2, 512Mi, image default", m.Spec)
	}

	r = kctl(t, env, "restore", "snap", "-n", ns, "-o", "json").ok(t)
	var printed kaironv1.Machine
	if err := json.Unmarshal([]byte(r.stdout), &printed); err != nil || printed.Kind != "Machine" || !strings.HasPrefix(printed.Name, "web-1-restore-") {
		t.Errorf("restore -o json: %v\n%s", err, r.stdout)
	}

	pending := &kaironv1.MachineSnapshot{ObjectMeta: meta(ns, "pending"), Spec: kaironv1.MachineSnapshotSpec{MachineName: "web-1"}}
	env.Create(t, pending)
	kctl(t, env, "restore", "pending", "-n", ns).failed(t, "machinesnapshot pending is Pending, not Ready")
	kctl(t, env, "restore", "nothing", "-n", ns).failed(t, `machinesnapshot "nothing" not found in namespace "`+ns+`"`)
	kctl(t, env, "restore", "snap", "--name", "web-1-back", "-n", ns).failed(t, `machine "web-1-back" already exists`, "--name")
	r = kctl(t, env, "restore", "snap", "--name", "Bad_Name", "-n", ns)
	if r.code == 0 || !strings.Contains(r.stderr, `--name "Bad_Name"`) {
		t.Errorf("restore --name Bad_Name: exit %d, stderr %q", r.code, r.stderr)
	}
	r = kctl(t, env, "restore", "-n", ns)
	if r.code == 0 || !strings.Contains(r.stderr, "restore needs a MACHINESNAPSHOT") {
		t.Errorf("restore without a snapshot: exit %d, stderr %q", r.code, r.stderr)
	}
	r = kctl(t, env, "restore", "snap", "-o", "xml", "-n", ns)
	if r.code == 0 || !strings.Contains(r.stderr, fmt.Sprintf("%q", "xml")) {
		t.Errorf("restore -o xml: exit %d, stderr %q", r.code, r.stderr)
	}
}
