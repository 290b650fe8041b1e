package controller

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

func createClaim(t *testing.T, env *testenv.Env, ns, name, pool string, mutate ...func(*kaironv1.MachineClaim)) *kaironv1.MachineClaim {
	t.Helper()
	c := &kaironv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       kaironv1.MachineClaimSpec{PoolName: pool},
	}
	for _, f := range mutate {
		f(c)
	}
	if err := env.Client.Create(context.Background(), c); err != nil {
		t.Fatalf("creating claim %s: %v", name, err)
	}
	return c
}

func getClaim(t *testing.T, env *testenv.Env, ns, name string) *kaironv1.MachineClaim {
	t.Helper()
	return getObject[kaironv1.MachineClaim](t, env, ns, name)
}

func claimGone(t *testing.T, env *testenv.Env, ns, name string) bool {
	t.Helper()
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &kaironv1.MachineClaim{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("getting claim %s: %v", name, err)
	}
	return apierrors.IsNotFound(err)
}

func machineGone(t *testing.T, env *testenv.Env, ns, name string) bool {
	t.Helper()
	err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &kaironv1.Machine{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("getting machine %s: %v", name, err)
	}
	return apierrors.IsNotFound(err)
}

// waitClaimBound waits for the claim to be Bound and checks the bind: the
// Machine carries the claim and its labels, and the claim owns it.
func waitClaimBound(t *testing.T, env *testenv.Env, ns, name string) *kaironv1.MachineClaim {
	t.Helper()
	var c *kaironv1.MachineClaim
	eventually(t, "claim "+name+" to be bound", func() (bool, string) {
		c = getClaim(t, env, ns, name)
		return c.Status.Phase == kaironv1.ClaimBound, fmtJSON(c.Status)
	})
	m := getMachine(t, env, ns, c.Status.MachineName)
	ref := metav1.GetControllerOf(m)
	if m.Labels[kaironv1.LabelPoolState] != kaironv1.PoolStateClaimed || m.Labels[kaironv1.LabelMachineClaim] != name ||
		m.Labels[kaironv1.LabelMachinePool] != c.Spec.PoolName || m.Status.Phase != kaironv1.MachineRunning ||
		ref == nil || ref.UID != c.UID || ref.Kind != "MachineClaim" {
		t.Errorf("machine %s after binding claim %s: labels %v owners %s phase %s", m.Name, name, m.Labels, fmtJSON(m.OwnerReferences), m.Status.Phase)
	}
	for k, v := range c.Spec.Labels {
		if m.Labels[k] != v {
			t.Errorf("machine %s lacks the claim's label %s=%s: %v", m.Name, k, v, m.Labels)
		}
	}
	if c.Status.BoundAt == nil || c.Status.BindMillis < 0 || c.Status.BindMillis > int64(waitTimeout/time.Millisecond) ||
		!controllerutilContains(c.Finalizers, kaironv1.FinalizerMachineClaim) {
		t.Errorf("bound claim %s: status %s finalizers %v", name, fmtJSON(c.Status), c.Finalizers)
	}
	if cond := meta.FindStatusCondition(c.Status.Conditions, kaironv1.ConditionReady.String()); cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != kaironv1.ClaimReasonBound {
		t.Errorf("bound claim %s Ready condition %+v", name, cond)
	}
	return c
}

func controllerutilContains(list []string, s string) bool { return slices.Contains(list, s) }

// waitClaimPending waits until the claim is Pending with exactly message.
func waitClaimPending(t *testing.T, env *testenv.Env, ns, name, reason, message string) {
	t.Helper()
	eventually(t, fmt.Sprintf("claim %s Pending with %q", name, message), func() (bool, string) {
		c := getClaim(t, env, ns, name)
		cond := meta.FindStatusCondition(c.Status.Conditions, kaironv1.ConditionReady.String())
		ok := c.Status.Phase == kaironv1.ClaimPending && c.Status.Message == message &&
			cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == reason && cond.Message == message
		return ok, fmtJSON(c.Status)
	})
}

// A claim binds to a Running warm member, which the claim then owns; the
// pool replaces it at once; the bind is measured. With no Running member
// the claim waits and says why, and binds the moment one is Running: the
// controllers run with a ten-minute tick, so only the watch can do that.
func TestMachineClaimBindsAndWaitsForWarmMembers(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	// A slow boot leaves the time to see the claim wait for it.
	runSimAgent(t, env, ns, "a", "10.90.4.0/24", 16, "16Gi", 2*time.Second)
	startControllers(t, env, ns, Options{})

	createClaim(t, env, ns, "orphan", "nope")
	waitClaimPending(t, env, ns, "orphan", kaironv1.ClaimReasonPoolNotFound, fmt.Sprintf("MachinePool %q not found in namespace %q", "nope", ns))

	createPool(t, env, ns, "agents", 0)
	createClaim(t, env, ns, "early", "agents", func(c *kaironv1.MachineClaim) { c.Spec.Labels = map[string]string{"team": "ml"} })
	waitClaimPending(t, env, ns, "early", kaironv1.ClaimReasonWaitingForWarmMachine, `no Running warm machine in pool "agents" (0 warming)`)
	scalePool(t, env, ns, "agents", 1)
	waitClaimPending(t, env, ns, "early", kaironv1.ClaimReasonWaitingForWarmMachine, `no Running warm machine in pool "agents" (1 warming)`)
	bindsBefore := histogramCount(t, "kairon_machineclaim_bind_duration_seconds")
	early := waitClaimBound(t, env, ns, "early")
	if early.Status.BindMillis < 1000 {
		t.Errorf("bindMillis %d: the claim waited for a 2s boot", early.Status.BindMillis)
	}
	if got := histogramCount(t, "kairon_machineclaim_bind_duration_seconds"); got < bindsBefore+1 {
		t.Errorf("bind histogram count %d, want at least %d", got, bindsBefore+1)
	}

	// The bind made the pool one short: a replacement boots right away.
	eventually(t, "a replacement warm member", func() (bool, string) {
		warm, claimed := poolMachines(t, env, ns, "agents")
		return len(warm) == 1 && len(claimed) == 1, describeMembers(warm, claimed)
	})
	waitWarm(t, env, ns, "agents", 1, 1)
	if got := testutil.ToFloat64(poolMembers.WithLabelValues(ns, "agents", memberStateClaimed)); got != 1 {
		t.Errorf("kairon_machinepool_members{state=claimed} = %v, want 1", got)
	}

	// A claim for a Running member binds within a pass.
	created := time.Now()
	createClaim(t, env, ns, "fast", "agents")
	fast := waitClaimBound(t, env, ns, "fast")
	if fast.Status.BindMillis > time.Since(created).Milliseconds() {
		t.Errorf("bindMillis %d is more than the %s the test waited", fast.Status.BindMillis, time.Since(created))
	}
	if fast.Status.MachineName == early.Status.MachineName {
		t.Errorf("both claims bound to %s", fast.Status.MachineName)
	}
}

// Each pass binds the oldest Pending claim to the oldest Running warm
// member. The members here come Running newest first, while no controller
// runs, so that only the order of the pass decides.
//
// creationTimestamp has whole seconds; within one, the binder orders by
// when its watch first delivered each object (the bind tracker's
// arrivals). The test drives the tracker's clock, moving it on after each
// arrival, and hands the tracker to the second manager, so the order is
// the one the test made whether or not a second boundary falls between
// two creations.
func TestMachineClaimBindOrder(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	createNode(t, env, ns, "n1", 16, "16Gi")
	clock := newTestClock(time.Now())
	binds := newBindTracker()
	binds.now = clock.Now
	opts := Options{binds: binds}
	stop := startControllers(t, env, ns, opts)

	// arrive waits for the binder's watch to deliver uid, checks that the
	// tracker took the clock's time for it, and moves the clock on.
	arrive := func(what string, uid types.UID) {
		t.Helper()
		want := clock.Now()
		var at time.Time
		eventually(t, what+" to reach the binder", func() (bool, string) {
			var ok bool
			at, ok = binds.arrivedAt(uid)
			return ok, "no arrival recorded"
		})
		if !at.Equal(want) {
			t.Fatalf("%s arrived at %s, want the test clock's %s", what, at, want)
		}
		clock.Step(time.Millisecond)
	}

	createPool(t, env, ns, "agents", 1)
	var members []kaironv1.Machine // oldest first: in the order the pool made them
	for n := 1; n <= 3; n++ {
		if n > 1 {
			scalePool(t, env, ns, "agents", int32(n))
		}
		var added *kaironv1.Machine
		eventually(t, fmt.Sprintf("%d members", n), func() (bool, string) {
			warm, _ := poolMachines(t, env, ns, "agents")
			added = nil
			for i := range warm {
				if !slices.Contains(names(members), warm[i].Name) {
					added = &warm[i]
				}
			}
			return len(warm) == n && added != nil, describeMembers(warm, nil)
		})
		members = append(members, *added)
		arrive("member "+added.Name, added.UID)
	}
	// No agent runs: the members stay Scheduled, and the claims wait.
	for _, name := range []string{"b-first", "a-second"} {
		c := createClaim(t, env, ns, name, "agents")
		arrive("claim "+name, c.UID)
	}
	for _, name := range []string{"b-first", "a-second"} {
		waitClaimPending(t, env, ns, name, kaironv1.ClaimReasonWaitingForWarmMachine, `no Running warm machine in pool "agents" (3 warming)`)
	}
	stop()

	for i := len(members) - 1; i >= 0; i-- {
		setMachinePhase(t, env, &members[i], kaironv1.MachineRunning)
	}
	startControllers(t, env, ns, opts)
	first := waitClaimBound(t, env, ns, "b-first")
	second := waitClaimBound(t, env, ns, "a-second")
	if first.Status.MachineName != members[0].Name || second.Status.MachineName != members[1].Name {
		t.Errorf("oldest claim got %s and the next %s; want the oldest members %s then %s",
			first.Status.MachineName, second.Status.MachineName, members[0].Name, members[1].Name)
	}
	eventually(t, "replacements for the two bound members", func() (bool, string) {
		warm, claimed := poolMachines(t, env, ns, "agents")
		return len(warm) == 3 && len(claimed) == 2 && slices.Contains(names(warm), members[2].Name), describeMembers(warm, claimed)
	})
}

// Deleting a Delete claim deletes its Machine; deleting a Retain claim
// leaves its Machine running as a plain Machine.
func TestMachineClaimReclaimPolicies(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	runSimAgent(t, env, ns, "a", "10.90.5.0/24", 16, "16Gi", simBootDelay)
	startControllers(t, env, ns, Options{})
	createPool(t, env, ns, "agents", 2)
	waitWarm(t, env, ns, "agents", 2, 0)
	del := createClaim(t, env, ns, "del", "agents")
	ret := createClaim(t, env, ns, "ret", "agents", func(c *kaironv1.MachineClaim) {
		c.Spec.ReclaimPolicy = kaironv1.ReclaimRetain
		c.Spec.Labels = map[string]string{"team": "ml"}
	})
	delMachine := waitClaimBound(t, env, ns, "del").Status.MachineName
	retMachine := waitClaimBound(t, env, ns, "ret").Status.MachineName
	if got := getClaim(t, env, ns, "del").Spec.ReclaimPolicy; got != kaironv1.ReclaimDelete {
		t.Errorf("default reclaimPolicy %q, want Delete", got)
	}

	for _, c := range []*kaironv1.MachineClaim{del, ret} {
		if err := env.Client.Delete(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "both claims gone and the Delete claim's machine deleted", func() (bool, string) {
		return claimGone(t, env, ns, "del") && claimGone(t, env, ns, "ret") && machineGone(t, env, ns, delMachine), ""
	})
	m := getMachine(t, env, ns, retMachine)
	for _, k := range []string{kaironv1.LabelMachinePool, kaironv1.LabelMachinePoolTemplateHash, kaironv1.LabelPoolState, kaironv1.LabelMachineClaim} {
		if _, ok := m.Labels[k]; ok {
			t.Errorf("retained machine still has label %s: %v", k, m.Labels)
		}
	}
	if m.Labels["team"] != "ml" || len(m.OwnerReferences) != 0 || m.DeletionTimestamp != nil || m.Status.Phase != kaironv1.MachineRunning {
		t.Errorf("retained machine: labels %v owners %s phase %s deleting %v", m.Labels, fmtJSON(m.OwnerReferences), m.Status.Phase, m.DeletionTimestamp)
	}
	waitWarm(t, env, ns, "agents", 2, 0)
	testenv.Consistently(t, gcWindow, "the retained machine to stay", func() (bool, string) {
		if machineGone(t, env, ns, retMachine) {
			return false, "deleted"
		}
		m := getMachine(t, env, ns, retMachine)
		return m.DeletionTimestamp == nil, describeMachine(m) + fmt.Sprintf(" deleting since %v", m.DeletionTimestamp)
	})
}

// A claim with ttlSeconds is deleted that long after its bind, which
// releases its Machine.
func TestMachineClaimTTL(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	runSimAgent(t, env, ns, "a", "10.90.6.0/24", 16, "16Gi", simBootDelay)
	startControllers(t, env, ns, Options{})
	createPool(t, env, ns, "agents", 1)
	waitWarm(t, env, ns, "agents", 1, 0)
	createClaim(t, env, ns, "short", "agents", func(c *kaironv1.MachineClaim) { c.Spec.TTLSeconds = ptr.To[int64](2) })
	c := waitClaimBound(t, env, ns, "short")
	eventually(t, "the expired claim and its machine gone", func() (bool, string) {
		return claimGone(t, env, ns, "short") && machineGone(t, env, ns, c.Status.MachineName), ""
	})
	// boundAt has whole seconds, so the claim may go up to a second early.
	if lived := time.Since(c.Status.BoundAt.Time); lived < 2*time.Second {
		t.Errorf("claim deleted %s after its bind, before its ttlSeconds of 2", lived)
	}
}

// A bound claim whose Machine is deleted becomes Lost, and its egress
// policy goes.
func TestMachineClaimLost(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	runSimAgent(t, env, ns, "a", "10.90.7.0/24", 16, "16Gi", simBootDelay)
	startControllers(t, env, ns, Options{})
	createPool(t, env, ns, "agents", 1)
	waitWarm(t, env, ns, "agents", 1, 0)
	createClaim(t, env, ns, "job", "agents", func(c *kaironv1.MachineClaim) {
		c.Spec.Egress = &kaironv1.EgressRules{AllowFqdns: []kaironv1.Hostname{"pypi.org"}}
	})
	c := waitClaimBound(t, env, ns, "job")
	if err := env.Client.Delete(context.Background(), getMachine(t, env, ns, c.Status.MachineName)); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("machine %q was deleted", c.Status.MachineName)
	eventually(t, "the claim Lost", func() (bool, string) {
		c := getClaim(t, env, ns, "job")
		cond := meta.FindStatusCondition(c.Status.Conditions, kaironv1.ConditionReady.String())
		err := env.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: "claim-egress-job"}, &kaironv1.MachineNetworkPolicy{})
		ok := c.Status.Phase == kaironv1.ClaimLost && c.Status.Message == want && cond != nil && cond.Reason == kaironv1.ClaimReasonMachineLost &&
			apierrors.IsNotFound(err) && c.Status.EgressPolicy == ""
		return ok, fmtJSON(c.Status) + fmt.Sprintf(" policy: %v", err)
	})
	// Lost is final: the pool's next warm member is not bound to it.
	waitWarm(t, env, ns, "agents", 1, 0)
	if c := getClaim(t, env, ns, "job"); c.Status.Phase != kaironv1.ClaimLost {
		t.Errorf("lost claim moved on: %s", fmtJSON(c.Status))
	}
}

// objectEvent is one watch event, in etcd's order: resourceVersion is the
// etcd revision, one counter for every resource, so events of different
// watches compare.
type objectEvent struct {
	kind, name string
	typ        watch.EventType
	rev        uint64
	obj        client.Object
}

// recordEvents records the changes to Machines and MachineNetworkPolicies
// in ns until the test ends.
func recordEvents(t *testing.T, env *testenv.Env, ns string) func() []objectEvent {
	t.Helper()
	var mu sync.Mutex
	var events []objectEvent
	for kind, list := range map[string]client.ObjectList{"Machine": &kaironv1.MachineList{}, "MachineNetworkPolicy": &kaironv1.MachineNetworkPolicyList{}} {
		env.WatchNamespace(t, ns, list, func(typ watch.EventType, o client.Object) {
			rev, _ := strconv.ParseUint(o.GetResourceVersion(), 10, 64)
			mu.Lock()
			events = append(events, objectEvent{kind: kind, name: o.GetName(), typ: typ, rev: rev, obj: o})
			mu.Unlock()
		})
	}
	return func() []objectEvent {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(events)
	}
}

// firstRev is the revision of the first event that matches, 0 if none did.
func firstRev(events []objectEvent, match func(objectEvent) bool) uint64 {
	var first uint64
	for _, e := range events {
		if match(e) && (first == 0 || e.rev < first) {
			first = e.rev
		}
	}
	return first
}

// A claim's spec.egress becomes the MachineNetworkPolicy claim-egress-<claim>
// at bind, follows edits of spec.egress and goes when it is removed; on
// release the policy is deleted before the Machine is deleted (Delete) or
// handed back (Retain).
func TestMachineClaimEgressPolicy(t *testing.T) {
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	events := recordEvents(t, env, ns)
	runSimAgent(t, env, ns, "a", "10.90.8.0/24", 16, "16Gi", simBootDelay)
	startControllers(t, env, ns, Options{})
	createPool(t, env, ns, "agents", 2)
	waitWarm(t, env, ns, "agents", 2, 0)
	egress := kaironv1.EgressRules{
		AllowFqdns: []kaironv1.Hostname{"pypi.org", "files.pythonhosted.org"},
		AllowSNI:   []kaironv1.ServerName{"*.pythonhosted.org"},
		AllowCidrs: []kaironv1.CIDR{"10.0.0.0/8"},
		AllowPorts: []kaironv1.PortRange{"443", "8000-8100"},
		AllowDNS:   []kaironv1.ServerName{"pypi.org"},
		AllowIcmp:  true,
	}
	ctx := context.Background()
	del := createClaim(t, env, ns, "del", "agents", func(c *kaironv1.MachineClaim) { c.Spec.Egress = egress.DeepCopy() })
	ret := createClaim(t, env, ns, "ret", "agents", func(c *kaironv1.MachineClaim) {
		c.Spec.Egress = egress.DeepCopy()
		c.Spec.ReclaimPolicy = kaironv1.ReclaimRetain
	})
	policyOf := func(claim string) (*kaironv1.MachineNetworkPolicy, error) {
		var p kaironv1.MachineNetworkPolicy
		err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "claim-egress-" + claim}, &p)
		return &p, err
	}
	machines := map[string]string{}
	for _, c := range []*kaironv1.MachineClaim{del, ret} {
		bound := waitClaimBound(t, env, ns, c.Name)
		machines[c.Name] = bound.Status.MachineName
		p, err := policyOf(c.Name)
		if err != nil {
			t.Fatalf("policy of bound claim %s: %v", c.Name, err)
		}
		ref := metav1.GetControllerOf(p)
		if bound.Status.EgressPolicy != p.Name || p.Spec.MachineName != bound.Status.MachineName || p.Spec.MachineSelector != nil ||
			fmtJSON(p.Spec.Egress) != fmtJSON(egress) || ref == nil || ref.UID != bound.UID {
			t.Errorf("policy of claim %s: %s owner %+v; claim status %s", c.Name, fmtJSON(p.Spec), ref, fmtJSON(bound.Status))
		}
	}

	// Editing spec.egress updates the policy.
	c := getClaim(t, env, ns, "del")
	patch := client.MergeFrom(c.DeepCopy())
	c.Spec.Egress.AllowPorts = []kaironv1.PortRange{"22"}
	if err := env.Client.Patch(ctx, c, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the policy to follow spec.egress", func() (bool, string) {
		p, err := policyOf("del")
		return err == nil && slices.Equal(p.Spec.Egress.AllowPorts, []kaironv1.PortRange{"22"}), fmt.Sprintf("%v %s", err, fmtJSON(p.Spec))
	})
	// Removing it deletes the policy; putting it back recreates it.
	c = getClaim(t, env, ns, "del")
	patch = client.MergeFrom(c.DeepCopy())
	c.Spec.Egress = nil
	if err := env.Client.Patch(ctx, c, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the policy deleted with spec.egress", func() (bool, string) {
		_, err := policyOf("del")
		c := getClaim(t, env, ns, "del")
		return apierrors.IsNotFound(err) && c.Status.EgressPolicy == "", fmt.Sprintf("%v %s", err, fmtJSON(c.Status))
	})
	c = getClaim(t, env, ns, "del")
	patch = client.MergeFrom(c.DeepCopy())
	c.Spec.Egress = egress.DeepCopy()
	if err := env.Client.Patch(ctx, c, patch); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the policy back with spec.egress", func() (bool, string) {
		p, err := policyOf("del")
		c := getClaim(t, env, ns, "del")
		return err == nil && p.Spec.MachineName == machines["del"] && c.Status.EgressPolicy == p.Name, fmt.Sprintf("%v %s", err, fmtJSON(c.Status))
	})

	// Release both, and check the order in etcd's history.
	for _, name := range []string{"del", "ret"} {
		if err := env.Client.Delete(ctx, getClaim(t, env, ns, name)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "both claims released", func() (bool, string) {
		return claimGone(t, env, ns, "del") && claimGone(t, env, ns, "ret") && machineGone(t, env, ns, machines["del"]), ""
	})
	// The watches deliver the releases a moment after the API server did them.
	var history []objectEvent
	eventually(t, "the watches to deliver both releases", func() (bool, string) {
		history = events()
		saw := ""
		for _, claim := range []string{"del", "ret"} {
			policyDeleted, released := releaseRevisions(history, claim, machines[claim])
			saw += fmt.Sprintf("claim %s: policy deleted at %d, machine released at %d; ", claim, policyDeleted, released)
			if policyDeleted == 0 || released == 0 {
				return false, saw
			}
		}
		return true, saw
	})
	for _, claim := range []string{"del", "ret"} {
		policyDeleted, released := releaseRevisions(history, claim, machines[claim])
		if policyDeleted >= released {
			t.Errorf("claim %s: policy deleted at revision %d, machine %s released at %d; want the policy gone first", claim, policyDeleted, machines[claim], released)
		}
	}
}

// releaseRevisions finds in history the revisions at which claim's egress
// policy was deleted and its machine released: deleted for the claim
// "del", handed back (its pool label gone) for the Retain claim "ret".
// Either is 0 if history does not show it.
func releaseRevisions(history []objectEvent, claim, machine string) (policyDeleted, released uint64) {
	policyDeleted = firstRev(history, func(e objectEvent) bool {
		return e.kind == "MachineNetworkPolicy" && e.name == "claim-egress-"+claim && e.typ == watch.Deleted
	})
	if claim == "del" {
		released = firstRev(history, func(e objectEvent) bool {
			return e.kind == "Machine" && e.name == machine && (e.typ == watch.Deleted || e.obj.GetDeletionTimestamp() != nil)
		})
	} else {
		released = firstRev(history, func(e objectEvent) bool {
			return e.kind == "Machine" && e.name == machine && e.typ == watch.Modified && e.obj.GetLabels()[kaironv1.LabelMachinePool] == ""
		})
	}
	return policyDeleted, released
}
