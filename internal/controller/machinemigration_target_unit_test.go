package controller

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

// Why a migration without spec.targetNode has nowhere to go names what is
// really missing: another node, or room on the others.
func TestPickTargetSaysWhyNoOtherNode(t *testing.T) {
	cordoned := func(n *corev1.Node) { n.Spec.Unschedulable = true }
	for _, tc := range []struct {
		name   string
		nodes  []client.Object
		want   string
		target string
	}{
		{
			name:  "the source is the only node",
			nodes: []client.Object{rulestest.Node("node-a", 4, "4Gi")},
			want:  "node node-a is the only Kairon node (label kairon.zyvor.dev/node); a migration needs another",
		},
		{
			name:  "the other node is cordoned",
			nodes: []client.Object{rulestest.Node("node-a", 4, "4Gi"), rulestest.Node("node-b", 4, "4Gi", cordoned)},
			want:  "no node other than node-a can take the Machine: 0/1 nodes are available: 1 node is cordoned",
		},
		{
			name:   "the other node fits",
			nodes:  []client.Object{rulestest.Node("node-a", 4, "4Gi"), rulestest.Node("node-b", 4, "4Gi")},
			target: "node-b",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			machine := rulestest.Machine("web", 1, "256Mi", rulestest.Placed("node-a", kaironv1.MachineRunning))
			api := fake.NewClientBuilder().WithScheme(testScheme(t)).WithIndex(&corev1.Pod{}, podNodeNameIndex, podNodeName).
				WithObjects(append(tc.nodes, machine)...).Build()
			r := &MachineMigrationReconciler{Client: api}
			mig := &kaironv1.MachineMigration{ObjectMeta: metav1.ObjectMeta{Namespace: machine.Namespace, Name: "move"}, Spec: kaironv1.MachineMigrationSpec{MachineName: "web"}}
			target, why, err := r.pickTarget(context.Background(), mig, machine)
			if err != nil {
				t.Fatal(err)
			}
			if target != tc.target || why != tc.want {
				t.Errorf("got target %q, why %q; want %q, %q", target, why, tc.target, tc.want)
			}
		})
	}
}
