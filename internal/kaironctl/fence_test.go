package kaironctl_test

// kaironctl fence and recover against the real API server. No controller
// runs: the test reads what kaironctl wrote on the Node and what it
// printed, and plays kairon-controller where --wait needs it.

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// setAgentReady gives a Node a KaironAgentReady condition, as
// kairon-controller's node health does.
func setAgentReady(t *testing.T, name string, status corev1.ConditionStatus) {
	t.Helper()
	env := testenv.Get(t)
	var n corev1.Node
	if err := env.Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: status, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()},
		{Type: corev1.NodeConditionType(kaironv1.NodeConditionAgentReady), Status: status, LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()},
	}
	if err := env.Client.Status().Update(context.Background(), &n); err != nil {
		t.Fatal(err)
	}
}

func getNode(t *testing.T, name string) *corev1.Node {
	t.Helper()
	var n corev1.Node
	if err := testenv.Get(t).Client.Get(context.Background(), client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	return &n
}

func fenceTaint(n *corev1.Node) *corev1.Taint {
	for i := range n.Spec.Taints {
		if n.Spec.Taints[i].Key == kaironv1.TaintNodeFenced {
			return &n.Spec.Taints[i]
		}
	}
	return nil
}

// fence refuses an unknown node, a node that is no Kairon node and a node
// whose agent still reports in (unless --force); it taints a dead node,
// records who and when, and prints per Machine what Kairon does with it;
// -o json carries the same; recover lifts the fence.
func TestFenceAndRecover(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	node := evacNode(t, env, ns, "dead")

	kctl(t, env, "fence", ns+"-nowhere").failed(t, `node "`+ns+`-nowhere" not found`, "kaironctl get nodes")
	plain := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: ns + "-plain"}}
	env.Create(t, plain)
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), plain) })
	kctl(t, env, "fence", plain.Name).failed(t, "is not a Kairon node", kaironv1.LabelNode)
	kctl(t, env, "fence").failed(t, "fence needs a NODE")
	kctl(t, env, "fence", node, "-o", "table").failed(t, `invalid -o/--output "table"`)
	kctl(t, env, "fence", node, "--timeout", "1m").failed(t, "--timeout only applies with --wait")

	setAgentReady(t, node, corev1.ConditionTrue)
	kctl(t, env, "fence", node).failed(t, "is not down", "KaironAgentReady is True", "--force")
	if fenceTaint(getNode(t, node)) != nil {
		t.Fatal("a refused fence tainted the node")
	}

	runningOn(t, env, ns, "web-1", node, map[string]string{kaironv1.LabelMachineSet: "web"})
	runningOn(t, env, ns, "held", node, map[string]string{kaironv1.LabelMachinePool: "agents",
		kaironv1.LabelPoolState: kaironv1.PoolStateClaimed, kaironv1.LabelMachineClaim: "job"})
	runningOn(t, env, ns, "lone", node, nil)

	setAgentReady(t, node, corev1.ConditionUnknown)
	out := kctl(t, env, "fence", node).ok(t, "fence", node).stdout
	for _, want := range []string{
		"node " + node + " fenced (taint kairon.zyvor.dev/fenced=true:NoExecute)",
		"machine " + ns + "/held (MachineClaim job): deleted, claim job goes Lost (NodeFenced)",
		"machine " + ns + "/lone: left on node " + node + ": nothing owns it and it has no Ready MachineSnapshot",
		"machine " + ns + "/web-1 (MachineSet web): deleted and replaced on another node",
		"node " + node + ": 3 Machines: 0 restored, 1 replaced, 1 claim lost, 1 left",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("fence output lacks %q:\n%s", want, out)
		}
	}
	n := getNode(t, node)
	if taint := fenceTaint(n); taint == nil || taint.Effect != corev1.TaintEffectNoExecute || taint.Value != "true" {
		t.Errorf("taints %v, want %s=true:NoExecute", n.Spec.Taints, kaironv1.TaintNodeFenced)
	}
	if n.Annotations[kaironv1.AnnotationFencedAt] == "" || n.Annotations[kaironv1.AnnotationFencedBy] == "" {
		t.Errorf("annotations %v, want who and when", n.Annotations)
	}
	out = kctl(t, env, "get", "nodes").ok(t, "get", "nodes").stdout
	if line := strings.Join(lineStarting(out, node), " "); !strings.Contains(line, "Fenced") {
		t.Errorf("get nodes says %q for the fenced node, want Fenced in STATUS", line)
	}

	// Again: already fenced, same plan, as JSON and YAML.
	var report struct {
		Node      string `json:"node"`
		Fenced    bool   `json:"fenced"`
		Unchanged bool   `json:"unchanged"`
		FencedBy  string `json:"fencedBy"`
		Machines  []struct {
			Name, Action, Claim, Owner string
		} `json:"machines"`
	}
	js := kctl(t, env, "fence", node, "-o", "json").ok(t, "fence -o json").stdout
	if err := json.Unmarshal([]byte(js), &report); err != nil {
		t.Fatalf("fence -o json: %v\n%s", err, js)
	}
	if report.Node != node || !report.Fenced || !report.Unchanged || report.FencedBy == "" || len(report.Machines) != 3 ||
		report.Machines[0].Name != "held" || report.Machines[0].Action != "ClaimLost" || report.Machines[0].Claim != "job" ||
		report.Machines[2].Action != "Replace" || report.Machines[2].Owner != "MachineSet web" {
		t.Errorf("fence -o json: %+v", report)
	}
	ys := kctl(t, env, "fence", node, "-o", "yaml").ok(t, "fence -o yaml").stdout
	if err := yaml.Unmarshal([]byte(ys), &report); err != nil || report.Node != node {
		t.Errorf("fence -o yaml: %v\n%s", err, ys)
	}

	out = kctl(t, env, "recover", node).ok(t, "recover", node).stdout
	if !strings.Contains(out, "node "+node+" recovered") || !strings.Contains(out, "machine "+ns+"/lone is still on node "+node) {
		t.Errorf("recover output:\n%s", out)
	}
	n = getNode(t, node)
	if fenceTaint(n) != nil || n.Annotations[kaironv1.AnnotationRecoveredAt] == "" || n.Annotations[kaironv1.AnnotationFencedAt] != "" {
		t.Errorf("after recover: taints %v annotations %v", n.Spec.Taints, n.Annotations)
	}
	out = kctl(t, env, "recover", node).ok(t, "recover", node).stdout
	if !strings.Contains(out, "node "+node+" is not fenced; nothing to recover") {
		t.Errorf("second recover:\n%s", out)
	}

	// --force on a live node says so.
	setAgentReady(t, node, corev1.ConditionTrue)
	out = kctl(t, env, "fence", node, "--force").ok(t, "fence --force").stdout
	if !strings.Contains(out, "fenced with --force") {
		t.Errorf("fence --force:\n%s", out)
	}
}
