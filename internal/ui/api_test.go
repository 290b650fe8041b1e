package ui_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/kaironctl"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/ui"
)

// TestAPI creates known objects after the UI started (so they reach it
// through its watches) and checks every endpoint's JSON, ?namespace=, and
// that the budget numbers and receipts are the shared budget code's and
// `kaironctl describe budget`'s.
func TestAPI(t *testing.T) {
	env := testenv.Get(t)
	url := startUI(t, env)
	ns, ns2 := env.Namespace(t), env.Namespace(t)
	node := "ui-api-" + ns[len(ns)-5:]
	kaironNode(t, env, node, true)

	sel := map[string]string{"ui-test": ns}
	web1 := machine(t, env, ns, "web-1", node, kaironv1.MachineRunning, sel)
	web1.Status.Addresses = []kaironv1.MachineAddress{{Type: "InternalIP", Address: "10.88.0.17"}}
	web1.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Booted", Message: "guest agent answered", LastTransitionTime: metav1.Now()}}
	env.SetStatus(t, web1)
	machine(t, env, ns, "web-2", node, kaironv1.MachineBooting, sel)
	machine(t, env, ns, "web-3", node, kaironv1.MachineRunning, sel)
	machine(t, env, ns2, "other-1", "", kaironv1.MachineRunning, sel)
	env.Create(t, &kaironv1.MachineMigration{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "move-web-3"},
		Spec:       kaironv1.MachineMigrationSpec{MachineName: "web-3", Strategy: kaironv1.MigrationCold},
	})
	budget(t, env, ns, "web", sel, ptr.To(intstr.FromInt32(1)), nil)
	budget(t, env, ns2, "half", sel, nil, ptr.To(intstr.FromString("50%")))

	pool := &kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "warm"},
		Spec: kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](3), Template: kaironv1.MachineTemplateSpec{Spec: kaironv1.MachineSpec{CPU: 1, Memory: web1.Spec.Memory}}}}
	env.Create(t, pool)
	pool.Status = kaironv1.MachinePoolStatus{Replicas: 4, Warm: 3, ReadyWarm: 2, Claimed: 1}
	env.SetStatus(t, pool)
	claim := &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "job-1"}, Spec: kaironv1.MachineClaimSpec{PoolName: "warm"}}
	env.Create(t, claim)
	claim.Status = kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimBound, MachineName: "web-1", BindMillis: 42}
	env.SetStatus(t, claim)
	pol := &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web-egress"},
		Spec: kaironv1.MachineNetworkPolicySpec{MachineSelector: &metav1.LabelSelector{MatchLabels: sel}}}
	env.Create(t, pol)
	pol.Status = kaironv1.MachineNetworkPolicyStatus{Machines: 3, Nodes: []kaironv1.PolicyEnforcement{{Node: node, Machines: []string{"web-1"}, ObservedGeneration: pol.Generation}}}
	env.SetStatus(t, pol)

	// The budgets, once the watches delivered every Machine and migration.
	var budgets ui.List[ui.Budget]
	testenv.Eventually(t, 30*time.Second, "the UI to count the 4 matching Machines", func() (bool, string) {
		getJSON(t, url+"/api/v1/disruption-budgets?namespace="+ns, http.StatusOK, &budgets)
		if len(budgets.Items) != 1 {
			return false, fmt.Sprintf("%d budgets", len(budgets.Items))
		}
		b := budgets.Items[0]
		return b.ExpectedMachines == 4 && b.CurrentHealthy == 2, b.Summary
	})
	states := budgetsNow(t, env)
	web := budgets.Items[0]
	if web.Name != "web" || web.Namespace != ns {
		t.Fatalf("?namespace=%s gave budget %s/%s", ns, web.Namespace, web.Name)
	}
	if d := sameNumbers(web, rules.FindBudgetState(states, ns, "web")); d != "" {
		t.Errorf("budget web: %s", d)
	}
	// expected 4 (3 here, 1 in ns2), healthy web-1 and other-1 (web-2 is
	// Booting, web-3 has a migration in flight), desired 1, allowed 1.
	if web.Summary != "4 matching, 2 healthy, 1 desired healthy, 1 disruptions allowed" {
		t.Errorf("budget web: %s", web.Summary)
	}
	if web.MinAvailable == nil || *web.MinAvailable != "1" || web.MaxUnavailable != nil {
		t.Errorf("budget web bounds: %v %v", web.MinAvailable, web.MaxUnavailable)
	}
	// The same text `kaironctl describe budget` prints.
	var out, errOut bytes.Buffer
	if code := kaironctl.Main(context.Background(), []string{"--kubeconfig", env.Kubeconfig, "describe", "budget", "web", "-n", ns}, &out, &errOut); code != 0 {
		t.Fatalf("kaironctl describe budget: exit %d: %s", code, errOut.String())
	}
	if want := "Status (recomputed fresh from Machines/MachineMigrations right now): " + web.Summary + "\n"; !strings.Contains(out.String(), want) {
		t.Errorf("kaironctl describe budget printed:\n%s\nwant the UI's summary %q", out.String(), want)
	}
	for _, m := range web.Machines {
		shown, verdict := m.Name, "healthy"
		if m.Namespace != ns {
			shown = m.Namespace + "/" + m.Name
		}
		if !m.Healthy {
			verdict = "NOT healthy (" + m.Reason + ")"
		}
		if !containsLine(out.String(), shown, verdict) {
			t.Errorf("kaironctl describe budget has no line %q %q:\n%s", shown, verdict, out.String())
		}
	}
	if len(web.Machines) != 4 {
		t.Errorf("budget web receipts: %+v", web.Machines)
	}

	// The status the controller writes is shown beside, as reported.
	b := getBudget(t, env, ns, "web")
	b.Status = kaironv1.MachineDisruptionBudgetStatus{ExpectedMachines: 3, CurrentHealthy: 3, DesiredHealthy: 1, DisruptionsAllowed: 2, ObservedGeneration: b.Generation}
	env.SetStatus(t, b)
	testenv.Eventually(t, 30*time.Second, "the reported status", func() (bool, string) {
		getJSON(t, url+"/api/v1/disruption-budgets?namespace="+ns, http.StatusOK, &budgets)
		r := budgets.Items[0].ReportedStatus
		return r == ui.ReportedStatus{ExpectedMachines: 3, CurrentHealthy: 3, DesiredHealthy: 1, DisruptionsAllowed: 2, ObservedGeneration: b.Generation, Generation: b.Generation}, fmt.Sprintf("%+v", r)
	})
	if d := sameNumbers(budgets.Items[0], rules.FindBudgetState(budgetsNow(t, env), ns, "web")); d != "" {
		t.Errorf("budget web after a status write: %s", d)
	}

	getJSON(t, url+"/api/v1/disruption-budgets?namespace="+ns2, http.StatusOK, &budgets)
	if len(budgets.Items) != 1 || budgets.Items[0].Name != "half" {
		t.Fatalf("?namespace=%s: %+v", ns2, budgets.Items)
	}
	if d := sameNumbers(budgets.Items[0], rules.FindBudgetState(states, ns2, "half")); d != "" {
		t.Errorf("budget half: %s", d)
	}
	if b := budgets.Items[0]; b.DesiredHealthy != 2 || b.DisruptionsAllowed != 0 || b.MaxUnavailable == nil || *b.MaxUnavailable != "50%" {
		t.Errorf("budget half: %+v", b)
	}
	// All namespaces: both, each with the shared code's numbers.
	getJSON(t, url+"/api/v1/disruption-budgets", http.StatusOK, &budgets)
	seen := 0
	for _, b := range budgets.Items {
		if b.Namespace == ns || b.Namespace == ns2 {
			seen++
			if d := sameNumbers(b, rules.FindBudgetState(states, b.Namespace, b.Name)); d != "" {
				t.Errorf("budget %s/%s: %s", b.Namespace, b.Name, d)
			}
		}
	}
	if seen != 2 {
		t.Errorf("all namespaces: saw %d of the 2 budgets", seen)
	}

	// Stable field names: the raw JSON has exactly the documented keys.
	var raw struct{ Items []map[string]json.RawMessage }
	getJSON(t, url+"/api/v1/disruption-budgets?namespace="+ns, http.StatusOK, &raw)
	for _, k := range []string{"namespace", "name", "selector", "minAvailable", "maxUnavailable", "expectedMachines", "currentHealthy", "desiredHealthy", "disruptionsAllowed", "summary", "error", "machines", "reportedStatus"} {
		if _, ok := raw.Items[0][k]; !ok {
			t.Errorf("disruption-budgets item has no %q: %v", k, raw.Items[0])
		}
	}

	var machines ui.List[ui.Machine]
	getJSON(t, url+"/api/v1/machines?namespace="+ns, http.StatusOK, &machines)
	if names := machineNames(machines.Items); names != "web-1 web-2 web-3" {
		t.Errorf("machines in %s: %s", ns, names)
	}
	m := machines.Items[0]
	if m.Phase != "Running" || m.Node != node || m.CPU != 2 || m.Memory != "512Mi" || len(m.Addresses) != 1 || m.Addresses[0].Address != "10.88.0.17" ||
		len(m.Conditions) != 1 || m.Conditions[0].Reason != "Booted" || m.Labels["ui-test"] != ns {
		t.Errorf("machine web-1: %+v", m)
	}
	getJSON(t, url+"/api/v1/machines?namespace="+ns2, http.StatusOK, &machines)
	if names := machineNames(machines.Items); names != "other-1" {
		t.Errorf("machines in %s: %s", ns2, names)
	}
	getJSON(t, url+"/api/v1/machines?namespace="+ns+"&phase=Booting", http.StatusOK, &machines)
	if names := machineNames(machines.Items); names != "web-2" {
		t.Errorf("Booting machines: %s", names)
	}
	getJSON(t, url+"/api/v1/machines?labelSelector=ui-test%3D"+ns+"&node="+node, http.StatusOK, &machines)
	if names := machineNames(machines.Items); names != "web-1 web-2 web-3" {
		t.Errorf("machines on %s: %s", node, names)
	}
	var apiErr map[string]string
	getJSON(t, url+"/api/v1/machines?labelSelector=%3D%3D%3D", http.StatusBadRequest, &apiErr)
	if !strings.Contains(apiErr["error"], "invalid labelSelector") {
		t.Errorf("bad selector: %v", apiErr)
	}

	var nodes ui.List[ui.Node]
	getJSON(t, url+"/api/v1/nodes", http.StatusOK, &nodes)
	var n *ui.Node
	for i := range nodes.Items {
		if nodes.Items[i].Name == node {
			n = &nodes.Items[i]
		}
	}
	if n == nil || !n.Cordoned || n.Backend != "sim" || n.Acceleration != "tcg" || n.Machines != 3 || n.CPUAllocated != 6 ||
		n.MemoryAllocated != "1536Mi" || n.CPUAllocatable != "8" || n.MemoryAllocatable != "16Gi" || n.InternalIP != "10.88.0.1" {
		t.Errorf("node %s: %+v", node, n)
	}

	var pools ui.List[ui.Pool]
	getJSON(t, url+"/api/v1/machine-pools?namespace="+ns, http.StatusOK, &pools)
	if len(pools.Items) != 1 || pools.Items[0].Name != "warm" || *pools.Items[0].Desired != 3 || pools.Items[0].Warm != 3 || pools.Items[0].ReadyWarm != 2 || pools.Items[0].Booting != 1 || pools.Items[0].Claimed != 1 {
		t.Errorf("pools: %+v", pools.Items)
	}
	getJSON(t, url+"/api/v1/machine-pools?namespace="+ns2, http.StatusOK, &pools)
	if len(pools.Items) != 0 {
		t.Errorf("pools in %s: %+v", ns2, pools.Items)
	}
	var claims ui.List[ui.Claim]
	getJSON(t, url+"/api/v1/machine-claims?namespace="+ns, http.StatusOK, &claims)
	if len(claims.Items) != 1 || claims.Items[0].Phase != "Bound" || claims.Items[0].Machine != "web-1" || claims.Items[0].BindMillis != 42 || claims.Items[0].Pool != "warm" {
		t.Errorf("claims: %+v", claims.Items)
	}
	var migs ui.List[ui.Migration]
	getJSON(t, url+"/api/v1/migrations?namespace="+ns, http.StatusOK, &migs)
	if len(migs.Items) != 1 || migs.Items[0].Machine != "web-3" || migs.Items[0].Strategy != "cold" {
		t.Errorf("migrations: %+v", migs.Items)
	}
	getJSON(t, url+"/api/v1/migrations?namespace="+ns2, http.StatusOK, &migs)
	if len(migs.Items) != 0 {
		t.Errorf("migrations in %s: %+v", ns2, migs.Items)
	}
	var pols ui.List[ui.NetworkPolicy]
	getJSON(t, url+"/api/v1/network-policies?namespace="+ns, http.StatusOK, &pols)
	if len(pols.Items) != 1 || pols.Items[0].MachineSelector != "ui-test="+ns || pols.Items[0].Machines != 3 ||
		len(pols.Items[0].Nodes) != 1 || !pols.Items[0].Nodes[0].Enforced {
		t.Errorf("network policies: %+v", pols.Items)
	}

	getJSON(t, url+"/api/v1/widgets", http.StatusNotFound, &apiErr)

	// Compressed for a client that asks, as browsers do.
	req, _ := http.NewRequest(http.MethodGet, url+"/api/v1/machines", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		t.Fatalf("Content-Encoding %q: %v", resp.Header.Get("Content-Encoding"), err)
	}
	if err := json.NewDecoder(zr).Decode(&machines); err != nil || len(machines.Items) < 4 {
		t.Errorf("gzipped machines: %v, %d items", err, len(machines.Items))
	}
	resp.Body.Close()

	// The pools page charts the claim's bind latency.
	if body := get(t, url+"/pools?namespace="+ns, http.StatusOK); !strings.Contains(body, "1 bound claims · p50 42 ms · p95 42 ms · max 42 ms") {
		t.Errorf("pools page has no bind latency of job-1:\n%s", body)
	} else if !strings.Contains(body, `<span style="width: 100%"></span>`) {
		t.Errorf("pools page has no full bar for job-1's bucket:\n%s", body)
	}
}

// TestEventStream reads /api/v1/events and sees a change of machines when
// a Machine is created.
func TestEventStream(t *testing.T) {
	env := testenv.Get(t)
	url := startUI(t, env)
	ns := env.Namespace(t)
	resp, err := http.Get(url + "/api/v1/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	// The stream is open once its first comment arrived.
	if first := <-lines; first != ": connected" {
		t.Fatalf("first line %q", first)
	}
	machine(t, env, ns, "vm-1", "", "", nil)
	var seen []string
	testenv.Eventually(t, 30*time.Second, "a change event naming machines", func() (bool, string) {
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					return false, "stream ended: " + strings.Join(seen, " | ")
				}
				seen = append(seen, l)
				if strings.HasPrefix(l, "data: ") && strings.Contains(l, `"machines"`) {
					return len(seen) >= 2 && seen[len(seen)-2] == "event: change", strings.Join(seen, " | ")
				}
			default:
				return false, strings.Join(seen, " | ")
			}
		}
	})
}

func getBudget(t *testing.T, env *testenv.Env, ns, name string) *kaironv1.MachineDisruptionBudget {
	t.Helper()
	var b kaironv1.MachineDisruptionBudget
	if err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &b); err != nil {
		t.Fatal(err)
	}
	return &b
}

func machineNames(ms []ui.Machine) string {
	var names []string
	for _, m := range ms {
		names = append(names, m.Name)
	}
	return strings.Join(names, " ")
}

// containsLine reports whether some line of out has exactly the fields of
// shown followed by those of verdict.
func containsLine(out, shown, verdict string) bool {
	want := strings.Join(strings.Fields(shown+" "+verdict), " ")
	for _, line := range strings.Split(out, "\n") {
		if strings.Join(strings.Fields(line), " ") == want {
			return true
		}
	}
	return false
}

// TestPages renders every page on the server side (the browser test drives
// them in Chromium) and checks a Machine's page has its conditions, events
// and addresses.
func TestPages(t *testing.T) {
	env := testenv.Get(t)
	url := startUI(t, env)
	ns := env.Namespace(t)
	m := machine(t, env, ns, "vm-1", "", kaironv1.MachineFailed, nil)
	m.Status.Addresses = []kaironv1.MachineAddress{{Type: "InternalIP", Address: "10.88.3.4"}}
	m.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionFalse, Reason: "BootFailed", Message: "kernel panic", LastTransitionTime: metav1.Now()}}
	m.Status.ConsoleTail = "Kernel panic - not syncing"
	env.SetStatus(t, m)
	now := metav1.NowMicro()
	env.Create(t, &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "vm-1.boot"},
		EventTime:  now, ReportingController: "kairon.zyvor.dev/node", ReportingInstance: "test",
		Action: "Boot", Reason: "BootFailed", Note: "the guest did not come up", Type: corev1.EventTypeWarning,
		Regarding: corev1.ObjectReference{Kind: "Machine", Namespace: ns, Name: "vm-1", APIVersion: kaironv1.GroupVersion.String()},
	})

	// Nodes and a Machine's page have no namespace filter.
	for _, path := range []string{"/nodes", "/machines/" + ns + "/vm-1"} {
		if body := get(t, url+path, http.StatusOK); strings.Contains(body, `class="filters"`) {
			t.Errorf("%s has the namespace filter", path)
		}
	}
	for _, path := range []string{"/", "/nodes", "/machines", "/machines?phase=Failed&namespace=" + ns, "/pools", "/budgets", "/migrations", "/network-policies"} {
		body := get(t, url+path, http.StatusOK)
		if !strings.Contains(body, `<div id="live">`) {
			t.Errorf("%s has no live region", path)
		}
	}
	testenv.Eventually(t, 30*time.Second, "vm-1's page to show its event", func() (bool, string) {
		body := get(t, url+"/machines/"+ns+"/vm-1", http.StatusOK)
		for _, want := range []string{"10.88.3.4", "BootFailed", "kernel panic", "the guest did not come up", "Kernel panic - not syncing"} {
			if !strings.Contains(body, want) {
				return false, "no " + want
			}
		}
		return true, ""
	})
	testenv.Eventually(t, 30*time.Second, "the overview to list the Warning event", func() (bool, string) {
		return strings.Contains(get(t, url+"/?namespace="+ns, http.StatusOK), "the guest did not come up"), "not yet"
	})
	get(t, url+"/machines/"+ns+"/nope", http.StatusNotFound)
	get(t, url+"/static/app.js", http.StatusOK)
}

func get(t *testing.T, url string, want int) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != want {
		t.Fatalf("GET %s: %s, want %d: %s", url, resp.Status, want, body)
	}
	return string(body)
}
