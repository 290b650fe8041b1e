package rules

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

func zoneA(n *corev1.Node)          { n.Labels["zone"] = "a" }
func wantZoneA(m *kaironv1.Machine) { m.Spec.NodeSelector = map[string]string{"zone": "a"} }

func infos(used map[string]Resources, nodes ...*corev1.Node) []*NodeInfo {
	var out []*NodeInfo
	for _, n := range nodes {
		info := NewNodeInfo(n)
		info.Requested = used[n.Name]
		out = append(out, info)
	}
	return out
}

func TestPickNode(t *testing.T) {
	const mi = int64(1) << 20
	tests := []struct {
		name     string
		nodes    []*NodeInfo
		machine  *kaironv1.Machine
		wantNode string
		wantWhy  string
	}{
		{
			name:    "no Kairon nodes",
			machine: rulestest.Machine("m", 1, "256Mi"),
			wantWhy: "no nodes labelled kairon.zyvor.dev/node: start kairon-node",
		},
		{
			name:     "the emptier node wins",
			nodes:    infos(map[string]Resources{"a": {CPU: 2, Memory: 512 * mi}}, rulestest.Node("a", 4, "1Gi"), rulestest.Node("b", 4, "1Gi")),
			machine:  rulestest.Machine("m", 1, "256Mi"),
			wantNode: "b",
		},
		{
			name:     "ties go to the first name",
			nodes:    infos(nil, rulestest.Node("b", 4, "1Gi"), rulestest.Node("a", 4, "1Gi")),
			machine:  rulestest.Machine("m", 1, "256Mi"),
			wantNode: "a",
		},
		{
			name: "free capacity is a fraction, so a big busy node beats a small empty one",
			nodes: infos(map[string]Resources{"big": {CPU: 8, Memory: 4096 * mi}},
				rulestest.Node("big", 32, "16Gi"), rulestest.Node("small", 2, "1Gi")),
			machine:  rulestest.Machine("m", 1, "256Mi"),
			wantNode: "big",
		},
		{
			name:     "cordoned and not ready nodes take nothing new",
			nodes:    infos(nil, rulestest.Node("a", 4, "1Gi", rulestest.Cordoned), rulestest.Node("b", 4, "1Gi", rulestest.NotReady), rulestest.Node("c", 1, "256Mi")),
			machine:  rulestest.Machine("m", 1, "256Mi"),
			wantNode: "c",
		},
		{
			name:     "nodeSelector",
			nodes:    infos(nil, rulestest.Node("a", 4, "1Gi"), rulestest.Node("b", 1, "256Mi", zoneA)),
			machine:  rulestest.Machine("m", 1, "256Mi", wantZoneA),
			wantNode: "b",
		},
		{
			name: "every reason, one node each",
			nodes: infos(map[string]Resources{"full": {CPU: 0, Memory: 896 * mi}},
				rulestest.Node("cordoned", 4, "1Gi", rulestest.Cordoned), rulestest.Node("elsewhere", 4, "1Gi"), rulestest.Node("full", 4, "1Gi", zoneA)),
			machine: rulestest.Machine("m", 1, "256Mi", wantZoneA),
			wantWhy: "0/3 nodes are available: 1 node is cordoned, 1 node does not match spec.nodeSelector, 1 node has insufficient memory (free 128Mi, need 256Mi)",
		},
		{
			name: "short of both CPU and memory counts for both, quoting the best node",
			nodes: infos(map[string]Resources{"a": {CPU: 3, Memory: 1024 * mi}, "b": {CPU: 4, Memory: 768 * mi}},
				rulestest.Node("a", 4, "1Gi"), rulestest.Node("b", 4, "1Gi"), rulestest.Node("c", 4, "1Gi", rulestest.NotReady)),
			machine: rulestest.Machine("m", 2, "512Mi"),
			wantWhy: "0/3 nodes are available: 1 node is not ready, 2 nodes have insufficient cpu (most free 1, need 2), 2 nodes have insufficient memory (most free 256Mi, need 512Mi)",
		},
		{
			name:    "a node without allocatable has no room",
			nodes:   infos(nil, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "bare"}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}}),
			machine: rulestest.Machine("m", 1, "256Mi"),
			wantWhy: "0/1 nodes are available: 1 node has insufficient cpu (free 0, need 1), 1 node has insufficient memory (free 0, need 256Mi)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, why := PickNode(tt.nodes, tt.machine)
			gotNode := ""
			if got != nil {
				gotNode = got.Node.Name
			}
			if gotNode != tt.wantNode || why != tt.wantWhy {
				t.Errorf("PickNode = %q, %q\nwant        %q, %q", gotNode, why, tt.wantNode, tt.wantWhy)
			}
		})
	}
}

func TestNodeScore(t *testing.T) {
	const gi = int64(1) << 30
	n := NewNodeInfo(rulestest.Node("a", 4, "4Gi"))
	n.Requested = Resources{CPU: 1, Memory: 1 * gi}
	// After a 1 vCPU, 1Gi Machine: half the CPU and half the memory are left.
	if got := nodeScore(n, rulestest.Machine("m", 1, "1Gi")); got != 0.5 {
		t.Errorf("nodeScore = %v, want 0.5", got)
	}
}

func TestNodeAllocatableRoundsCPUDown(t *testing.T) {
	n := rulestest.Node("a", 0, "1Gi")
	n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("3500m")
	if got := NodeAllocatable(n); got.CPU != 3 || got.Memory != 1<<30 {
		t.Errorf("NodeAllocatable = %+v, want 3 vCPUs and 1Gi", got)
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
		if got := FormatBytes(in); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", in, got, want)
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
		rulestest.Machine("c", 1, "256Mi", at(2)),
		rulestest.Machine("b", 1, "256Mi", at(1)),
		rulestest.Machine("a", 1, "256Mi", at(1)),
	}
	SortByAge(machines)
	if got := [3]string{machines[0].Name, machines[1].Name, machines[2].Name}; got != [3]string{"a", "b", "c"} {
		t.Errorf("order = %v, want [a b c]", got)
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
		rulestest.Machine("moving", 2, "1Gi", on("a", kaironv1.MachineRunning)),
		rulestest.Machine("switched", 1, "512Mi", on("b", kaironv1.MachineRunning)),
		rulestest.Machine("done", 1, "256Mi", on("a", kaironv1.MachineRunning)),
		rulestest.Machine("failed", 4, "4Gi", on("a", kaironv1.MachineFailed)),
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
			byName := map[string]*NodeInfo{}
			for _, n := range infos(nil, rulestest.Node("a", 8, "8Gi"), rulestest.Node("b", 8, "8Gi")) {
				byName[n.Node.Name] = n
			}
			ChargeNodes(byName, machines, tc.migrations)
			for node, want := range tc.wantCPU {
				if got := byName[node].Requested.CPU; got != want {
					t.Errorf("node %s: %d vCPUs requested, want %d", node, got, want)
				}
			}
		})
	}
}
