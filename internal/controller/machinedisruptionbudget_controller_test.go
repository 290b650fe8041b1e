package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

// budgetNumbers is what a budget's status and its gauge series should say.
type budgetNumbers struct {
	expected, healthy, desired, allowed int32
	generation                          int64
}

func (n budgetNumbers) String() string {
	return fmt.Sprintf("expected=%d healthy=%d desired=%d allowed=%d generation=%d", n.expected, n.healthy, n.desired, n.allowed, n.generation)
}

func createBudget(t *testing.T, env *testenv.Env, ns, name string, selector map[string]string, spec func(*kaironv1.MachineDisruptionBudgetSpec)) *kaironv1.MachineDisruptionBudget {
	t.Helper()
	b := &kaironv1.MachineDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: kaironv1.MachineDisruptionBudgetSpec{Selector: selector}}
	spec(&b.Spec)
	if err := env.Client.Create(context.Background(), b); err != nil {
		t.Fatalf("creating budget %s: %v", name, err)
	}
	return b
}

func mdbLabels(labels map[string]string) func(*kaironv1.Machine) {
	return func(m *kaironv1.Machine) { m.Labels = labels }
}

// gaugeSeries is every kairon_disruption_budget_status series of one
// budget, by field, read from controller-runtime's registry.
func gaugeSeries(t *testing.T, ns, name string) map[string]float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gathering metrics: %v", err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "kairon_disruption_budget_status" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == ns && labels["budget"] == name {
				out[labels["field"]] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// checkBudget reports whether the budget's status and gauge both say want,
// and what they said.
func checkBudget(t *testing.T, env *testenv.Env, ns, name string, want budgetNumbers) (bool, string) {
	t.Helper()
	var b kaironv1.MachineDisruptionBudget
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &b); err != nil {
		return false, err.Error()
	}
	st := b.Status
	got := budgetNumbers{st.ExpectedMachines, st.CurrentHealthy, st.DesiredHealthy, st.DisruptionsAllowed, st.ObservedGeneration}
	ready := meta.FindStatusCondition(st.Conditions, kaironv1.ConditionReady.String())
	wantMessage := fmt.Sprintf("%d matching, %d healthy, %d desired healthy, %d disruptions allowed", want.expected, want.healthy, want.desired, want.allowed)
	series := gaugeSeries(t, ns, name)
	wantSeries := map[string]float64{
		"expected_machines": float64(want.expected), "current_healthy": float64(want.healthy),
		"desired_healthy": float64(want.desired), "disruptions_allowed": float64(want.allowed),
	}
	ok := got == want && ready != nil && ready.Status == metav1.ConditionTrue && ready.Reason == kaironv1.BudgetReasonStatusComputed &&
		ready.Message == wantMessage && ready.ObservedGeneration == want.generation &&
		fmt.Sprint(series) == fmt.Sprint(wantSeries)
	return ok, fmt.Sprintf("status %s, Ready %s, gauge %v", got, fmtJSON(ready), series)
}

func waitBudget(t *testing.T, env *testenv.Env, ns, name string, want budgetNumbers) {
	t.Helper()
	eventually(t, fmt.Sprintf("budget %s/%s to report %s", ns, name, want), func() (bool, string) {
		return checkBudget(t, env, ns, name, want)
	})
}

// The reconciler follows Machines and MachineMigrations of several
// namespaces as they change, through watch events alone (the tick is ten
// minutes), and keeps the gauge equal to the status.
func TestBudgetStatusReconciler(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns, other := env.Namespace(t), env.Namespace(t)
	// Migration phases are set by hand here.
	startControllers(t, env, ns, Options{NoMigrationController: true}, func(o *ctrl.Options) {
		o.Cache = cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}, other: {}}}
	})
	// Label values unique to the test: the API server is shared.
	sel := map[string]string{"app": ns}
	for _, name := range []string{"web-1", "web-2", "web-3"} {
		m := createMachine(t, env, ns, name, 1, "256Mi", mdbLabels(sel))
		setMachinePhase(t, env, m, kaironv1.MachineRunning)
	}
	web4 := createMachine(t, env, other, "web-4", 1, "256Mi", mdbLabels(sel))
	setMachinePhase(t, env, web4, kaironv1.MachineBooting)
	createMachine(t, env, ns, "db-1", 1, "256Mi", mdbLabels(map[string]string{"app": ns, "tier": "db"}))

	b := createBudget(t, env, ns, "web-tier", map[string]string{"app": ns}, func(s *kaironv1.MachineDisruptionBudgetSpec) {
		s.MinAvailable = ptr.To(intstr.FromString("2"))
	})
	// db-1 matches too (a superset of the selector's labels), not Running.
	waitBudget(t, env, ns, "web-tier", budgetNumbers{5, 3, 2, 1, 1})
	if problems, err := testutil.GatherAndLint(metrics.Registry, "kairon_disruption_budget_status"); err != nil || len(problems) > 0 {
		t.Errorf("metric lint: %v %v", err, problems)
	}
	if v := testutil.ToFloat64(DisruptionBudgetStatus.WithLabelValues(ns, "web-tier", BudgetFieldDisruptionsAllowed)); v != 1 {
		t.Errorf("disruptions_allowed gauge %v, want 1", v)
	}

	// A migration in flight, even before anyone gave it a phase, takes its
	// Machine out of the healthy count.
	mig := &kaironv1.MachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move-web-3"}, Spec: kaironv1.MachineMigrationSpec{MachineName: "web-3"}}
	if err := env.Client.Create(ctx, mig); err != nil {
		t.Fatal(err)
	}
	waitBudget(t, env, ns, "web-tier", budgetNumbers{5, 2, 2, 0, 1})
	mig.Status.Phase = kaironv1.MigrationRunning
	if err := env.Client.Status().Update(ctx, mig); err != nil {
		t.Fatal(err)
	}
	mig.Status.Phase = kaironv1.MigrationSucceeded
	if err := env.Client.Status().Update(ctx, mig); err != nil {
		t.Fatal(err)
	}
	waitBudget(t, env, ns, "web-tier", budgetNumbers{5, 3, 2, 1, 1})

	// A Machine of another namespace becomes Running.
	setMachinePhase(t, env, web4, kaironv1.MachineRunning)
	waitBudget(t, env, ns, "web-tier", budgetNumbers{5, 4, 2, 2, 1})

	// Switching the bound is a spec change: a new generation.
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
		t.Fatal(err)
	}
	b.Spec.MinAvailable, b.Spec.MaxUnavailable = nil, ptr.To(intstr.FromString("25%"))
	if err := env.Client.Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	// 25% of 5 rounds up to 2 unavailable: 3 desired.
	waitBudget(t, env, ns, "web-tier", budgetNumbers{5, 4, 3, 1, 2})

	// Relabeling and deleting Machines changes what matches.
	db := getMachine(t, env, ns, "db-1")
	patch := client.MergeFrom(db.DeepCopy())
	db.Labels = map[string]string{"tier": "db"}
	if err := env.Client.Patch(ctx, db, patch); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, web4); err != nil {
		t.Fatal(err)
	}
	// 3 Running; 25% of 3 rounds up to 1: 2 desired.
	waitBudget(t, env, ns, "web-tier", budgetNumbers{3, 3, 2, 1, 2})

	// A budget in the other namespace counts the same Machines.
	createBudget(t, env, other, "all-web", sel, func(s *kaironv1.MachineDisruptionBudgetSpec) {
		s.MaxUnavailable = ptr.To(intstr.FromInt32(0))
	})
	waitBudget(t, env, other, "all-web", budgetNumbers{3, 3, 3, 0, 1})

	// Deleting a budget deletes its gauge series, and only its own.
	if err := env.Client.Delete(ctx, b); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deleted budget's gauge series to go", func() (bool, string) {
		gone := gaugeSeries(t, ns, "web-tier")
		kept := gaugeSeries(t, other, "all-web")
		return len(gone) == 0 && len(kept) == 4, fmt.Sprintf("web-tier %v, all-web %v", gone, kept)
	})
}

// Without any event, the tick brings a status someone overwrote back.
func TestBudgetStatusTick(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	startControllers(t, env, ns, Options{Interval: time.Second})
	sel := map[string]string{"app": ns}
	m := createMachine(t, env, ns, "web-1", 1, "256Mi", mdbLabels(sel))
	setMachinePhase(t, env, m, kaironv1.MachineRunning)
	b := createBudget(t, env, ns, "web-tier", sel, func(s *kaironv1.MachineDisruptionBudgetSpec) {
		s.MaxUnavailable = ptr.To(intstr.FromString("100%"))
	})
	waitBudget(t, env, ns, "web-tier", budgetNumbers{1, 1, 0, 1, 1})

	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
		t.Fatal(err)
	}
	b.Status.DisruptionsAllowed, b.Status.ExpectedMachines = 42, 42
	if err := env.Client.Status().Update(ctx, b); err != nil {
		t.Fatal(err)
	}
	waitBudget(t, env, ns, "web-tier", budgetNumbers{1, 1, 0, 1, 1})
}

// A failed status patch is logged and left for the next tick, and the
// gauge keeps saying what the object says: it is set from what was written,
// so it is never ahead of the object. A budget whose status was never
// written has no series.
func TestBudgetStatusPatchFailureWaitsForTick(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	sel := map[string]string{"app": ns}
	m := createMachine(t, env, ns, "web-1", 1, "256Mi", mdbLabels(sel))
	setMachinePhase(t, env, m, kaironv1.MachineRunning)
	createBudget(t, env, ns, "web-tier", sel, func(s *kaironv1.MachineDisruptionBudgetSpec) {
		s.MinAvailable = ptr.To(intstr.FromInt32(0))
	})

	// Only this namespace, straight from the API server. The working
	// client keeps the status patches it sends; the failing one fails
	// every status patch of this namespace's budgets.
	var sentMu sync.Mutex
	var sent []string
	inNamespace := interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			return c.List(ctx, list, append(opts, client.InNamespace(ns))...)
		},
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if body, err := patch.Data(obj); err == nil {
				sentMu.Lock()
				sent = append(sent, obj.GetName()+" "+string(body))
				sentMu.Unlock()
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	}
	failingPatches := interceptor.Funcs{
		List: inNamespace.List,
		SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if obj.GetNamespace() == ns {
				return errors.New("injected patch failure")
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		},
	}
	working := interceptor.NewClient(directClient(t, env), inNamespace)
	failing := interceptor.NewClient(directClient(t, env), failingPatches)

	// A first pass that succeeds: 1 Running, none required, 1 allowed.
	r := &MachineDisruptionBudgetReconciler{Client: working, Interval: 7 * time.Second}
	if _, err := r.Reconcile(ctx, budgetPassKey); err != nil {
		t.Fatal(err)
	}
	if ok, saw := checkBudget(t, env, ns, "web-tier", budgetNumbers{1, 1, 0, 1, 1}); !ok {
		t.Fatalf("after the first pass: %s", saw)
	}

	// The world changes while status patches fail: web-1 stops being
	// Running (0 allowed now), and a new budget appears.
	setMachinePhase(t, env, m, kaironv1.MachineBooting)
	createBudget(t, env, ns, "fresh", sel, func(s *kaironv1.MachineDisruptionBudgetSpec) {
		s.MaxUnavailable = ptr.To(intstr.FromString("0%"))
	})
	r.Client = failing
	var logs mdbLogLines
	logCtx := log.IntoContext(ctx, funcr.New(logs.add, funcr.Options{}))
	res, err := r.Reconcile(logCtx, budgetPassKey)
	if err != nil || res.RequeueAfter != 7*time.Second {
		t.Fatalf("Reconcile = %+v, %v; want a requeue after the interval and no error", res, err)
	}
	// The budget is named as klog.KObj renders through logr's funcr.
	budget := `"budget"={"name"="web-tier" "namespace"="` + ns + `"}`
	if got := logs.String(); !strings.Contains(got, "trying again next tick") || !strings.Contains(got, budget) || !strings.Contains(got, "injected patch failure") {
		t.Errorf("log does not report the failed patch:\n%s", got)
	}
	// The object still has the first pass's numbers, and so does the gauge;
	// the budget never written has neither numbers nor series.
	if ok, saw := checkBudget(t, env, ns, "web-tier", budgetNumbers{1, 1, 0, 1, 1}); !ok {
		t.Errorf("after the failed pass, object and gauge should still say the first pass's numbers: %s", saw)
	}
	fresh := getObject[kaironv1.MachineDisruptionBudget](t, env, ns, "fresh")
	if len(fresh.Status.Conditions) != 0 {
		t.Errorf("status patched despite the failure: %s", fmtJSON(fresh.Status))
	}
	if got := gaugeSeries(t, ns, "fresh"); len(got) != 0 {
		t.Errorf("gauge series %v for a budget whose status was never written", got)
	}

	// The next tick, with the API server answering again, catches up; the
	// patch carries every count, the ones that stayed 0 too.
	r.Client = working
	if _, err := r.Reconcile(ctx, budgetPassKey); err != nil {
		t.Fatal(err)
	}
	if ok, saw := checkBudget(t, env, ns, "web-tier", budgetNumbers{1, 0, 0, 0, 1}); !ok {
		t.Errorf("after the next tick: %s", saw)
	}
	if ok, saw := checkBudget(t, env, ns, "fresh", budgetNumbers{1, 0, 1, 0, 1}); !ok {
		t.Errorf("after the next tick: %s", saw)
	}
	sentMu.Lock()
	defer sentMu.Unlock()
	var webTier string
	for _, s := range sent {
		if strings.HasPrefix(s, "web-tier ") {
			webTier = s
		}
	}
	for _, key := range []string{`"expectedMachines":1`, `"currentHealthy":0`, `"desiredHealthy":0`, `"disruptionsAllowed":0`} {
		if !strings.Contains(webTier, key) {
			t.Errorf("the last status patch of web-tier lacks %s: %s", key, webTier)
		}
	}
}

// An invalid budget (which the API server refuses to store, so this is a
// unit test) is Ready=False with the reason, and allows nothing.
func TestInvalidBudgetStatus(t *testing.T) {
	one := intstr.FromInt32(1)
	b := kaironv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "broken", Generation: 3},
		Spec:       kaironv1.MachineDisruptionBudgetSpec{Selector: map[string]string{"tier": "web"}, MinAvailable: &one, MaxUnavailable: &one},
	}
	web := func(name string) kaironv1.Machine {
		return kaironv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{"tier": "web"}},
			Status:     kaironv1.MachineStatus{Phase: kaironv1.MachineRunning},
		}
	}
	states := rules.ComputeBudgetStates([]kaironv1.MachineDisruptionBudget{b}, []kaironv1.Machine{web("web-a"), web("web-b")}, nil)
	var status kaironv1.MachineDisruptionBudgetStatus
	setBudgetStatus(&status, &states[0])
	if status.ExpectedMachines != 2 || status.CurrentHealthy != 2 || status.DesiredHealthy != 2 || status.DisruptionsAllowed != 0 || status.ObservedGeneration != 3 {
		t.Errorf("status %s", fmtJSON(status))
	}
	c := meta.FindStatusCondition(status.Conditions, kaironv1.ConditionReady.String())
	want := "both spec.minAvailable and spec.maxUnavailable are set; set exactly one; until fixed, the budget blocks every disruption of the Machines it matches"
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != kaironv1.BudgetReasonInvalid || c.Message != want || c.ObservedGeneration != 3 {
		t.Errorf("Ready condition %s", fmtJSON(c))
	}
}

type mdbLogLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *mdbLogLines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, prefix+" "+args)
}

func (l *mdbLogLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

var _ reconcile.Reconciler = &MachineDisruptionBudgetReconciler{}
