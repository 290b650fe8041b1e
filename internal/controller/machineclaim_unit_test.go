package controller

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestWaitReason(t *testing.T) {
	key := types.NamespacedName{Namespace: "team", Name: "agents"}
	pool := &kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "agents"}}
	deleting := pool.DeepCopy()
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	tests := []struct {
		name        string
		pass        *bindingPass
		wantReason  string
		wantMessage string
	}{
		{"no such pool", &bindingPass{key: key, warming: 2},
			kaironv1.ClaimReasonPoolNotFound, `MachinePool "agents" not found in namespace "team"`},
		{"pool being deleted, whatever is warming", &bindingPass{key: key, pool: deleting, warming: 2},
			kaironv1.ClaimReasonPoolDeleting, `MachinePool "agents" is being deleted`},
		{"nothing warming", &bindingPass{key: key, pool: pool},
			kaironv1.ClaimReasonWaitingForWarmMachine, `no Running warm machine in pool "agents" (0 warming)`},
		{"members on their way up", &bindingPass{key: key, pool: pool, warming: 3},
			kaironv1.ClaimReasonWaitingForWarmMachine, `no Running warm machine in pool "agents" (3 warming)`},
	}
	for _, tt := range tests {
		reason, message := waitReason(tt.pass)
		if reason != tt.wantReason || message != tt.wantMessage {
			t.Errorf("%s: waitReason = %s, %q; want %s, %q", tt.name, reason, message, tt.wantReason, tt.wantMessage)
		}
	}
}

func TestBoundStatus(t *testing.T) {
	boundAt := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	pending := kaironv1.MachineClaimStatus{
		Phase: kaironv1.ClaimPending, Message: `no Running warm machine in pool "agents" (1 warming)`, ObservedGeneration: 1,
		Conditions: []metav1.Condition{condition(kaironv1.ConditionReady, metav1.ConditionFalse,
			kaironv1.ClaimReasonWaitingForWarmMachine, `no Running warm machine in pool "agents" (1 warming)`, 1)},
	}
	tests := []struct {
		name     string
		status   kaironv1.MachineClaimStatus
		policy   string
		bindTime time.Duration
		want     kaironv1.MachineClaimStatus
	}{
		{
			name: "from Pending, with an egress policy", status: pending, policy: "claim-egress-job", bindTime: 1500 * time.Millisecond,
			want: kaironv1.MachineClaimStatus{
				Phase: kaironv1.ClaimBound, MachineName: "agents-1", BoundAt: ptr.To(metav1.NewTime(boundAt)), BindMillis: 1500,
				EgressPolicy: "claim-egress-job", ObservedGeneration: 3,
				Conditions: []metav1.Condition{condition(kaironv1.ConditionReady, metav1.ConditionTrue, kaironv1.ClaimReasonBound, "Bound to machine agents-1", 3)},
			},
		},
		{
			name: "a stale egress policy name goes; milliseconds are truncated", status: kaironv1.MachineClaimStatus{EgressPolicy: "claim-egress-old"},
			bindTime: 2999 * time.Microsecond,
			want: kaironv1.MachineClaimStatus{
				Phase: kaironv1.ClaimBound, MachineName: "agents-1", BoundAt: ptr.To(metav1.NewTime(boundAt)), BindMillis: 2, ObservedGeneration: 3,
				Conditions: []metav1.Condition{condition(kaironv1.ConditionReady, metav1.ConditionTrue, kaironv1.ClaimReasonBound, "Bound to machine agents-1", 3)},
			},
		},
		{
			name: "a negative bind time (clocks that disagree) is 0", status: pending, bindTime: -40 * time.Millisecond,
			want: kaironv1.MachineClaimStatus{
				Phase: kaironv1.ClaimBound, MachineName: "agents-1", BoundAt: ptr.To(metav1.NewTime(boundAt)), BindMillis: 0, ObservedGeneration: 3,
				Conditions: []metav1.Condition{condition(kaironv1.ConditionReady, metav1.ConditionTrue, kaironv1.ClaimReasonBound, "Bound to machine agents-1", 3)},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			claim := &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "job", Generation: 3}, Status: *tt.status.DeepCopy()}
			got := boundStatus(claim, "agents-1", tt.policy, boundAt, tt.bindTime)
			gotCmp := got.DeepCopy()
			gotCmp.Conditions = withoutTransitionTimes(got.Conditions)
			if !equality.Semantic.DeepEqual(gotCmp, &tt.want) {
				t.Errorf("boundStatus\n%s\nwant\n%s", fmtJSON(gotCmp), fmtJSON(tt.want))
			}
			if !equality.Semantic.DeepEqual(claim.Status, tt.status) {
				t.Errorf("the claim's own status changed: %s", fmtJSON(claim.Status))
			}
		})
	}
}

func TestInvalidClaimLabels(t *testing.T) {
	const prefix = "spec.labels cannot be put on a Machine: "
	// The words for a bad key or value are the API machinery's.
	badKey := validation.IsQualifiedName("a b")
	badValue := validation.IsValidLabelValue("not ok")
	longValue := validation.IsValidLabelValue(strings.Repeat("x", 64))
	if len(badKey) != 1 || len(badValue) != 1 || len(longValue) != 1 {
		t.Fatalf("expected one complaint each, got %q, %q, %q", badKey, badValue, longValue)
	}
	tests := []struct {
		name   string
		labels map[string]string
		want   string
	}{
		{"none", nil, ""},
		{"plain and prefixed keys", map[string]string{"team": "ml", "example.com/tier": "gpu", "empty": ""}, ""},
		{"Kairon's own prefix", map[string]string{kaironv1.LabelPoolState: kaironv1.PoolStateWarm},
			prefix + kaironv1.LabelPoolState + ": the kairon.zyvor.dev/ labels are Kairon's own"},
		{"a reserved key is refused for that alone, whatever its value", map[string]string{"kairon.zyvor.dev/x": "not ok"},
			prefix + "kairon.zyvor.dev/x: the kairon.zyvor.dev/ labels are Kairon's own"},
		{"a bad key", map[string]string{"a b": "v"}, prefix + "a b: " + badKey[0]},
		{"a bad value", map[string]string{"team": "not ok"}, prefix + "team=not ok: " + badValue[0]},
		{"a value too long", map[string]string{"team": strings.Repeat("x", 64)}, prefix + "team=" + strings.Repeat("x", 64) + ": " + longValue[0]},
		{"every problem, in key order", map[string]string{"z": "fine", "team": "not ok", "a b": "v", "kairon.zyvor.dev/claim": "x"},
			prefix + "a b: " + badKey[0] + "; kairon.zyvor.dev/claim: the kairon.zyvor.dev/ labels are Kairon's own; team=not ok: " + badValue[0]},
	}
	for _, tt := range tests {
		if got := invalidClaimLabels(tt.labels); got != tt.want {
			t.Errorf("%s: invalidClaimLabels(%v) =\n%q\nwant\n%q", tt.name, tt.labels, got, tt.want)
		}
	}
}
