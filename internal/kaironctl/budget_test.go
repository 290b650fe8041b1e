package kaironctl_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
)

func getBudget(t *testing.T, env *testenv.Env, ns, name string) *kaironv1.MachineDisruptionBudget {
	t.Helper()
	var b kaironv1.MachineDisruptionBudget
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &b); err != nil {
		t.Fatalf("getting budget %s: %v", name, err)
	}
	return &b
}

func budgetNames(t *testing.T, env *testenv.Env, ns string) []string {
	t.Helper()
	var list kaironv1.MachineDisruptionBudgetList
	if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, b := range list.Items {
		names = append(names, b.Name)
	}
	return names
}

func specJSON(b *kaironv1.MachineDisruptionBudget) string {
	raw, _ := json.Marshal(b.Spec)
	return string(raw)
}

func TestCreateBudget(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)

	r := kctl(t, env, "create", "budget", "web-tier", "--selector", "tier=web", "--min-available", "2", "-n", ns).ok(t)
	if r.stdout != "budget/web-tier created\n" {
		t.Errorf("printed %q", r.stdout)
	}
	if got, want := specJSON(getBudget(t, env, ns, "web-tier")), `{"selector":{"tier":"web"},"minAvailable":2}`; got != want {
		t.Errorf("spec %s, want %s", got, want)
	}

	// Several labels, a percentage, and an alias of the kind.
	r = kctl(t, env, "create", "mdb", "db", "--selector", "app=db", "--selector", "kairon.zyvor.dev/zone=a", "--max-unavailable", "25%", "-n", ns).ok(t)
	if r.stdout != "budget/db created\n" {
		t.Errorf("printed %q", r.stdout)
	}
	if got, want := specJSON(getBudget(t, env, ns, "db")), `{"selector":{"app":"db","kairon.zyvor.dev/zone":"a"},"maxUnavailable":"25%"}`; got != want {
		t.Errorf("spec %s, want %s", got, want)
	}

	// Every mistake is one clear error line, and creates nothing.
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"create", "budget", "b1", "--selector", "tier=web"},
			[]string{"one of --min-available or --max-unavailable is required", "exactly one"}},
		{[]string{"create", "budget", "b1", "--selector", "tier=web", "--min-available", "1", "--max-unavailable", "1"},
			[]string{"--min-available and --max-unavailable cannot be used together", "exactly one"}},
		{[]string{"create", "budget", "b1", "--min-available", "1"},
			[]string{"--selector KEY=VALUE is required", "matches every Machine of the cluster, in every namespace", "--all-machines"}},
		{[]string{"create", "budget", "b1", "--all-machines", "--selector", "tier=web", "--min-available", "1"},
			[]string{"--all-machines and --selector cannot be used together"}},
		{[]string{"create", "budget", "b1", "--selector", "tier=web", "--min-available", "two"},
			[]string{`invalid --min-available: "two" is not a non-negative integer (e.g. 2) or a percentage from 0% to 100% (e.g. 25%)`}},
		{[]string{"create", "budget", "b1", "--selector", "tier=web", "--max-unavailable", "150%"},
			[]string{`invalid --max-unavailable: "150%"`}},
		{[]string{"create", "budget", "b1", "--selector", "tier=web", "--max-unavailable=-1"},
			[]string{`invalid --max-unavailable: "-1"`}},
		{[]string{"create", "budget", "b1", "--selector", "tier=web", "--min-available", "1.5"},
			[]string{`invalid --min-available: "1.5"`}},
		{[]string{"create", "budget", "b1", "--selector", "tier", "--min-available", "1"},
			[]string{`invalid --selector "tier": want KEY=VALUE`}},
		{[]string{"create", "budget", "b1", "--selector", "tier=we b", "--min-available", "1"},
			[]string{`invalid --selector "tier=we b"`, "label value"}},
		{[]string{"create", "budget", "b1", "--selector", "tier=web", "--selector", "tier=db", "--min-available", "1"},
			[]string{`label "tier" twice`}},
		{[]string{"create", "budget", "Bad_Name", "--selector", "tier=web", "--min-available", "1"},
			[]string{`invalid budget name "Bad_Name"`}},
		{[]string{"create", "budget", "--selector", "tier=web", "--min-available", "1"}, []string{"create budget needs a NAME"}},
		{[]string{"create", "budget", "b1", "b2", "--selector", "tier=web", "--min-available", "1"}, []string{"one NAME, got 2"}},
		{[]string{"create", "budget", "web-tier", "--selector", "tier=web", "--min-available", "1"},
			[]string{`budget "web-tier" already exists in namespace "` + ns + `"`, "kaironctl edit budget web-tier"}},
		{[]string{"create", "machine", "m1"}, []string{"cannot create machines", "create works on: budget"}},
		{[]string{"create", "widgets", "w"}, []string{`unknown kind "widgets"`, "create works on: budget"}},
		{[]string{"create"}, []string{"create needs a KIND and a NAME", "budget"}},
	} {
		r := kctl(t, env, append(tc.args, "-n", ns)...)
		r.failed(t, tc.want...)
		if r.stdout != "" {
			t.Errorf("%v printed %q", tc.args, r.stdout)
		}
	}
	if got := budgetNames(t, env, ns); !reflect.DeepEqual(got, []string{"db", "web-tier"}) {
		t.Errorf("budgets after the mistakes: %v, want only db and web-tier", got)
	}
	// The one that existed is untouched.
	if got := specJSON(getBudget(t, env, ns, "web-tier")); got != `{"selector":{"tier":"web"},"minAvailable":2}` {
		t.Errorf("web-tier changed: %s", got)
	}
}

// A budget without a selector matches every Machine of the cluster; the
// CLI creates one only when asked with --all-machines, and the budget then
// counts Machines of other namespaces too.
func TestCreateBudgetAllMachines(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	other := env.Namespace(t)
	for i, n := range []string{ns, other} {
		m := &kaironv1.Machine{}
		m.Namespace, m.Name = n, fmt.Sprintf("m%d", i)
		if err := env.Client.Create(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}

	// It matches every Machine of the shared test cluster, other tests'
	// too: 100% holds none of them back, and it goes when this test ends.
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), &kaironv1.MachineDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "everything"}})
	})
	r := kctl(t, env, "create", "budget", "everything", "--all-machines", "--max-unavailable", "100%", "-n", ns).ok(t)
	if r.stdout != "budget/everything created\n" {
		t.Errorf("printed %q", r.stdout)
	}
	b := getBudget(t, env, ns, "everything")
	if got, want := specJSON(b), `{"maxUnavailable":"100%"}`; got != want {
		t.Errorf("spec %s, want %s", got, want)
	}
	// What the empty selector means, as the rules every evacuation uses see it.
	var machines kaironv1.MachineList
	if err := env.Client.List(context.Background(), &machines); err != nil {
		t.Fatal(err)
	}
	matched := map[string]bool{}
	for _, bm := range rules.ComputeBudgetStates([]kaironv1.MachineDisruptionBudget{*b}, machines.Items, nil)[0].Machines {
		matched[bm.Namespace] = true
	}
	if !matched[ns] || !matched[other] {
		t.Errorf("the budget without a selector matched Machines of namespaces %v, want %s and %s", matched, ns, other)
	}
}

func TestEditBudget(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	env.Create(t, &kaironv1.MachineDisruptionBudget{ObjectMeta: meta(ns, "web-tier"), Spec: kaironv1.MachineDisruptionBudgetSpec{
		Selector: map[string]string{"tier": "web", "zone": "a"}, MinAvailable: ptr.To(intstr.FromString("2")),
	}})
	env.Create(t, &kaironv1.MachineDisruptionBudget{ObjectMeta: meta(ns, "db"), Spec: kaironv1.MachineDisruptionBudgetSpec{
		Selector: map[string]string{"app": "db"}, MaxUnavailable: ptr.To(intstr.FromString("50%")),
	}})

	steps := []struct {
		args []string
		name string
		want string // the spec after the step
	}{
		// Only the bound changes; the selector stays.
		{[]string{"edit", "budget", "web-tier", "--min-available", "3"}, "web-tier",
			`{"selector":{"tier":"web","zone":"a"},"minAvailable":3}`},
		// --selector replaces the whole map: zone=a is gone.
		{[]string{"edit", "budget", "web-tier", "--selector", "tier=web", "--selector", "rack=r7"}, "web-tier",
			`{"selector":{"rack":"r7","tier":"web"},"minAvailable":3}`},
		{[]string{"edit", "budget", "web-tier", "--selector", "tier=frontend", "--min-available", "50%"}, "web-tier",
			`{"selector":{"tier":"frontend"},"minAvailable":"50%"}`},
		{[]string{"edit", "mdb", "db", "--max-unavailable", "1"}, "db",
			`{"selector":{"app":"db"},"maxUnavailable":1}`},
	}
	for _, step := range steps {
		r := kctl(t, env, append(step.args, "-n", ns)...).ok(t, step.args...)
		if want := "budget/" + step.name + " updated\n"; r.stdout != want {
			t.Errorf("%v printed %q, want %q", step.args, r.stdout, want)
		}
		if got := specJSON(getBudget(t, env, ns, step.name)); got != step.want {
			t.Errorf("%v: spec %s, want %s", step.args, got, step.want)
		}
	}

	// Refusals change nothing, not even the resourceVersion.
	before := getBudget(t, env, ns, "web-tier")
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"edit", "budget", "web-tier"}, []string{"nothing to change", "--selector", "--min-available", "--max-unavailable"}},
		{[]string{"edit", "budget", "web-tier", "--min-available", "1", "--max-unavailable", "1"},
			[]string{"--min-available and --max-unavailable cannot be used together"}},
		{[]string{"edit", "budget", "web-tier", "--min-available", "lots"}, []string{`invalid --min-available: "lots"`}},
		{[]string{"edit", "budget", "web-tier", "--selector", "nokey"}, []string{`invalid --selector "nokey"`}},
		{[]string{"edit", "budget", "web-tier", "--max-unavailable", "1"},
			[]string{`budget "web-tier" in namespace "` + ns + `" sets spec.minAvailable`, "--max-unavailable", "kubectl edit mdb web-tier -n " + ns}},
		{[]string{"edit", "budget", "missing", "--min-available", "1"}, []string{`budget "missing" not found in namespace "` + ns + `"`}},
		{[]string{"edit", "budget"}, []string{"edit budget needs a NAME"}},
		{[]string{"edit", "machine", "x"}, []string{"cannot edit machines", "edit works on: budget"}},
	} {
		r := kctl(t, env, append(tc.args, "-n", ns)...)
		r.failed(t, tc.want...)
		if r.stdout != "" {
			t.Errorf("%v printed %q", tc.args, r.stdout)
		}
	}
	after := getBudget(t, env, ns, "web-tier")
	if after.ResourceVersion != before.ResourceVersion || specJSON(after) != specJSON(before) {
		t.Errorf("a refused edit changed the budget: %s (rv %s -> %s)", specJSON(after), before.ResourceVersion, after.ResourceVersion)
	}
}

func TestDescribeBudget(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns, other := env.Namespace(t), env.Namespace(t)
	// A label value unique to the test: selectors match across the cluster.
	sel := map[string]string{"app": ns}
	for _, name := range []string{"web-1", "web-2", "web-3"} {
		m := machine(t, env, ns, name, "node-1", 1, "256Mi", "")
		m.Labels = sel
		if err := env.Client.Update(ctx, m); err != nil {
			t.Fatal(err)
		}
		m.Status.Phase = kaironv1.MachineRunning
		env.SetStatus(t, m)
	}
	mig := &kaironv1.MachineMigration{ObjectMeta: meta(ns, "move-web-3"), Spec: kaironv1.MachineMigrationSpec{MachineName: "web-3"}}
	env.Create(t, mig)
	mig.Status.Phase = kaironv1.MigrationRunning
	env.SetStatus(t, mig)
	// Terminal migrations do not count.
	done := &kaironv1.MachineMigration{ObjectMeta: meta(ns, "moved-web-1"), Spec: kaironv1.MachineMigrationSpec{MachineName: "web-1"}}
	env.Create(t, done)
	done.Status.Phase = kaironv1.MigrationSucceeded
	env.SetStatus(t, done)

	b := &kaironv1.MachineDisruptionBudget{ObjectMeta: meta(ns, "web-tier"), Spec: kaironv1.MachineDisruptionBudgetSpec{
		Selector: sel, MinAvailable: ptr.To(intstr.FromString("2")),
	}}
	env.Create(t, b)
	// A stale status, which describe must not believe.
	b.Status = kaironv1.MachineDisruptionBudgetStatus{ExpectedMachines: 9, CurrentHealthy: 9, DesiredHealthy: 2, DisruptionsAllowed: 7}
	env.SetStatus(t, b)

	describe := func() (kaironv1.MachineDisruptionBudget, string) {
		t.Helper()
		r := kctl(t, env, "describe", "budget", "web-tier", "-n", ns).ok(t)
		jsonPart, text, found := strings.Cut(r.stdout, "}\n\n")
		if !found {
			t.Fatalf("no blank line after the JSON:\n%s", r.stdout)
		}
		var got kaironv1.MachineDisruptionBudget
		if err := json.Unmarshal([]byte(jsonPart+"}"), &got); err != nil || got.Name != "web-tier" || got.Kind != "MachineDisruptionBudget" {
			t.Fatalf("JSON part: %v\n%s", err, jsonPart)
		}
		if !strings.HasPrefix(r.stdout, "{\n  \"apiVersion\": \"kairon.zyvor.dev/v1alpha1\",\n  \"kind\": \"MachineDisruptionBudget\",\n") {
			t.Errorf("does not start with the raw JSON:\n%s", r.stdout)
		}
		return got, text
	}

	got, text := describe()
	if got.Status.ExpectedMachines != 9 {
		t.Errorf("the JSON is not the object as stored: %s", fmtStatus(got.Status))
	}
	want := "" +
		"Status (recomputed fresh from Machines/MachineMigrations right now): 3 matching, 2 healthy, 2 desired healthy, 0 disruptions allowed\n" +
		"Matching machines (3):\n" +
		"  web-1                    healthy\n" +
		"  web-2                    healthy\n" +
		"  web-3                    NOT healthy (non-terminal MachineMigration in flight)\n"
	if text != want {
		t.Errorf("describe budget:\n%s\nwant\n%s", text, want)
	}

	// A Booting Machine of another namespace matches too, named ns/name.
	m := machine(t, env, other, "web-4", "node-2", 1, "256Mi", "")
	m.Labels = sel
	if err := env.Client.Update(ctx, m); err != nil {
		t.Fatal(err)
	}
	m.Status.Phase = kaironv1.MachineBooting
	env.SetStatus(t, m)
	shown := other + "/web-4"
	pad := func(s string) string { return fmt.Sprintf("  %-*s ", max(24, len(shown)), s) }
	_, text = describe()
	want = "" +
		"Status (recomputed fresh from Machines/MachineMigrations right now): 4 matching, 2 healthy, 2 desired healthy, 0 disruptions allowed\n" +
		"Matching machines (4):\n" +
		pad("web-1") + "healthy\n" +
		pad("web-2") + "healthy\n" +
		pad("web-3") + "NOT healthy (non-terminal MachineMigration in flight)\n" +
		pad(shown) + "NOT healthy (status.phase is Booting, not Running)\n"
	if text != want {
		t.Errorf("describe budget:\n%s\nwant\n%s", text, want)
	}

	// A selector that matches nothing gets a hint, not an empty list.
	env.Create(t, &kaironv1.MachineDisruptionBudget{ObjectMeta: meta(ns, "nothing"), Spec: kaironv1.MachineDisruptionBudgetSpec{
		Selector: map[string]string{"app": "none-" + ns}, MaxUnavailable: ptr.To(intstr.FromInt32(1)),
	}})
	r := kctl(t, env, "describe", "mdb", "nothing", "-n", ns).ok(t)
	_, text, _ = strings.Cut(r.stdout, "}\n\n")
	want = "" +
		"Status (recomputed fresh from Machines/MachineMigrations right now): 0 matching, 0 healthy, 0 desired healthy, 0 disruptions allowed\n" +
		"No Machines match budget nothing (selector app=none-" + ns + ", in any namespace); check with: kaironctl get machines -A -l app=none-" + ns + "\n"
	if text != want {
		t.Errorf("describe budget with no matches:\n%s\nwant\n%s", text, want)
	}

	kctl(t, env, "describe", "budget", "missing", "-n", ns).failed(t, `budget "missing" not found in namespace "`+ns+`"`)
}

func fmtStatus(s kaironv1.MachineDisruptionBudgetStatus) string {
	raw, _ := json.Marshal(s)
	return string(raw)
}
