package ui_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/testenv"
	"github.com/zyvor/kairon/internal/ui"
)

func TestMain(m *testing.M) { os.Exit(testenv.Run(m)) }

// startUI runs a kairon-ui server against the test control plane and
// returns its URL. It stops when the test ends.
func startUI(t *testing.T, env *testenv.Env) string {
	t.Helper()
	return startUIWith(t, env.Config, ui.Options{})
}

// startUIWith is startUI with the identity cfg and options.
func startUIWith(t *testing.T, cfg *rest.Config, opts ui.Options) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	srv, err := ui.New(cfg, opts)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := srv.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		// Open event streams end only with their connections.
		hs.CloseClientConnections()
		hs.Close()
		cancel()
	})
	return hs.URL
}

// machine creates a Machine with labels and then sets its phase and node.
func machine(t *testing.T, env *testenv.Env, ns, name, node string, phase kaironv1.MachinePhase, labels map[string]string) *kaironv1.Machine {
	t.Helper()
	m := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       kaironv1.MachineSpec{NodeName: node, CPU: 2, Memory: resource.MustParse("512Mi"), Image: "debian"},
	}
	env.Create(t, m)
	if phase != "" {
		m.Status.Phase = phase
		env.SetStatus(t, m)
	}
	return m
}

func budget(t *testing.T, env *testenv.Env, ns, name string, selector map[string]string, minAvailable, maxUnavailable *intstr.IntOrString) {
	t.Helper()
	env.Create(t, &kaironv1.MachineDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       kaironv1.MachineDisruptionBudgetSpec{Selector: selector, MinAvailable: minAvailable, MaxUnavailable: maxUnavailable},
	})
}

// kaironNode creates a Ready Kairon node and deletes it when the test ends.
func kaironNode(t *testing.T, env *testenv.Env, name string, unschedulable bool) {
	t.Helper()
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			kaironv1.LabelNode: "true", kaironv1.LabelNodeBackend: "sim", kaironv1.LabelNodeAcceleration: "tcg",
		}},
		Spec: corev1.NodeSpec{Unschedulable: unschedulable},
	}
	env.Create(t, n)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), n) })
	n.Status = corev1.NodeStatus{
		Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("16Gi")},
		Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KaironNodeReady"}},
		Addresses:   []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.88.0.1"}},
	}
	env.SetStatus(t, n)
}

// getJSON fetches url and decodes its JSON into v, failing t unless the
// status is want.
func getJSON(t *testing.T, url string, want int, v any) {
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
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("GET %s: Content-Type %q", url, ct)
	}
	if err := json.Unmarshal(body, v); err != nil {
		t.Fatalf("GET %s: %v in %s", url, err, body)
	}
}

// budgetsNow is what the shared budget code says right now, read straight
// from the API server (not through the UI's cache).
func budgetsNow(t *testing.T, env *testenv.Env) []rules.BudgetState {
	t.Helper()
	states, err := rules.LoadBudgetStates(context.Background(), env.Client)
	if err != nil {
		t.Fatal(err)
	}
	return states
}

// sameNumbers reports how b differs from the shared code's state s; "" when
// the numbers and receipts agree.
func sameNumbers(b ui.Budget, s *rules.BudgetState) string {
	if s == nil {
		return "the shared code has no such budget"
	}
	if b.ExpectedMachines != s.ExpectedMachines || b.CurrentHealthy != s.CurrentHealthy ||
		b.DesiredHealthy != s.DesiredHealthy || b.DisruptionsAllowed != s.DisruptionsAllowed || b.Summary != rules.BudgetSummary(s) {
		return "UI: " + b.Summary + "; shared code: " + rules.BudgetSummary(s)
	}
	if len(b.Machines) != len(s.Machines) {
		return "receipts differ in number"
	}
	for i, m := range s.Machines {
		got := b.Machines[i]
		if got.Namespace != m.Namespace || got.Name != m.Name || got.Healthy != m.Healthy || got.Reason != m.Reason || got.Migration != m.Migration || got.Phase != string(m.Phase) {
			return "receipt " + m.Namespace + "/" + m.Name + " differs"
		}
	}
	return ""
}
