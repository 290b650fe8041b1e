package rules

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

// liveNode is a Kairon node whose agent runs backend with acceleration and,
// when endpoint is not empty, advertises that migration endpoint.
func liveNode(name, backend, acceleration, endpoint string, mutate ...func(*corev1.Node)) *corev1.Node {
	return rulestest.Node(name, 4, "4Gi", append([]func(*corev1.Node){func(n *corev1.Node) {
		n.Labels[kaironv1.LabelNodeBackend] = backend
		n.Labels[kaironv1.LabelNodeAcceleration] = acceleration
		if endpoint != "" {
			n.Annotations = map[string]string{kaironv1.AnnotationNodeMigrationEndpoint: endpoint}
		}
	}}, mutate...)...)
}

func TestChooseEvacuationStrategy(t *testing.T) {
	running := rulestest.Machine("web-1", 1, "256Mi", rulestest.Placed("src", kaironv1.MachineRunning))
	src := liveNode("src", "qemu", "kvm", "10.0.0.1:10251", rulestest.Cordoned)
	tests := []struct {
		name        string
		machine     *kaironv1.Machine
		source      *corev1.Node
		targets     []*corev1.Node
		used        map[string]Resources
		want        kaironv1.MigrationStrategy
		wantTarget  string
		wantReason  string
		wantMessage []string
	}{
		{
			name: "both nodes can: live, pinned to the target", machine: running, source: src,
			targets: []*corev1.Node{liveNode("dst", "qemu", "kvm", "10.0.0.2:10251")},
			want:    kaironv1.MigrationLive, wantTarget: "dst", wantReason: kaironv1.StrategyReasonLive,
			wantMessage: []string{"live: machine web-1 runs, node src sends it and node dst receives it live (backend qemu, acceleration kvm, migration endpoint 10.0.0.2:10251)"},
		},
		{
			name: "an endpoint with an empty host (the InternalIP) counts", machine: running, source: src,
			targets: []*corev1.Node{liveNode("dst", "qemu", "kvm", ":10251")},
			want:    kaironv1.MigrationLive, wantTarget: "dst", wantReason: kaironv1.StrategyReasonLive,
		},
		{
			name: "the target has no migration listener: cold", machine: running, source: src,
			targets: []*corev1.Node{liveNode("dst", "qemu", "kvm", "")},
			want:    kaironv1.MigrationCold, wantReason: kaironv1.StrategyReasonTargetCannotReceiveLive,
			wantMessage: []string{"cold: no node that can take machine web-1 can receive it live from node src: dst has no migration endpoint",
				"no --migration-listen"},
		},
		{
			name: "a malformed endpoint is none", machine: running, source: src,
			targets: []*corev1.Node{liveNode("dst", "qemu", "kvm", "10.0.0.2")},
			want:    kaironv1.MigrationCold, wantReason: kaironv1.StrategyReasonTargetCannotReceiveLive,
		},
		{
			name: "another acceleration: cold", machine: running, source: src,
			targets: []*corev1.Node{liveNode("dst", "qemu", "tcg", "10.0.0.2:10251")},
			want:    kaironv1.MigrationCold, wantReason: kaironv1.StrategyReasonTargetCannotReceiveLive,
			wantMessage: []string{`dst has acceleration "tcg", not "kvm"`},
		},
		{
			name: "another backend: cold", machine: running, source: src,
			targets: []*corev1.Node{liveNode("dst", "sim", "sim", "10.0.0.2:10251")},
			want:    kaironv1.MigrationCold, wantReason: kaironv1.StrategyReasonTargetCannotReceiveLive,
			wantMessage: []string{`dst has backend "sim", not "qemu"`},
		},
		{
			name: "a node that can receive live wins over the scheduler's first choice that cannot", machine: running, source: src,
			targets: []*corev1.Node{liveNode("emptier", "qemu", "kvm", ""), liveNode("busier", "qemu", "kvm", "10.0.0.3:10251")},
			used:    map[string]Resources{"busier": {CPU: 2}},
			want:    kaironv1.MigrationLive, wantTarget: "busier", wantReason: kaironv1.StrategyReasonLive,
		},
		{
			name: "of the nodes that can receive live, the scheduler's choice", machine: running, source: src,
			targets: []*corev1.Node{liveNode("busier", "qemu", "kvm", "10.0.0.3:10251"), liveNode("emptier", "qemu", "kvm", "10.0.0.4:10251")},
			used:    map[string]Resources{"busier": {CPU: 2}},
			want:    kaironv1.MigrationLive, wantTarget: "emptier", wantReason: kaironv1.StrategyReasonLive,
		},
		{
			name: "the node that could receive it live is full: cold, saying so", machine: running, source: src,
			targets: []*corev1.Node{liveNode("full", "qemu", "kvm", "10.0.0.3:10251"), liveNode("roomy", "qemu", "kvm", "")},
			used:    map[string]Resources{"full": {CPU: 4}},
			want:    kaironv1.MigrationCold, wantReason: kaironv1.StrategyReasonTargetCannotReceiveLive,
			wantMessage: []string{"roomy has no migration endpoint", "the nodes that could receive it live cannot take it"},
		},
		{
			name: "cordoned nodes without an endpoint are not blamed", machine: running, source: src,
			targets: []*corev1.Node{liveNode("cordoned", "qemu", "kvm", "", rulestest.Cordoned)},
			want:    kaironv1.MigrationCold, wantReason: kaironv1.StrategyReasonTargetCannotReceiveLive,
			wantMessage: []string{"cold: no other Kairon node can take machine web-1"},
		},
		{
			name: "no other node: cold", machine: running, source: src,
			want: kaironv1.MigrationCold, wantReason: kaironv1.StrategyReasonTargetCannotReceiveLive,
		},
		{
			name: "a Machine that is not Running: cold", source: src,
			machine: rulestest.Machine("web-1", 1, "256Mi", rulestest.Placed("src", kaironv1.MachineStopped)),
			targets: []*corev1.Node{liveNode("dst", "qemu", "kvm", "10.0.0.2:10251")},
			want:    kaironv1.MigrationCold, wantReason: kaironv1.StrategyReasonMachineNotLive,
			wantMessage: []string{"machine web-1 is Stopped, not Running"},
		},
		{
			name: "a source whose backend cannot send live: cold", machine: running,
			source:  liveNode("src", "firecracker", "kvm", "10.0.0.1:10251"),
			targets: []*corev1.Node{liveNode("dst", "firecracker", "kvm", "10.0.0.2:10251")},
			want:    kaironv1.MigrationCold, wantReason: kaironv1.StrategyReasonSourceCannotSendLive,
			wantMessage: []string{`node src has backend "firecracker", which cannot send a live migration`},
		},
		{
			name: "the source Node is gone: cold", machine: running,
			targets: []*corev1.Node{liveNode("dst", "qemu", "kvm", "10.0.0.2:10251")},
			want:    kaironv1.MigrationCold, wantReason: kaironv1.StrategyReasonSourceCannotSendLive,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ChooseEvacuationStrategy(tt.machine, tt.source, infos(tt.used, tt.targets...))
			if got.Strategy != tt.want || got.TargetNode != tt.wantTarget || got.Reason != tt.wantReason {
				t.Errorf("got %s to %q (%s), want %s to %q (%s); message %q", got.Strategy, got.TargetNode, got.Reason,
					tt.want, tt.wantTarget, tt.wantReason, got.Message)
			}
			if !strings.HasPrefix(got.Message, string(tt.want)+": ") {
				t.Errorf("message %q does not begin with the strategy", got.Message)
			}
			for _, want := range tt.wantMessage {
				if !strings.Contains(got.Message, want) {
					t.Errorf("message %q lacks %q", got.Message, want)
				}
			}
		})
	}
}

// The choice travels on the migration: spec.strategy and spec.targetNode,
// and the annotations kairon-controller writes as the condition.
func TestApplyStrategyChoice(t *testing.T) {
	m := rulestest.Machine("web-1", 1, "256Mi", rulestest.Placed("src", kaironv1.MachineRunning))
	mig := NewEvacuationMigration(m, "src", kaironv1.MigrationCold)
	ApplyStrategyChoice(mig, StrategyChoice{Strategy: kaironv1.MigrationLive, TargetNode: "dst", Reason: kaironv1.StrategyReasonLive, Message: "live: why"})
	if mig.Spec.Strategy != kaironv1.MigrationLive || mig.Spec.TargetNode != "dst" ||
		mig.Annotations[kaironv1.AnnotationMigrationRequestedStrategy] != "auto" ||
		mig.Annotations[kaironv1.AnnotationMigrationStrategyReason] != kaironv1.StrategyReasonLive ||
		mig.Annotations[kaironv1.AnnotationMigrationStrategyMessage] != "live: why" || mig.Labels[kaironv1.LabelEvacuatedNode] != "src" {
		t.Errorf("migration %+v %+v", mig.ObjectMeta, mig.Spec)
	}
}
