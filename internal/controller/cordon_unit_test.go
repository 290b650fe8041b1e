package controller

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

func TestCordonEvacuationStrategy(t *testing.T) {
	for _, tt := range []struct {
		in      string
		want    kaironv1.MigrationStrategy
		wantErr string
	}{
		{"", kaironv1.MigrationCold, ""},
		{"cold", kaironv1.MigrationCold, ""},
		// auto chooses per Machine (rules.ChooseEvacuationStrategy).
		{"auto", rules.StrategyAuto, ""},
		{"live", "", `-cordon-evacuate-strategy "live" is not allowed: cordon evacuation never insists on live migrations; use auto`},
		{"Cold", "", `-cordon-evacuate-strategy "Cold" is not valid; use cold or auto`},
	} {
		got, err := CordonEvacuationStrategy(tt.in)
		if got != tt.want || (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("CordonEvacuationStrategy(%q) = %q, %v; want %q, %q", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

// A pass stamps every Machine it tries, and a stamped Machine is not tried
// again until MinRetryInterval, plus the second the stamp may be behind,
// has passed; a Machine whose migration is in flight is not tried at all.
// The reconciler's clock is the test's, so the boundary is exact.
func TestCordonEvacuationRetryInterval(t *testing.T) {
	const interval = 2 * time.Minute
	second := time.Unix(1_700_000_000, 0) // the first pass's, whole
	start := second.Add(250 * time.Millisecond)
	retry := second.Add(interval + attemptStampPrecision) // the first moment a retry is due
	stamp := func(at time.Time) string { return at.UTC().Format(time.RFC3339) }

	web := map[string]string{"app": "web"}
	objs := []client.Object{
		rulestest.Node("node-a", 16, "16Gi", rulestest.Cordoned),
		&kaironv1.MachineDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web-tier"},
			Spec:       kaironv1.MachineDisruptionBudgetSpec{Selector: web, MinAvailable: ptr.To(intstr.FromInt32(2))},
		},
	}
	for _, name := range []string{"web-1", "web-2", "web-3"} {
		objs = append(objs, rulestest.Machine(name, 1, "256Mi", rulestest.Placed("node-a", kaironv1.MachineRunning),
			func(m *kaironv1.Machine) { m.Labels = web }))
	}
	api := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).Build()
	clock := newTestClock(start)
	recorder := events.NewFakeRecorder(20)
	r := &CordonEvacuationReconciler{
		Client: api, APIReader: api, Recorder: recorder, Strategy: kaironv1.MigrationCold,
		MinRetryInterval: interval, Interval: 10 * time.Minute, now: clock.Now,
	}
	blocked := func(numbers string) string {
		return corev1.EventTypeWarning + " " + kaironv1.EventReasonEvacuationBlocked +
			" Node node-a is cordoned, but the machine was not migrated: budget team/web-tier allows no more disruptions (" +
			numbers + "); trying again in 2m0s"
	}

	steps := []struct {
		name string
		at   time.Time
		// the attempted-at stamps afterwards, of web-1, web-2, web-3
		wantStamps  [3]string
		wantRequeue time.Duration
		// the events of the pass; "created" stands for web-1's migration's
		wantEvents []string
	}{
		{
			name: "first pass: web-1 migrated, the others blocked, all stamped",
			at:   start, wantStamps: [3]string{stamp(second), stamp(second), stamp(second)},
			wantRequeue: interval + attemptStampPrecision,
			wantEvents: []string{"created",
				blocked("3 healthy, 2 desired, 0 allowed; 1 already spent in this pass"),
				blocked("3 healthy, 2 desired, 0 allowed; 1 already spent in this pass")},
		},
		{
			name: "the interval after the pass, but the stamp is 250ms behind: nothing",
			at:   start.Add(interval), wantStamps: [3]string{stamp(second), stamp(second), stamp(second)},
			wantRequeue: time.Second, // the 750ms left, raised to the floor
		},
		{
			name: "a nanosecond before the retry: nothing",
			at:   retry.Add(-time.Nanosecond), wantStamps: [3]string{stamp(second), stamp(second), stamp(second)},
			wantRequeue: time.Second,
		},
		{
			name: "at the retry: web-2 and web-3 tried and blocked again; web-1's migration is in flight",
			at:   retry, wantStamps: [3]string{stamp(second), stamp(retry), stamp(retry)},
			wantRequeue: interval + attemptStampPrecision,
			wantEvents:  []string{blocked("2 healthy, 2 desired, 0 allowed"), blocked("2 healthy, 2 desired, 0 allowed")},
		},
	}
	ctx := context.Background()
	for _, step := range steps {
		clock.Step(step.at.Sub(clock.Now()))
		res, err := r.Reconcile(ctx, cordonPassKey)
		if err != nil {
			t.Fatalf("%s: %v", step.name, err)
		}
		if res.RequeueAfter != step.wantRequeue {
			t.Errorf("%s: requeue after %s, want %s", step.name, res.RequeueAfter, step.wantRequeue)
		}
		var stamps [3]string
		for i, name := range []string{"web-1", "web-2", "web-3"} {
			var m kaironv1.Machine
			if err := api.Get(ctx, client.ObjectKey{Namespace: "team", Name: name}, &m); err != nil {
				t.Fatal(err)
			}
			stamps[i] = m.Annotations[kaironv1.AnnotationCordonEvacuateAttemptedAt]
		}
		if stamps != step.wantStamps {
			t.Errorf("%s: stamps %q, want %q", step.name, stamps, step.wantStamps)
		}
		var migs kaironv1.MachineMigrationList
		if err := api.List(ctx, &migs); err != nil {
			t.Fatal(err)
		}
		if len(migs.Items) != 1 || migs.Items[0].Spec.MachineName != "web-1" || migs.Items[0].Spec.Strategy != kaironv1.MigrationCold {
			t.Fatalf("%s: migrations %s, want one, of web-1", step.name, describeMigrations(migs.Items))
		}
		want := slices.Clone(step.wantEvents)
		for i, e := range want {
			if e == "created" {
				want[i] = corev1.EventTypeNormal + " " + kaironv1.EventReasonEvacuationMigrationCreated + " Node node-a is cordoned: created MachineMigration " +
					migs.Items[0].Name + " (cold) to move the machine off it"
			}
		}
		if got := recordedEvents(recorder); !slices.Equal(got, want) {
			t.Errorf("%s: events\n%q\nwant\n%q", step.name, got, want)
		}
	}
}
