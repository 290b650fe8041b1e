package controller

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// testNode is a ready Kairon node offering cpu vCPUs and memory.
func testNode(name string, cpu int64, memory string, mutate ...func(*corev1.Node)) *corev1.Node {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{kaironv1.LabelNode: "true"}},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{
				corev1.ResourceCPU:    *resource.NewQuantity(cpu, resource.DecimalSI),
				corev1.ResourceMemory: resource.MustParse(memory),
			},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, f := range mutate {
		f(n)
	}
	return n
}

func testMachine(name string, cpu int32, memory string, mutate ...func(*kaironv1.Machine)) *kaironv1.Machine {
	m := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team", UID: types.UID("uid-" + name)},
		Spec:       kaironv1.MachineSpec{CPU: cpu, Memory: resource.MustParse(memory)},
	}
	for _, f := range mutate {
		f(m)
	}
	return m
}

func cordoned(n *corev1.Node)       { n.Spec.Unschedulable = true }
func notReady(n *corev1.Node)       { n.Status.Conditions[0].Status = corev1.ConditionFalse }
func zoneA(n *corev1.Node)          { n.Labels["zone"] = "a" }
func wantZoneA(m *kaironv1.Machine) { m.Spec.NodeSelector = map[string]string{"zone": "a"} }

func infos(used map[string]resources, nodes ...*corev1.Node) []*nodeInfo {
	var out []*nodeInfo
	for _, n := range nodes {
		info := newNodeInfo(n)
		info.requested = used[n.Name]
		out = append(out, info)
	}
	return out
}

func TestPickNode(t *testing.T) {
	const mi = int64(1) << 20
	tests := []struct {
		name     string
		nodes    []*nodeInfo
		machine  *kaironv1.Machine
		wantNode string
		wantWhy  string
	}{
		{
			name:    "no Kairon nodes",
			machine: testMachine("m", 1, "256Mi"),
			wantWhy: "no nodes labelled kairon.zyvor.dev/node: start kairon-node",
		},
		{
			name:     "the emptier node wins",
			nodes:    infos(map[string]resources{"a": {CPU: 2, Memory: 512 * mi}}, testNode("a", 4, "1Gi"), testNode("b", 4, "1Gi")),
			machine:  testMachine("m", 1, "256Mi"),
			wantNode: "b",
		},
		{
			name:     "ties go to the first name",
			nodes:    infos(nil, testNode("b", 4, "1Gi"), testNode("a", 4, "1Gi")),
			machine:  testMachine("m", 1, "256Mi"),
			wantNode: "a",
		},
		{
			name: "free capacity is a fraction, so a big busy node beats a small empty one",
			nodes: infos(map[string]resources{"big": {CPU: 8, Memory: 4096 * mi}},
				testNode("big", 32, "16Gi"), testNode("small", 2, "1Gi")),
			machine:  testMachine("m", 1, "256Mi"),
			wantNode: "big",
		},
		{
			name:     "cordoned and not ready nodes take nothing new",
			nodes:    infos(nil, testNode("a", 4, "1Gi", cordoned), testNode("b", 4, "1Gi", notReady), testNode("c", 1, "256Mi")),
			machine:  testMachine("m", 1, "256Mi"),
			wantNode: "c",
		},
		{
			name:     "nodeSelector",
			nodes:    infos(nil, testNode("a", 4, "1Gi"), testNode("b", 1, "256Mi", zoneA)),
			machine:  testMachine("m", 1, "256Mi", wantZoneA),
			wantNode: "b",
		},
		{
			name: "every reason, one node each",
			nodes: infos(map[string]resources{"full": {CPU: 0, Memory: 896 * mi}},
				testNode("cordoned", 4, "1Gi", cordoned), testNode("elsewhere", 4, "1Gi"), testNode("full", 4, "1Gi", zoneA)),
			machine: testMachine("m", 1, "256Mi", wantZoneA),
			wantWhy: "0/3 nodes are available: 1 node is cordoned, 1 node does not match spec.nodeSelector, 1 node has insufficient memory (free 128Mi, need 256Mi)",
		},
		{
			name: "short of both CPU and memory counts for both, quoting the best node",
			nodes: infos(map[string]resources{"a": {CPU: 3, Memory: 1024 * mi}, "b": {CPU: 4, Memory: 768 * mi}},
				testNode("a", 4, "1Gi"), testNode("b", 4, "1Gi"), testNode("c", 4, "1Gi", notReady)),
			machine: testMachine("m", 2, "512Mi"),
			wantWhy: "0/3 nodes are available: 1 node is not ready, 2 nodes have insufficient cpu (most free 1, need 2), 2 nodes have insufficient memory (most free 256Mi, need 512Mi)",
		},
		{
			name:    "a node without allocatable has no room",
			nodes:   infos(nil, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}),
			machine: testMachine("m", 1, "256Mi"),
			wantWhy: "0/1 nodes are available: 1 node has insufficient cpu (free 0, need 1), 1 node has insufficient memory (free 0, need 256Mi)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why := pickNode(tt.nodes, tt.machine)
			gotNode := ""
			if got != nil {
				gotNode = got.node.Name
			}
			if gotNode != tt.wantNode || why != tt.wantWhy {
				t.Errorf("pickNode = %q, %q\nwant        %q, %q", gotNode, why, tt.wantNode, tt.wantWhy)
			}
		})
	}
}

func TestNodeScore(t *testing.T) {
	const gi = int64(1) << 30
	n := newNodeInfo(testNode("a", 4, "4Gi"))
	n.requested = resources{CPU: 1, Memory: 1 * gi}
	// After a 1 vCPU, 1Gi Machine: half the CPU and half the memory are left.
	if got := nodeScore(n, testMachine("m", 1, "1Gi")); got != 0.5 {
		t.Errorf("nodeScore = %v, want 0.5", got)
	}
}

func TestNodeAllocatableRoundsCPUDown(t *testing.T) {
	n := testNode("a", 0, "1Gi")
	n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("3500m")
	if got := nodeAllocatable(n); got.CPU != 3 || got.Memory != 1<<30 {
		t.Errorf("nodeAllocatable = %+v, want 3 vCPUs and 1Gi", got)
	}
}

func TestFormatBytes(t *testing.T) {
	for in, want := range map[int64]string{
		0:               "0",
		128 << 20:       "128Mi",
		8 << 30:         "8Gi",
		1536 << 20:      "1536Mi",
		8032100 << 10:   "7.7Gi",
		(1 << 20) + 512: "1.0Mi",
		4096:            "4Ki",
		-(256 << 20):    "-256Mi",
	} {
		if got := formatBytes(in); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestSortByAge(t *testing.T) {
	at := func(sec int) func(*kaironv1.Machine) {
		return func(m *kaironv1.Machine) {
			m.CreationTimestamp = metav1.NewTime(time.Unix(int64(sec), 0))
		}
	}
	machines := []*kaironv1.Machine{
		testMachine("c", 1, "256Mi", at(2)),
		testMachine("b", 1, "256Mi", at(1)),
		testMachine("a", 1, "256Mi", at(1)),
	}
	sortByAge(machines)
	if got := [3]string{machines[0].Name, machines[1].Name, machines[2].Name}; got != [3]string{"a", "b", "c"} {
		t.Errorf("order = %v, want [a b c]", got)
	}
}

func TestAssumedBindings(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newAssumedBindings()
	a.now = func() time.Time { return now }

	m := testMachine("m", 1, "256Mi")
	a.assume(m, "node-1")

	// The cache still shows the Machine unplaced: the binding is overlaid
	// on a copy.
	got := a.apply([]*kaironv1.Machine{m})
	if got[0].Spec.NodeName != "node-1" || m.Spec.NodeName != "" {
		t.Fatalf("overlay: got nodeName %q (cache copy %q), want node-1 on a copy", got[0].Spec.NodeName, m.Spec.NodeName)
	}

	// The cache caught up: forgotten.
	seen := m.DeepCopy()
	seen.Spec.NodeName = "node-1"
	a.apply([]*kaironv1.Machine{seen})
	if a.len() != 0 {
		t.Errorf("binding kept after the cache showed it")
	}

	// Never confirmed: forgotten after assumeTTL.
	a.assume(m, "node-1")
	now = now.Add(assumeTTL + time.Second)
	if got := a.apply([]*kaironv1.Machine{m}); got[0].Spec.NodeName != "" || a.len() != 0 {
		t.Errorf("expired binding still applied")
	}

	// The Machine is gone: forgotten.
	a.assume(m, "node-1")
	a.apply(nil)
	if a.len() != 0 {
		t.Errorf("binding of a deleted Machine kept")
	}
}

func TestChargeNodesCountsMigrationTargets(t *testing.T) {
	on := func(node string, phase kaironv1.MachinePhase) func(*kaironv1.Machine) {
		return func(m *kaironv1.Machine) { m.Spec.NodeName, m.Status.Phase = node, phase }
	}
	migration := func(machine, target string, phase kaironv1.MigrationPhase) kaironv1.MachineMigration {
		return kaironv1.MachineMigration{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "mig-" + machine},
			Spec:       kaironv1.MachineMigrationSpec{MachineName: machine},
			Status:     kaironv1.MachineMigrationStatus{Phase: phase, TargetNode: target},
		}
	}
	machines := []*kaironv1.Machine{
		testMachine("moving", 2, "1Gi", on("a", kaironv1.MachineRunning)),
		testMachine("switched", 1, "512Mi", on("b", kaironv1.MachineRunning)),
		testMachine("done", 1, "256Mi", on("a", kaironv1.MachineRunning)),
		testMachine("failed", 4, "4Gi", on("a", kaironv1.MachineFailed)),
	}
	for _, tc := range []struct {
		name       string
		migrations []kaironv1.MachineMigration
		wantCPU    map[string]int64
	}{
		{"no migrations", nil, map[string]int64{"a": 3, "b": 1}},
		{"a Running migration holds room on its target", []kaironv1.MachineMigration{migration("moving", "b", kaironv1.MigrationRunning)}, map[string]int64{"a": 3, "b": 3}},
		{"after the switch the Machine counts once", []kaironv1.MachineMigration{migration("switched", "b", kaironv1.MigrationRunning)}, map[string]int64{"a": 3, "b": 1}},
		{"ended or pending migrations hold nothing", []kaironv1.MachineMigration{
			migration("done", "b", kaironv1.MigrationSucceeded), migration("moving", "b", kaironv1.MigrationPending),
		}, map[string]int64{"a": 3, "b": 1}},
		{"a Machine that holds nothing brings nothing", []kaironv1.MachineMigration{migration("failed", "b", kaironv1.MigrationRunning)}, map[string]int64{"a": 3, "b": 1}},
		{"a migration of an unknown Machine is ignored", []kaironv1.MachineMigration{migration("ghost", "b", kaironv1.MigrationRunning)}, map[string]int64{"a": 3, "b": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			byName := map[string]*nodeInfo{}
			for _, n := range infos(nil, testNode("a", 8, "8Gi"), testNode("b", 8, "8Gi")) {
				byName[n.node.Name] = n
			}
			chargeNodes(byName, machines, tc.migrations)
			for node, want := range tc.wantCPU {
				if got := byName[node].requested.CPU; got != want {
					t.Errorf("node %s: %d vCPUs requested, want %d", node, got, want)
				}
			}
		})
	}
}
