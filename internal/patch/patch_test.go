package patch_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
)

// sent is one status patch as it went to the (fake) API server.
type sent struct {
	subresource string
	patchType   types.PatchType
	body        map[string]any
}

// newClient is a fake client with status subresources that records every
// status patch it is sent.
func newClient(t *testing.T, objs ...client.Object) (client.Client, *[]sent) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := kaironv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	var calls []sent
	c := fake.NewClientBuilder().
		WithScheme(scheme).
		WithStatusSubresource(&kaironv1.MachineClaim{}, &kaironv1.MachineSet{}).
		WithObjects(objs...).
		WithInterceptorFuncs(interceptor.Funcs{
			SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
				data, err := p.Data(obj)
				if err != nil {
					return err
				}
				body := map[string]any{}
				if err := json.Unmarshal(data, &body); err != nil {
					t.Fatalf("patch is not JSON: %s", data)
				}
				calls = append(calls, sent{subresource: sub, patchType: p.Type(), body: body})
				return c.SubResource(sub).Patch(ctx, obj, p, opts...)
			},
		}).
		Build()
	return c, &calls
}

func claim() *kaironv1.MachineClaim {
	return &kaironv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"},
		Status: kaironv1.MachineClaimStatus{
			Phase:        kaironv1.ClaimPending,
			Message:      "waiting",
			EgressPolicy: "c-egress",
		},
	}
}

func set() *kaironv1.MachineSet {
	return &kaironv1.MachineSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"},
		Status: kaironv1.MachineSetStatus{
			Replicas:      2,
			ReadyReplicas: 2,
			Selector:      "app=web",
			Conditions: []metav1.Condition{{
				Type: "Ready", Status: metav1.ConditionTrue, Reason: "AllReady",
				LastTransitionTime: metav1.Now(),
			}},
		},
	}
}

func TestStatus(t *testing.T) {
	type testCase struct {
		name string
		seed client.Object
		// edit computes after's status from before's.
		edit func(client.Object)
		// meddle runs between the read and the patch: another writer.
		meddle func(context.Context, client.Client, client.Object) error
		opts   []patch.Option
		// wantPatch is the patch body sent, "$RV" standing for before's
		// resourceVersion; "" means no call at all.
		wantPatch string
		wantErr   func(error) bool
		// check looks at the stored object afterwards.
		check func(*testing.T, client.Object)
	}

	writeMessage := func(msg string) func(context.Context, client.Client, client.Object) error {
		return func(ctx context.Context, c client.Client, o client.Object) error {
			other := o.DeepCopyObject().(*kaironv1.MachineClaim)
			other.Status.Message = msg
			return c.Status().Update(ctx, other)
		}
	}
	deleteIt := func(ctx context.Context, c client.Client, o client.Object) error {
		return c.Delete(ctx, o.DeepCopyObject().(client.Object))
	}
	claimMessage := func(want string) func(*testing.T, client.Object) {
		return func(t *testing.T, o client.Object) {
			if got := o.(*kaironv1.MachineClaim).Status.Message; got != want {
				t.Errorf("stored message = %q, want %q", got, want)
			}
		}
	}

	cases := []testCase{
		{
			name: "unchanged: no call",
			seed: claim(),
			edit: func(client.Object) {},
		},
		{
			name: "unchanged with every option: no call",
			seed: set(),
			edit: func(o client.Object) {
				// A new but equal condition list is no change.
				s := o.(*kaironv1.MachineSet)
				s.Status.Conditions = append([]metav1.Condition(nil), s.Status.Conditions...)
			},
			opts: []patch.Option{patch.WithOptimisticLock(), patch.WholeStatus(), patch.IgnoreNotFound()},
		},
		{
			name: "unchanged status, changed spec: no call",
			seed: set(),
			edit: func(o client.Object) { r := int32(7); o.(*kaironv1.MachineSet).Spec.Replicas = &r },
		},
		{
			name:      "diff: only what changed",
			seed:      claim(),
			edit:      func(o client.Object) { o.(*kaironv1.MachineClaim).Status.Message = "still waiting" },
			wantPatch: `{"status":{"message":"still waiting"}}`,
			check:     claimMessage("still waiting"),
		},
		{
			name:      "diff: a cleared field is sent as null",
			seed:      claim(),
			edit:      func(o client.Object) { o.(*kaironv1.MachineClaim).Status.EgressPolicy = "" },
			wantPatch: `{"status":{"egressPolicy":null}}`,
			check: func(t *testing.T, o client.Object) {
				if got := o.(*kaironv1.MachineClaim).Status.EgressPolicy; got != "" {
					t.Errorf("stored egressPolicy = %q, want it cleared", got)
				}
			},
		},
		{
			name:      "diff without lock: a stale copy still writes",
			seed:      claim(),
			edit:      func(o client.Object) { o.(*kaironv1.MachineClaim).Status.Phase = kaironv1.ClaimBound },
			meddle:    writeMessage("edited meanwhile"),
			wantPatch: `{"status":{"phase":"Bound"}}`,
			check:     claimMessage("edited meanwhile"),
		},
		{
			name:      "optimistic lock: resourceVersion in the patch",
			seed:      claim(),
			edit:      func(o client.Object) { o.(*kaironv1.MachineClaim).Status.Phase = kaironv1.ClaimBound },
			opts:      []patch.Option{patch.WithOptimisticLock()},
			wantPatch: `{"metadata":{"resourceVersion":"$RV"},"status":{"phase":"Bound"}}`,
			check: func(t *testing.T, o client.Object) {
				if got := o.(*kaironv1.MachineClaim).Status.Phase; got != kaironv1.ClaimBound {
					t.Errorf("stored phase = %q, want Bound", got)
				}
			},
		},
		{
			name:      "optimistic lock: a stale copy gets a Conflict",
			seed:      claim(),
			edit:      func(o client.Object) { o.(*kaironv1.MachineClaim).Status.Phase = kaironv1.ClaimBound },
			meddle:    writeMessage("edited meanwhile"),
			opts:      []patch.Option{patch.WithOptimisticLock()},
			wantPatch: `{"metadata":{"resourceVersion":"$RV"},"status":{"phase":"Bound"}}`,
			wantErr:   apierrors.IsConflict,
			check: func(t *testing.T, o client.Object) {
				c := o.(*kaironv1.MachineClaim)
				if c.Status.Phase != kaironv1.ClaimPending || c.Status.Message != "edited meanwhile" {
					t.Errorf("stored status = %+v, want the other writer's", c.Status)
				}
			},
		},
		{
			name: "whole status: everything sent, cleared fields as null",
			seed: set(),
			edit: func(o client.Object) {
				s := o.(*kaironv1.MachineSet)
				s.Status.ReadyReplicas = 0
				s.Status.Selector = ""
				s.Status.Conditions = nil
			},
			opts:      []patch.Option{patch.WholeStatus()},
			wantPatch: `{"status":{"replicas":2,"readyReplicas":0,"selector":null,"conditions":null}}`,
			check: func(t *testing.T, o client.Object) {
				s := o.(*kaironv1.MachineSet).Status
				if s.Replicas != 2 || s.ReadyReplicas != 0 || s.Selector != "" || s.Conditions != nil {
					t.Errorf("stored status = %+v, want replicas 2 and the rest cleared", s)
				}
			},
		},
		{
			name:      "whole status: zero counts are sent, where a diff leaves them out",
			seed:      &kaironv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}},
			edit:      func(o client.Object) { o.(*kaironv1.MachineSet).Status.ObservedGeneration = 1 },
			opts:      []patch.Option{patch.WholeStatus()},
			wantPatch: `{"status":{"replicas":0,"readyReplicas":0,"observedGeneration":1}}`,
		},
		{
			name:      "diff: zero counts left out",
			seed:      &kaironv1.MachineSet{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "s"}},
			edit:      func(o client.Object) { o.(*kaironv1.MachineSet).Status.ObservedGeneration = 1 },
			wantPatch: `{"status":{"observedGeneration":1}}`,
		},
		{
			name: "whole status with lock: a stale copy gets a Conflict",
			seed: set(),
			edit: func(o client.Object) { o.(*kaironv1.MachineSet).Status.ReadyReplicas = 1 },
			meddle: func(ctx context.Context, c client.Client, o client.Object) error {
				other := o.DeepCopyObject().(*kaironv1.MachineSet)
				other.Status.Replicas = 3
				return c.Status().Update(ctx, other)
			},
			opts: []patch.Option{patch.WholeStatus(), patch.WithOptimisticLock()},
			wantPatch: `{"metadata":{"resourceVersion":"$RV"},"status":{"replicas":2,"readyReplicas":1,"selector":"app=web",` +
				`"conditions":[{"type":"Ready","status":"True","reason":"AllReady","message":"","lastTransitionTime":"$LTT"}]}}`,
			wantErr: apierrors.IsConflict,
			check: func(t *testing.T, o client.Object) {
				if s := o.(*kaironv1.MachineSet).Status; s.Replicas != 3 || s.ReadyReplicas != 2 {
					t.Errorf("stored status = %+v, want the other writer's", s)
				}
			},
		},
		{
			name:      "IgnoreNotFound: a deleted object is no error",
			seed:      claim(),
			edit:      func(o client.Object) { o.(*kaironv1.MachineClaim).Status.Message = "too late" },
			meddle:    deleteIt,
			opts:      []patch.Option{patch.IgnoreNotFound()},
			wantPatch: `{"status":{"message":"too late"}}`,
		},
		{
			name:      "without IgnoreNotFound: a deleted object is NotFound",
			seed:      claim(),
			edit:      func(o client.Object) { o.(*kaironv1.MachineClaim).Status.Message = "too late" },
			meddle:    deleteIt,
			wantPatch: `{"status":{"message":"too late"}}`,
			wantErr:   apierrors.IsNotFound,
		},
		{
			name:      "IgnoreNotFound keeps other errors",
			seed:      claim(),
			edit:      func(o client.Object) { o.(*kaironv1.MachineClaim).Status.Message = "stale" },
			meddle:    writeMessage("edited meanwhile"),
			opts:      []patch.Option{patch.IgnoreNotFound(), patch.WithOptimisticLock()},
			wantPatch: `{"metadata":{"resourceVersion":"$RV"},"status":{"message":"stale"}}`,
			wantErr:   apierrors.IsConflict,
		},
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c, calls := newClient(t, tc.seed)
			before := tc.seed.DeepCopyObject().(client.Object)
			if err := c.Get(ctx, client.ObjectKeyFromObject(tc.seed), before); err != nil {
				t.Fatal(err)
			}
			after := before.DeepCopyObject().(client.Object)
			tc.edit(after)
			if tc.meddle != nil {
				if err := tc.meddle(ctx, c, before); err != nil {
					t.Fatal(err)
				}
			}

			err := patch.Status(ctx, c, before, after, tc.opts...)

			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("Status: %v", err)
			case tc.wantErr != nil && !tc.wantErr(err):
				t.Fatalf("Status: got error %v, not the one expected", err)
			}
			if tc.wantPatch == "" {
				if len(*calls) != 0 {
					t.Fatalf("want no call, got %d: %+v", len(*calls), *calls)
				}
				return
			}
			if len(*calls) != 1 {
				t.Fatalf("want one call, got %d: %+v", len(*calls), *calls)
			}
			call := (*calls)[0]
			if call.subresource != "status" || call.patchType != types.MergePatchType {
				t.Errorf("sent a %s patch to %q, want a merge patch to status", call.patchType, call.subresource)
			}
			want := map[string]any{}
			wantJSON := strings.ReplaceAll(tc.wantPatch, "$RV", before.GetResourceVersion())
			if s, ok := before.(*kaironv1.MachineSet); ok && len(s.Status.Conditions) > 0 {
				ltt, _ := s.Status.Conditions[0].LastTransitionTime.MarshalJSON()
				wantJSON = strings.ReplaceAll(wantJSON, `"$LTT"`, string(ltt))
			}
			if err := json.Unmarshal([]byte(wantJSON), &want); err != nil {
				t.Fatalf("bad wantPatch %s: %v", wantJSON, err)
			}
			if !reflect.DeepEqual(call.body, want) {
				got, _ := json.Marshal(call.body)
				t.Errorf("patch sent:\n %s\nwant:\n %s", got, wantJSON)
			}
			if err == nil && !apierrors.IsNotFound(c.Get(ctx, client.ObjectKeyFromObject(before), before.DeepCopyObject().(client.Object))) {
				if after.GetResourceVersion() == before.GetResourceVersion() {
					t.Errorf("after keeps resourceVersion %s; want the server's new one", after.GetResourceVersion())
				}
			}
			if tc.check != nil {
				stored := before.DeepCopyObject().(client.Object)
				if err := c.Get(ctx, client.ObjectKeyFromObject(before), stored); err != nil {
					t.Fatal(err)
				}
				tc.check(t, stored)
			}
		})
	}
}

func TestStatusRefusesWhatItCannotCompare(t *testing.T) {
	ctx := context.Background()
	c, calls := newClient(t)
	cases := []struct {
		name          string
		before, after client.Object
	}{
		{"different kinds", claim(), set()},
		{"no status field", &corev1.ConfigMap{}, &corev1.ConfigMap{Data: map[string]string{"a": "b"}}},
		{"nil", claim(), (*kaironv1.MachineClaim)(nil)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := patch.Status(ctx, c, tc.before, tc.after); err == nil {
				t.Error("Status: want an error")
			}
		})
	}
	if len(*calls) != 0 {
		t.Errorf("want no call, got %+v", *calls)
	}
}

func TestWholeStatusLockNeedsResourceVersion(t *testing.T) {
	c, calls := newClient(t)
	before := set()
	after := before.DeepCopy()
	after.Status.ReadyReplicas = 0
	err := patch.Status(context.Background(), c, before, after, patch.WholeStatus(), patch.WithOptimisticLock())
	if err == nil || len(*calls) != 0 {
		t.Errorf("Status: err %v after %d calls; want an error and no call", err, len(*calls))
	}
}
