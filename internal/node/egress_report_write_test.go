package node

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// The agent counts the other nodes' entries as its cache shows them; when
// that view was behind, the confinement policy refuses the count, and the
// agent reads the policy live and writes the true sum.
func TestWriteEgressEntryRecountsFromTheLivePolicy(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := kaironv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	live := &kaironv1.MachineNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "sandboxes", Generation: 2},
		Status: kaironv1.MachineNetworkPolicyStatus{Nodes: []kaironv1.PolicyEnforcement{
			{Node: "n2", Machines: []string{"vm-x", "vm-y", "vm-z"}, ObservedGeneration: 2},
		}},
	}
	stale := live.DeepCopy()
	stale.Status.Nodes = nil // the cache has yet to show n2's report
	want := kaironv1.PolicyEnforcement{Node: "n1", Machines: []string{"vm-a"}, ObservedGeneration: 2}

	for _, tc := range []struct {
		name       string
		view       *kaironv1.MachineNetworkPolicy // the agent's, from its cache
		refuse     func(count int) bool           // what the API server refuses
		wantCounts []int
		wantErr    bool
	}{
		{name: "a count from a view that was behind", view: stale, refuse: func(count int) bool { return count != 4 }, wantCounts: []int{1, 4}},
		{name: "a view that was up to date", view: live, refuse: func(count int) bool { return count != 4 }, wantCounts: []int{4}},
		{name: "refused whatever it writes", view: stale, refuse: func(int) bool { return true }, wantCounts: []int{1, 4, 4}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var counts []int
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(live.DeepCopy()).WithStatusSubresource(live).
				WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(_ context.Context, _ client.Client, sub string, obj client.Object, patch client.Patch, _ ...client.SubResourcePatchOption) error {
					body, err := patch.Data(obj)
					if err != nil {
						return err
					}
					var applied struct {
						Status struct {
							Machines int                          `json:"machines"`
							Nodes    []kaironv1.PolicyEnforcement `json:"nodes"`
						} `json:"status"`
					}
					if err := json.Unmarshal(body, &applied); err != nil {
						return err
					}
					if sub != "status" || len(applied.Status.Nodes) != 1 || applied.Status.Nodes[0].Node != "n1" {
						t.Errorf("wrote %s %s, want this node's entry of the status", sub, body)
					}
					counts = append(counts, applied.Status.Machines)
					if tc.refuse(applied.Status.Machines) {
						return apierrors.NewForbidden(schema.GroupResource{Group: kaironv1.GroupVersion.Group, Resource: "machinenetworkpolicies"}, obj.GetName(),
							errors.New("status.machines is not the number of Machines the entries list"))
					}
					return nil
				}}).Build()
			err := writeEgressEntry(context.Background(), c, c, tc.view, want, false)
			if (err != nil) != tc.wantErr || (err != nil && !apierrors.IsForbidden(err)) {
				t.Errorf("error %v, want an error: %v", err, tc.wantErr)
			}
			if !slices.Equal(counts, tc.wantCounts) {
				t.Errorf("wrote the counts %v, want %v", counts, tc.wantCounts)
			}
		})
	}
}
