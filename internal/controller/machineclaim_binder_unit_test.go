package controller

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func conflictOn(resource, name string) error {
	return apierrors.NewConflict(schema.GroupResource{Group: kaironv1.GroupVersion.Group, Resource: resource}, name,
		errors.New("the object has been modified; please apply your changes to the latest version and try again"))
}

// faults builds a case's interceptors; w is the fake API server itself,
// for a fault that stands for another writer getting there first.
type faults func(t *testing.T) interceptor.Funcs

// failPatch fails the first n patches (not status) of the object of kind T
// named name, or of every such object if name is "", with err.
func failPatch[T client.Object](name string, n int, err error) faults {
	return func(*testing.T) interceptor.Funcs {
		left := n
		return interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(T); ok && (name == "" || obj.GetName() == name) && left != 0 {
				left--
				return err
			}
			return c.Patch(ctx, obj, patch, opts...)
		}}
	}
}

// beforeClaimStatus runs meddle (another writer) before the first status
// write to the claim, and fails that write with err if err is not nil.
func beforeClaimStatus(meddle func(context.Context, client.Client) error, err error) faults {
	return func(t *testing.T) interceptor.Funcs {
		done := false
		return interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, obj client.Object, patch client.Patch, opts ...client.SubResourcePatchOption) error {
			if _, ok := obj.(*kaironv1.MachineClaim); ok && !done {
				done = true
				if meddle != nil {
					if err := meddle(ctx, c); err != nil {
						t.Fatalf("the other writer: %v", err)
					}
				}
				if err != nil {
					return err
				}
			}
			return c.SubResource(sub).Patch(ctx, obj, patch, opts...)
		}}
	}
}

// otherBinder binds the claim "job" to member, as a binder in another
// kairon-controller replica would: the member's labels, then the claim's
// status.
func otherBinder(member string) func(context.Context, client.Client) error {
	return func(ctx context.Context, c client.Client) error {
		var claim kaironv1.MachineClaim
		if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: "job"}, &claim); err != nil {
			return err
		}
		if member != "elsewhere" { // a Machine outside the pool
			var m kaironv1.Machine
			if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: member}, &m); err != nil {
				return err
			}
			for k, v := range claim.Spec.Labels {
				m.Labels[k] = v
			}
			m.Labels[kaironv1.LabelPoolState] = kaironv1.PoolStateClaimed
			m.Labels[kaironv1.LabelMachineClaim] = "job"
			m.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(&claim, machineClaimKind)}
			if err := c.Update(ctx, &m); err != nil {
				return err
			}
		}
		claim.Status = *boundStatus(&claim, member, "", time.Now(), time.Second)
		return c.Status().Update(ctx, &claim)
	}
}

// The binder's branches, one pass each over a pool of three Running warm
// members (oldest, middle, newest) and one claim, "job", with the fake API
// server failing as each case says.
func TestMachineClaimBinderBranches(t *testing.T) {
	internal := apierrors.NewInternalError(errors.New("etcd is away"))
	refused := apierrors.NewInvalid(schema.GroupKind{Group: kaironv1.GroupVersion.Group, Kind: "Machine"}, "oldest",
		field.ErrorList{field.Invalid(field.NewPath("metadata", "labels"), "x", "refused by a policy")})
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: kaironv1.GroupVersion.Group, Resource: "machinenetworkpolicies"},
		"claim-egress-job", errors.New("a policy says no"))
	event := func(typ, reason, note string) string { return "^" + regexp.QuoteMeta(typ+" "+reason+" "+note) + "$" }
	boundEvent := func(machine string) string {
		return "^" + regexp.QuoteMeta(corev1.EventTypeNormal+" "+kaironv1.ClaimReasonBound+" Bound to machine "+machine+" in ") + `\d+ms$`
	}
	returned := event(corev1.EventTypeNormal, kaironv1.EventReasonReturnedToPool, "Returned to pool agents: claim job did not keep it")
	const (
		warm         = "warm//MachinePool"
		claimedByJob = "claimed/job/MachineClaim"
	)
	type claimWant struct {
		phase                    kaironv1.MachineClaimPhase
		machine, reason, message string
		finalizer                bool
	}
	tests := []struct {
		name       string
		claim      func(*kaironv1.MachineClaim)
		members    kaironv1.MachinePhase // the members' phase; Running if empty
		member     func(i int, m *kaironv1.Machine)
		noPool     bool
		faults     faults
		wantErr    string // a part of the pass's error; none if empty
		wantResult reconcile.Result
		wantClaim  claimWant
		// each member's pool state, claim label and controller kind
		wantMembers   [3]string
		wantConflicts float64
		wantEvents    []string // patterns
		// no egress policy may be left, though the bind created one
		wantNoPolicy bool
	}{
		{
			name:        "binds the oldest member",
			wantResult:  reconcile.Result{RequeueAfter: time.Minute},
			wantClaim:   claimWant{kaironv1.ClaimBound, "oldest", kaironv1.ClaimReasonBound, "Bound to machine oldest", true},
			wantMembers: [3]string{claimedByJob, warm, warm},
			wantEvents:  []string{boundEvent("oldest")},
		},
		{
			name:        "the oldest changed since listed (409): the next one, counted",
			faults:      failPatch[*kaironv1.Machine]("oldest", 1, conflictOn("machines", "oldest")),
			wantResult:  reconcile.Result{RequeueAfter: time.Minute},
			wantClaim:   claimWant{kaironv1.ClaimBound, "middle", kaironv1.ClaimReasonBound, "Bound to machine middle", true},
			wantMembers: [3]string{warm, claimedByJob, warm}, wantConflicts: 1,
			wantEvents: []string{boundEvent("middle")},
		},
		{
			name:        "the oldest is gone (404): the next one, not counted as a conflict",
			faults:      failPatch[*kaironv1.Machine]("oldest", 1, apierrors.NewNotFound(schema.GroupResource{Group: kaironv1.GroupVersion.Group, Resource: "machines"}, "oldest")),
			wantResult:  reconcile.Result{RequeueAfter: time.Minute},
			wantClaim:   claimWant{kaironv1.ClaimBound, "middle", kaironv1.ClaimReasonBound, "Bound to machine middle", true},
			wantMembers: [3]string{warm, claimedByJob, warm},
			wantEvents:  []string{boundEvent("middle")},
		},
		{
			// The claim waits for the events that changed the members, and
			// says so: its Pending status is written on the claim as the
			// finalizer write left it, not on the older listed copy (which
			// would conflict and leave the claim without a word).
			name:       "every member changed since listed: each tried, none bound, the claim says it waits",
			faults:     failPatch[*kaironv1.Machine]("", -1, conflictOn("machines", "any")),
			wantResult: reconcile.Result{RequeueAfter: time.Minute},
			wantClaim: claimWant{kaironv1.ClaimPending, "", kaironv1.ClaimReasonWaitingForWarmMachine,
				`no Running warm machine in pool "agents" (0 warming)`, true},
			wantMembers: [3]string{warm, warm, warm}, wantConflicts: 3,
		},
		{
			name:       "the Machine refuses the labels (422): Pending, and the member stays for the next claim",
			faults:     failPatch[*kaironv1.Machine]("oldest", 1, refused),
			wantResult: reconcile.Result{RequeueAfter: time.Minute},
			wantClaim: claimWant{kaironv1.ClaimPending, "", kaironv1.ClaimReasonInvalidLabels,
				"spec.labels cannot be put on a Machine: " + refused.Error(), true},
			wantMembers: [3]string{warm, warm, warm},
			wantEvents: []string{event(corev1.EventTypeWarning, kaironv1.ClaimReasonInvalidLabels,
				"spec.labels cannot be put on a Machine: "+refused.Error())},
		},
		{
			name: "Kairon's own labels: refused before anything is written",
			claim: func(c *kaironv1.MachineClaim) {
				c.Spec.Labels = map[string]string{kaironv1.LabelPoolState: kaironv1.PoolStateWarm}
			},
			wantResult: reconcile.Result{RequeueAfter: time.Minute},
			wantClaim: claimWant{kaironv1.ClaimPending, "", kaironv1.ClaimReasonInvalidLabels,
				"spec.labels cannot be put on a Machine: kairon.zyvor.dev/pool-state: the kairon.zyvor.dev/ labels are Kairon's own", false},
			wantMembers: [3]string{warm, warm, warm},
			wantEvents: []string{event(corev1.EventTypeWarning, kaironv1.ClaimReasonInvalidLabels,
				"spec.labels cannot be put on a Machine: kairon.zyvor.dev/pool-state: the kairon.zyvor.dev/ labels are Kairon's own")},
		},
		{
			name:        "taking the member fails otherwise: the pass fails and is retried",
			faults:      failPatch[*kaironv1.Machine]("oldest", 1, internal),
			wantErr:     "claim team/job: " + internal.Error(),
			wantClaim:   claimWant{finalizer: true},
			wantMembers: [3]string{warm, warm, warm},
		},
		{
			name:        "the finalizer write conflicts with our own Pending write: read again, and bound",
			faults:      failPatch[*kaironv1.MachineClaim]("job", 1, conflictOn("machineclaims", "job")),
			wantResult:  reconcile.Result{RequeueAfter: time.Minute},
			wantClaim:   claimWant{kaironv1.ClaimBound, "oldest", kaironv1.ClaimReasonBound, "Bound to machine oldest", true},
			wantMembers: [3]string{claimedByJob, warm, warm},
			wantEvents:  []string{boundEvent("oldest")},
		},
		{
			name: "the finalizer write conflicts and the claim was bound meanwhile: the member taken alongside goes back, a quick retry",
			faults: func(t *testing.T) interceptor.Funcs {
				done := false
				return interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
					if _, ok := obj.(*kaironv1.MachineClaim); ok && !done {
						done = true
						if err := otherBinder("elsewhere")(ctx, c); err != nil {
							t.Fatal(err)
						}
						return conflictOn("machineclaims", "job")
					}
					return c.Patch(ctx, obj, patch, opts...)
				}}
			},
			wantResult:  reconcile.Result{RequeueAfter: conflictRetryDelay},
			wantClaim:   claimWant{kaironv1.ClaimBound, "elsewhere", kaironv1.ClaimReasonBound, "Bound to machine elsewhere", false},
			wantMembers: [3]string{warm, warm, warm},
			wantEvents:  []string{returned},
		},
		{
			name:        "the claim is deleted before its finalizer (404): the member taken alongside goes back, a quick retry",
			faults:      failPatch[*kaironv1.MachineClaim]("job", 1, apierrors.NewNotFound(schema.GroupResource{Group: kaironv1.GroupVersion.Group, Resource: "machineclaims"}, "job")),
			wantResult:  reconcile.Result{RequeueAfter: conflictRetryDelay},
			wantClaim:   claimWant{},
			wantMembers: [3]string{warm, warm, warm},
			wantEvents:  []string{returned},
		},
		{
			name:        "the status write conflicts with a Pending message: written again on the fresh claim",
			faults:      beforeClaimStatus(nil, conflictOn("machineclaims", "job")),
			wantResult:  reconcile.Result{RequeueAfter: time.Minute},
			wantClaim:   claimWant{kaironv1.ClaimBound, "oldest", kaironv1.ClaimReasonBound, "Bound to machine oldest", true},
			wantMembers: [3]string{claimedByJob, warm, warm},
			wantEvents:  []string{boundEvent("oldest")},
		},
		{
			name:        "another binder bound the claim to another member first: ours goes back to the pool",
			faults:      beforeClaimStatus(otherBinder("newest"), conflictOn("machineclaims", "job")),
			wantResult:  reconcile.Result{RequeueAfter: conflictRetryDelay},
			wantClaim:   claimWant{kaironv1.ClaimBound, "newest", kaironv1.ClaimReasonBound, "Bound to machine newest", true},
			wantMembers: [3]string{warm, warm, claimedByJob},
			wantEvents:  []string{returned},
		},
		{
			name:        "another controller recorded this very bind: done",
			faults:      beforeClaimStatus(otherBinder("oldest"), conflictOn("machineclaims", "job")),
			wantResult:  reconcile.Result{RequeueAfter: time.Minute},
			wantClaim:   claimWant{kaironv1.ClaimBound, "oldest", kaironv1.ClaimReasonBound, "Bound to machine oldest", true},
			wantMembers: [3]string{claimedByJob, warm, warm},
		},
		{
			name:        "the status write fails otherwise: the Machine stays labelled, for the claim reconciler",
			faults:      beforeClaimStatus(nil, internal),
			wantErr:     "claim team/job: " + internal.Error(),
			wantClaim:   claimWant{finalizer: true},
			wantMembers: [3]string{claimedByJob, warm, warm},
		},
		{
			name: "the egress policy cannot be created: the member goes back, the claim says why",
			claim: func(c *kaironv1.MachineClaim) {
				c.Spec.Egress = &kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}}
			},
			faults: func(*testing.T) interceptor.Funcs {
				return interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					if _, ok := obj.(*kaironv1.MachineNetworkPolicy); ok {
						return forbidden
					}
					return c.Create(ctx, obj, opts...)
				}}
			},
			wantResult: reconcile.Result{RequeueAfter: time.Minute},
			wantClaim: claimWant{kaironv1.ClaimPending, "", kaironv1.ClaimReasonEgressPolicyFailed,
				"creating egress policy: " + forbidden.Error(), true},
			wantMembers: [3]string{warm, warm, warm},
			wantEvents: []string{returned, event(corev1.EventTypeWarning, kaironv1.ClaimReasonEgressPolicyFailed,
				"creating egress policy: "+forbidden.Error())},
		},
		{
			// The policy is written alongside each take; a take that fails
			// must not leave a warm member confined to this claim.
			name: "with egress, every member changed since listed: each policy written alongside is deleted again",
			claim: func(c *kaironv1.MachineClaim) {
				c.Spec.Egress = &kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}}
			},
			faults:     failPatch[*kaironv1.Machine]("", -1, conflictOn("machines", "any")),
			wantResult: reconcile.Result{RequeueAfter: time.Minute},
			wantClaim: claimWant{kaironv1.ClaimPending, "", kaironv1.ClaimReasonWaitingForWarmMachine,
				`no Running warm machine in pool "agents" (0 warming)`, true},
			wantMembers: [3]string{warm, warm, warm}, wantConflicts: 3,
			wantNoPolicy: true,
		},
		{
			name:       "no member Running yet: Pending, saying how many are on their way",
			members:    kaironv1.MachineBooting,
			wantResult: reconcile.Result{RequeueAfter: time.Minute},
			wantClaim: claimWant{kaironv1.ClaimPending, "", kaironv1.ClaimReasonWaitingForWarmMachine,
				`no Running warm machine in pool "agents" (3 warming)`, false},
			wantMembers: [3]string{warm, warm, warm},
		},
		{
			// Short of room, not slow to boot: the claim says what the
			// scheduler said, whichever member the cache lists first.
			name:    "members waiting for a node: Pending, saying why they cannot be placed",
			members: kaironv1.MachinePending,
			member: func(i int, m *kaironv1.Machine) {
				if i == 0 {
					m.Spec.NodeName, m.Status.Phase = "node-1", kaironv1.MachineBooting
					return
				}
				m.Status.Conditions = []metav1.Condition{{Type: kaironv1.ConditionScheduled.String(), Status: metav1.ConditionFalse,
					Reason: kaironv1.MachineReasonUnschedulable, Message: fmt.Sprintf("0/1 nodes are available: 1 node has insufficient cpu (free %d, need 1)", 2-i)}}
			},
			wantResult: reconcile.Result{RequeueAfter: time.Minute},
			wantClaim: claimWant{kaironv1.ClaimPending, "", kaironv1.ClaimReasonWaitingForWarmMachine,
				`no Running warm machine in pool "agents" (3 warming, 2 of them waiting for a node: 0/1 nodes are available: 1 node has insufficient cpu (free 0, need 1))`, false},
			wantMembers: [3]string{warm, warm, warm},
		},
		{
			name:       "no such pool: Pending, and a Warning",
			noPool:     true,
			wantResult: reconcile.Result{RequeueAfter: time.Minute},
			wantClaim: claimWant{kaironv1.ClaimPending, "", kaironv1.ClaimReasonPoolNotFound,
				`MachinePool "agents" not found in namespace "team"`, false},
			wantMembers: [3]string{warm, warm, warm},
			wantEvents: []string{event(corev1.EventTypeWarning, kaironv1.ClaimReasonPoolNotFound,
				`MachinePool "agents" not found in namespace "team"`)},
		},
	}
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	names := [3]string{"oldest", "middle", "newest"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := &kaironv1.MachinePool{
				ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "agents", UID: "pool-uid"},
				Spec:       kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](3), Template: poolTemplate()},
			}
			hash := templateHash(&pool.Spec.Template)
			objs := []client.Object{}
			if !tt.noPool {
				objs = append(objs, pool)
			}
			phase := tt.members
			if phase == "" {
				phase = kaironv1.MachineRunning
			}
			for i, name := range names {
				m := binderTestMember(pool, hash, name, base.Add(time.Duration(i)*time.Second), phase)
				if tt.member != nil {
					tt.member(i, m)
				}
				objs = append(objs, m)
			}
			claim := &kaironv1.MachineClaim{
				ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "job", UID: "claim-uid", CreationTimestamp: metav1.NewTime(base.Add(time.Minute))},
				Spec:       kaironv1.MachineClaimSpec{PoolName: "agents", Labels: map[string]string{"team": "ml"}},
			}
			if tt.claim != nil {
				tt.claim(claim)
			}
			objs = append(objs, claim)
			builder := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).
				WithStatusSubresource(&kaironv1.MachineClaim{}, &kaironv1.MachinePool{}, &kaironv1.Machine{}).
				WithIndex(&kaironv1.MachineClaim{}, pendingClaimPoolIndex, pendingClaimPool).WithIndex(&kaironv1.Machine{}, poolMachineIndex, poolOfMember).WithIndex(&kaironv1.Machine{}, poolUnclaimedMachineIndex, poolOfUnclaimedMember).WithIndex(&kaironv1.Machine{}, claimedMachineIndex, claimOfClaimedMachine)
			if tt.faults != nil {
				builder = builder.WithInterceptorFuncs(tt.faults(t))
			}
			c := builder.Build()
			recorder := events.NewFakeRecorder(20)
			b := &MachineClaimBinder{Client: c, APIReader: c, Recorder: recorder, Interval: time.Minute,
				tracker: newBindTracker(), pendingRefreshed: map[types.NamespacedName]time.Time{}}

			ctx := context.Background()
			conflictsBefore := testutil.ToFloat64(claimBindConflicts)
			result, err := b.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "agents"}})
			switch {
			case tt.wantErr == "" && err != nil:
				t.Errorf("pass failed: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Errorf("pass error %v, want one with %q", err, tt.wantErr)
			}
			if result != tt.wantResult {
				t.Errorf("result %+v, want %+v", result, tt.wantResult)
			}
			if got := testutil.ToFloat64(claimBindConflicts) - conflictsBefore; got != tt.wantConflicts {
				t.Errorf("kairon_machineclaim_bind_conflicts_total went up by %v, want %v", got, tt.wantConflicts)
			}

			var gotClaim kaironv1.MachineClaim
			if err := c.Get(ctx, client.ObjectKeyFromObject(claim), &gotClaim); err != nil {
				t.Fatal(err)
			}
			got := claimWant{phase: gotClaim.Status.Phase, machine: gotClaim.Status.MachineName,
				finalizer: controllerutilContains(gotClaim.Finalizers, kaironv1.FinalizerMachineClaim)}
			if cond := meta.FindStatusCondition(gotClaim.Status.Conditions, kaironv1.ConditionReady.String()); cond != nil {
				got.reason, got.message = cond.Reason, cond.Message
			}
			if got != tt.wantClaim {
				t.Errorf("claim %+v, want %+v", got, tt.wantClaim)
			}
			if gotClaim.Status.Message != tt.wantClaim.message && gotClaim.Status.Phase != kaironv1.ClaimBound {
				t.Errorf("claim status.message %q, want %q", gotClaim.Status.Message, tt.wantClaim.message)
			}

			var gotMembers [3]string
			for i, name := range names {
				var m kaironv1.Machine
				if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: name}, &m); err != nil {
					t.Fatal(err)
				}
				kind := ""
				if ref := metav1.GetControllerOf(&m); ref != nil {
					kind = ref.Kind
				}
				gotMembers[i] = fmt.Sprintf("%s/%s/%s", m.Labels[kaironv1.LabelPoolState], m.Labels[kaironv1.LabelMachineClaim], kind)
				if gotMembers[i] == claimedByJob && m.Labels["team"] != "ml" && tt.wantClaim.machine == name {
					t.Errorf("member %s bound without the claim's labels: %v", name, m.Labels)
				}
			}
			if gotMembers != tt.wantMembers {
				t.Errorf("members (oldest, middle, newest) %q, want %q", gotMembers, tt.wantMembers)
			}

			if tt.wantNoPolicy {
				var policies kaironv1.MachineNetworkPolicyList
				if err := c.List(ctx, &policies); err != nil {
					t.Fatal(err)
				}
				if len(policies.Items) != 0 {
					t.Errorf("%d egress policies left, want none: %+v", len(policies.Items), policies.Items[0].Spec)
				}
			}

			gotEvents := recordedEvents(recorder)
			ok := len(gotEvents) == len(tt.wantEvents)
			for i := 0; ok && i < len(gotEvents); i++ {
				ok = regexp.MustCompile(tt.wantEvents[i]).MatchString(gotEvents[i])
			}
			if !ok {
				t.Errorf("events\n%q\nwant to match\n%q", gotEvents, tt.wantEvents)
			}
		})
	}
}

// A claim that arrives while a pass is binding is bound by that pass, not
// left for the next one (which would start only after the pass's slowest
// bind): the pass reads the cache again once it runs out of claims.
func TestMachineClaimBinderTakesInClaimsArrivingDuringAPass(t *testing.T) {
	pool := &kaironv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "agents", UID: "pool-uid"},
		Spec:       kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](3), Template: poolTemplate()},
	}
	hash := templateHash(&pool.Spec.Template)
	key := types.NamespacedName{Namespace: "team", Name: "agents"}
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	objs := []client.Object{pool}
	for i, name := range []string{"oldest", "middle", "newest"} {
		objs = append(objs, binderTestMember(pool, hash, name, base.Add(time.Duration(i)*time.Second), kaironv1.MachineRunning))
	}
	claim := func(name string, uid types.UID) *kaironv1.MachineClaim {
		return &kaironv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: uid, CreationTimestamp: metav1.NewTime(base.Add(time.Minute))},
			Spec:       kaironv1.MachineClaimSpec{PoolName: "agents"},
		}
	}
	objs = append(objs, claim("first", "uid-first"))

	var b *MachineClaimBinder
	arrived := false
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).
		WithStatusSubresource(&kaironv1.MachineClaim{}, &kaironv1.MachinePool{}, &kaironv1.Machine{}).
		WithIndex(&kaironv1.MachineClaim{}, pendingClaimPoolIndex, pendingClaimPool).WithIndex(&kaironv1.Machine{}, poolMachineIndex, poolOfMember).WithIndex(&kaironv1.Machine{}, poolUnclaimedMachineIndex, poolOfUnclaimedMember).WithIndex(&kaironv1.Machine{}, claimedMachineIndex, claimOfClaimedMachine).
		WithInterceptorFuncs(interceptor.Funcs{Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*kaironv1.Machine); ok && !arrived {
				// The second claim arrives, and the watch says so, while
				// the first one's bind is being written.
				arrived = true
				if err := c.Create(ctx, claim("second", "uid-second")); err != nil {
					t.Fatal(err)
				}
				b.poolEvent(key)
			}
			return c.Patch(ctx, obj, patch, opts...)
		}}).Build()
	b = &MachineClaimBinder{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(20), Interval: time.Minute,
		tracker: newBindTracker(), pendingRefreshed: map[types.NamespacedName]time.Time{}}

	ctx := context.Background()
	if _, err := b.Reconcile(ctx, reconcile.Request{NamespacedName: key}); err != nil {
		t.Fatalf("pass failed: %v", err)
	}
	if !arrived {
		t.Fatal("no Machine was patched: nothing was bound")
	}
	bound := map[string]string{}
	for _, name := range []string{"first", "second"} {
		var got kaironv1.MachineClaim
		if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: name}, &got); err != nil {
			t.Fatal(err)
		}
		if got.Status.Phase != kaironv1.ClaimBound {
			t.Errorf("claim %s is %q after the pass, want Bound by the same pass", name, got.Status.Phase)
		}
		bound[name] = got.Status.MachineName
	}
	if bound["first"] != "oldest" || bound["second"] != "middle" {
		t.Errorf("bound %v, want first→oldest and second→middle", bound)
	}
}

// binderTestMember is a warm member of pool "agents" in namespace "team",
// created at created.
func binderTestMember(pool *kaironv1.MachinePool, hash, name string, created time.Time, phase kaironv1.MachinePhase) *kaironv1.Machine {
	return &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "team", Name: name, UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(created),
			Labels: map[string]string{
				kaironv1.LabelMachinePool: "agents", kaironv1.LabelMachinePoolTemplateHash: hash, kaironv1.LabelPoolState: kaironv1.PoolStateWarm,
			},
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(pool, machinePoolKind)},
		},
		Spec:   kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi")},
		Status: kaironv1.MachineStatus{Phase: phase},
	}
}

// A pass hands out warm members to claims still waiting, and to no other:
// not to a Bound claim, nor to a Pending one whose Machine is already
// labelled for it (its status write is in flight or failed), and a claimed
// member is never a candidate. The indexes leave Bound claims and claimed
// members out of the pass's lists; this checks the pass still sees the
// rest right.
func TestMachineClaimBinderSnapshot(t *testing.T) {
	pool := &kaironv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "agents", UID: "pool-uid"},
		Spec:       kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](1), Template: poolTemplate()},
	}
	hash := templateHash(&pool.Spec.Template)
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	claim := func(name string, phase kaironv1.MachineClaimPhase) *kaironv1.MachineClaim {
		return &kaironv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(base)},
			Spec:       kaironv1.MachineClaimSpec{PoolName: "agents"},
			Status:     kaironv1.MachineClaimStatus{Phase: phase},
		}
	}
	claimedBy := func(m *kaironv1.Machine, claim string) *kaironv1.Machine {
		m.Labels[kaironv1.LabelPoolState] = kaironv1.PoolStateClaimed
		m.Labels[kaironv1.LabelMachineClaim] = claim
		return m
	}
	otherPool := claimedBy(binderTestMember(pool, hash, "other-pool", base, kaironv1.MachineRunning), "waiting")
	otherPool.Labels[kaironv1.LabelMachinePool] = "builders"
	objs := []client.Object{
		pool,
		binderTestMember(pool, hash, "warm", base, kaironv1.MachineRunning),
		binderTestMember(pool, hash, "booting", base, kaironv1.MachineBooting),
		claimedBy(binderTestMember(pool, hash, "taken-for-bound", base, kaironv1.MachineRunning), "bound"),
		claimedBy(binderTestMember(pool, hash, "taken-unrecorded", base, kaironv1.MachineRunning), "unrecorded"),
		// A Machine of another pool labelled for a claim of the same name
		// does not make this pool's claim look bound.
		otherPool,
		claim("bound", kaironv1.ClaimBound),
		claim("unrecorded", kaironv1.ClaimPending),
		claim("waiting", kaironv1.ClaimPending),
		claim("new", ""),
	}
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(objs...).
		WithIndex(&kaironv1.MachineClaim{}, pendingClaimPoolIndex, pendingClaimPool).WithIndex(&kaironv1.Machine{}, poolMachineIndex, poolOfMember).
		WithIndex(&kaironv1.Machine{}, poolUnclaimedMachineIndex, poolOfUnclaimedMember).WithIndex(&kaironv1.Machine{}, claimedMachineIndex, claimOfClaimedMachine).Build()
	b := &MachineClaimBinder{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(20), Interval: time.Minute, tracker: newBindTracker()}

	pass, err := b.snapshot(context.Background(), types.NamespacedName{Namespace: "team", Name: "agents"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var pending, candidates []string
	for _, cl := range pass.pending {
		pending = append(pending, cl.Name)
	}
	for _, m := range pass.candidates {
		candidates = append(candidates, m.Name)
	}
	slices.Sort(pending)
	if want := []string{"new", "waiting"}; !slices.Equal(pending, want) {
		t.Errorf("claims to bind %v, want %v", pending, want)
	}
	if want := []string{"warm"}; !slices.Equal(candidates, want) {
		t.Errorf("candidate members %v, want %v", candidates, want)
	}
	if pass.warming != 1 {
		t.Errorf("warming %d, want 1 (the booting member)", pass.warming)
	}
}
