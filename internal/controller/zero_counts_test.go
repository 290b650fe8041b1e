package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// zeroKind is one Kairon kind whose counts are all 0 in this test: the
// status keys `-o json` must have, and the `kubectl get` columns that show
// them.
type zeroKind struct {
	resource, name string
	// keys are paths under .status whose value must be 0 (a number, or
	// the quantity "0").
	keys [][]string
	// columns are `kubectl get` headers that must print 0.
	columns []string
}

// Every status count of every Kairon kind is written, 0 included, so a new
// user's first objects, which count nothing, show 0 rather than a blank:
// `kubectl get` prints 0 and `-o json` has the key. As the user guide's
// example: a budget with maxUnavailable "0%" over no Machines, which is
// exhausted.
func TestZeroCountsAreWritten(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	startControllers(t, env, ns, Options{})

	create := func(obj client.Object) {
		t.Helper()
		if err := env.Client.Create(ctx, obj); err != nil {
			t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
		}
	}
	om := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Namespace: ns, Name: name} }
	create(&kaironv1.MachineDisruptionBudget{ObjectMeta: om("exhausted"), Spec: kaironv1.MachineDisruptionBudgetSpec{
		Selector: map[string]string{"app": "none-" + ns}, MaxUnavailable: ptr.To(intstr.FromString("0%")),
	}})
	create(&kaironv1.MachinePool{ObjectMeta: om("idle"), Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](0)}})
	create(&kaironv1.MachineSet{ObjectMeta: om("idle"), Spec: kaironv1.MachineSetSpec{
		Replicas: ptr.To[int32](0),
		Selector: kaironv1.MachineSelector{MatchLabels: map[string]string{"set": "idle"}},
		Template: kaironv1.MachineTemplateSpec{Metadata: kaironv1.MachineTemplateMeta{Labels: map[string]string{"set": "idle"}}},
	}})
	create(&kaironv1.MachineQuota{ObjectMeta: om("team"), Spec: kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To[int32](5)}}})
	// No node reports on a policy that selects nothing: only the controller
	// writes its status.
	create(&kaironv1.MachineNetworkPolicy{ObjectMeta: om("nothing"), Spec: kaironv1.MachineNetworkPolicySpec{
		MachineSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "none-" + ns}},
	}})

	kinds := []zeroKind{{
		resource: "machinedisruptionbudget", name: "exhausted",
		keys:    [][]string{{"expectedMachines"}, {"currentHealthy"}, {"desiredHealthy"}, {"disruptionsAllowed"}},
		columns: []string{"EXPECTED", "HEALTHY", "DESIRED", "ALLOWED"},
	}, {
		resource: "machinepool", name: "idle",
		keys:    [][]string{{"replicas"}, {"warm"}, {"readyWarm"}, {"claimed"}},
		columns: []string{"DESIRED", "WARM", "READY", "CLAIMED"},
	}, {
		resource: "machineset", name: "idle",
		keys:    [][]string{{"replicas"}, {"readyReplicas"}},
		columns: []string{"DESIRED", "CURRENT", "READY"},
	}, {
		resource: "machinequota", name: "team",
		keys:    [][]string{{"used", "machines"}, {"used", "cpu"}, {"used", "memory"}},
		columns: []string{"MACHINES", "CPU", "MEMORY"},
	}, {
		resource: "machinenetworkpolicy", name: "nothing",
		keys:    [][]string{{"machines"}},
		columns: []string{"MACHINES"},
	}}
	for _, k := range kinds {
		eventually(t, fmt.Sprintf("%s %s to show 0 for every count", k.resource, k.name), func() (bool, string) {
			return zeroesShown(t, env, ns, k)
		})
	}
	// The example from the issue, verbatim in the raw JSON.
	if out := env.Kubectl(t, "-n", ns, "get", "mdb", "exhausted", "-o", "json"); !strings.Contains(out, `"disruptionsAllowed": 0`) {
		t.Errorf(`kubectl get mdb -o json has no "disruptionsAllowed": 0:\n%s`, out)
	}
}

// zeroesShown reports whether kubectl shows 0 for every key and column of
// k, and what it showed.
func zeroesShown(t *testing.T, env *testenv.Env, ns string, k zeroKind) (bool, string) {
	t.Helper()
	var obj map[string]any
	raw := env.Kubectl(t, "-n", ns, "get", k.resource, k.name, "-o", "json")
	if err := json.Unmarshal([]byte(raw), &obj); err != nil {
		t.Fatalf("kubectl get %s -o json: %v\n%s", k.resource, err, raw)
	}
	var missing []string
	for _, path := range k.keys {
		v, found := obj["status"], true
		for _, key := range path {
			m, ok := v.(map[string]any)
			if !ok {
				found = false
				break
			}
			v, found = m[key]
			if !found {
				break
			}
		}
		if !found || (v != float64(0) && v != "0") {
			missing = append(missing, fmt.Sprintf("status.%s=%v", strings.Join(path, "."), v))
		}
	}
	table := env.Kubectl(t, "-n", ns, "get", k.resource, k.name)
	cells, err := tableRow(table)
	if err != nil {
		t.Fatalf("kubectl get %s: %v\n%s", k.resource, err, table)
	}
	for _, col := range k.columns {
		if cells[col] != "0" {
			missing = append(missing, fmt.Sprintf("column %s=%q", col, cells[col]))
		}
	}
	return len(missing) == 0, fmt.Sprintf("not 0: %v\n%s", missing, table)
}

// tableRow reads kubectl's table of one object into header -> cell. The
// cells start where their headers do, so a blank cell reads as "".
func tableRow(table string) (map[string]string, error) {
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	if len(lines) != 2 {
		return nil, fmt.Errorf("want a header and one row, got %d lines", len(lines))
	}
	header, row := lines[0], lines[1]
	type col struct {
		name  string
		start int
	}
	var cols []col
	for i := 0; i < len(header); {
		for i < len(header) && header[i] == ' ' {
			i++
		}
		start := i
		for i < len(header) && header[i] != ' ' {
			i++
		}
		if start < i {
			cols = append(cols, col{header[start:i], start})
		}
	}
	cells := map[string]string{}
	for j, c := range cols {
		end := len(row)
		if j+1 < len(cols) {
			end = min(cols[j+1].start, len(row))
		}
		if c.start < end {
			cells[c.name] = strings.TrimSpace(row[c.start:end])
		} else {
			cells[c.name] = ""
		}
	}
	return cells, nil
}

// An object whose status the API server has but that lacks a count (as an
// older kairon-controller left them, dropping zeros) reads back with the
// count 0: the CRDs default every status count, so `kubectl get` never
// shows a blank for one, even before the controller writes again.
func TestStatusCountsDefaultToZero(t *testing.T) {
	env := testenv.Get(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	b := &kaironv1.MachineDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "old"}, Spec: kaironv1.MachineDisruptionBudgetSpec{
		Selector: map[string]string{"app": ns}, MinAvailable: ptr.To(intstr.FromInt32(1)),
	}}
	if err := env.Client.Create(ctx, b); err != nil {
		t.Fatal(err)
	}
	// No controller runs in this test: only this status write happens.
	if err := env.Client.Status().Patch(ctx, b, client.RawPatch(types.MergePatchType, []byte(`{"status":{"observedGeneration":1}}`))); err != nil {
		t.Fatal(err)
	}
	ok, saw := zeroesShown(t, env, ns, zeroKind{
		resource: "mdb", name: "old",
		keys:    [][]string{{"expectedMachines"}, {"currentHealthy"}, {"desiredHealthy"}, {"disruptionsAllowed"}},
		columns: []string{"EXPECTED", "HEALTHY", "DESIRED", "ALLOWED"},
	})
	if !ok {
		t.Error(saw)
	}
}

func TestTableRow(t *testing.T) {
	table := fmt.Sprintf("%-12s%-15s%-17s%-11s%-10s%-10s%s\n", "NAME", "MINAVAILABLE", "MAXUNAVAILABLE", "EXPECTED", "HEALTHY", "DESIRED", "ALLOWED") +
		fmt.Sprintf("%-12s%-15s%-17s%-11s%-10s%-10s\n", "exhausted", "", "0%", "0", "", "0")
	cells, err := tableRow(table)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"NAME": "exhausted", "MINAVAILABLE": "", "MAXUNAVAILABLE": "0%", "EXPECTED": "0", "HEALTHY": "", "DESIRED": "0", "ALLOWED": ""}
	if fmt.Sprint(cells) != fmt.Sprint(want) {
		t.Errorf("tableRow = %v, want %v", cells, want)
	}
}
