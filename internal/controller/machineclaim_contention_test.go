package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// claimBindHistory watches claims and records every Machine each claim's
// status ever named, and every claim that ever named each Machine.
type claimBindHistory struct {
	mu        sync.Mutex
	byClaim   map[string][]string
	byMachine map[string][]string
	// waited: claims seen Pending for want of a Running warm member.
	waited map[string]bool
}

func watchClaimBinds(t *testing.T, env *testenv.Env, ns string) *claimBindHistory {
	t.Helper()
	h := &claimBindHistory{byClaim: map[string][]string{}, byMachine: map[string][]string{}, waited: map[string]bool{}}
	env.WatchNamespace(t, ns, &kaironv1.MachineClaimList{}, func(_ watch.EventType, o client.Object) {
		c, ok := o.(*kaironv1.MachineClaim)
		if !ok {
			return
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if c.Status.Phase == kaironv1.ClaimPending && strings.HasPrefix(c.Status.Message, `no Running warm machine in pool "agents" (`) {
			h.waited[c.Name] = true
		}
		if c.Status.MachineName == "" {
			return
		}
		if !slices.Contains(h.byClaim[c.Name], c.Status.MachineName) {
			h.byClaim[c.Name] = append(h.byClaim[c.Name], c.Status.MachineName)
		}
		if !slices.Contains(h.byMachine[c.Status.MachineName], c.Name) {
			h.byMachine[c.Status.MachineName] = append(h.byMachine[c.Status.MachineName], c.Name)
		}
	})
	return h
}

// 100 claims arrive at once at a pool of 25 warm members, with two
// kairon-controllers (no leader election) racing to bind them. No Machine
// ever serves two claims, no claim ever names two Machines, and the claims
// the first 25 members cannot serve bind as the replacements come up.
func TestMachineClaimNoDoubleBindUnderContention(t *testing.T) {
	const warm, claims = 25, 100
	env := testenv.Get(t)
	ns := prepareNamespace(t, env)
	history := watchClaimBinds(t, env, ns)
	// 128 vCPUs a node: room for every claimed Machine, the warm pool and
	// the surplus two pool controllers create before trimming it.
	for i := range 3 {
		runSimAgent(t, env, ns, fmt.Sprintf("c%d", i), fmt.Sprintf("10.91.%d.0/24", i), 128, "64Gi", simBootDelay)
	}
	startControllers(t, env, ns, Options{})
	startControllers(t, env, ns, Options{})

	began := time.Now()
	createPool(t, env, ns, "agents", warm)
	testenv.Eventually(t, 5*time.Minute, fmt.Sprintf("%d Running warm members", warm), func() (bool, string) {
		w, _ := poolMachines(t, env, ns, "agents")
		return len(w) == warm && countRunning(w) == warm, fmt.Sprintf("%d warm, %d Running", len(w), countRunning(w))
	})
	t.Logf("pool warm in %s", time.Since(began).Round(time.Millisecond))

	conflictsBefore := testutil.ToFloat64(claimBindConflicts)
	began = time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, claims)
	next := make(chan int, claims)
	for i := range claims {
		next <- i
	}
	close(next)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				c := &kaironv1.MachineClaim{
					ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("claim-%03d", i)},
					Spec:       kaironv1.MachineClaimSpec{PoolName: "agents", Labels: map[string]string{"claim-index": fmt.Sprint(i)}},
				}
				if err := env.Client.Create(context.Background(), c); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("creating claims: %v", err)
	}
	t.Logf("%d claims created in %s", claims, time.Since(began).Round(time.Millisecond))

	var list kaironv1.MachineClaimList
	testenv.Eventually(t, 5*time.Minute, "every claim bound", func() (bool, string) {
		if err := env.Client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		bound := 0
		for _, c := range list.Items {
			if c.Status.Phase == kaironv1.ClaimBound {
				bound++
			}
		}
		return bound == claims, fmt.Sprintf("%d/%d bound", bound, claims)
	})
	t.Logf("all %d claims bound %s after creation; %v bind conflicts", claims, time.Since(began).Round(time.Millisecond),
		testutil.ToFloat64(claimBindConflicts)-conflictsBefore)

	millis := checkBoundOnce(t, env, ns, list.Items, history)
	history.mu.Lock()
	// The first members bind at once; the rest wait, saying so, for replacements
	// (a few of the last may find one already Running).
	if len(history.waited) < claims-2*warm {
		t.Errorf("%d claims were seen waiting for a warm member, want at least %d", len(history.waited), claims-2*warm)
	}
	t.Logf("%d claims waited for a replacement", len(history.waited))
	history.mu.Unlock()
	sort.Slice(millis, func(i, j int) bool { return millis[i] < millis[j] })
	t.Logf("bindMillis p50 %d, p90 %d, max %d", millis[len(millis)/2], millis[len(millis)*9/10], millis[len(millis)-1])

	// And the pool is back to its warm members.
	testenv.Eventually(t, 5*time.Minute, fmt.Sprintf("the pool back to %d Running warm members", warm), func() (bool, string) {
		w, c := poolMachines(t, env, ns, "agents")
		return len(w) == warm && countRunning(w) == warm && len(c) == claims, fmt.Sprintf("%d warm (%d Running), %d claimed", len(w), countRunning(w), len(c))
	})
}

// A member that changed since the pass listed it (409) is skipped for the
// next oldest, and the conflict is counted.
func TestClaimBindSkipsConflictingMember(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := kaironv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	pool := &kaironv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "agents", UID: "pool-uid"},
		Spec:       kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](2), Template: poolTemplate()},
	}
	hash := templateHash(&pool.Spec.Template)
	member := func(name string, age time.Duration) *kaironv1.Machine {
		return &kaironv1.Machine{
			ObjectMeta: metav1.ObjectMeta{
				Namespace: "team", Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(base.Add(age)),
				Labels: map[string]string{
					kaironv1.LabelMachinePool: "agents", kaironv1.LabelMachinePoolTemplateHash: hash, kaironv1.LabelPoolState: kaironv1.PoolStateWarm,
				},
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(pool, machinePoolKind)},
			},
			Spec:   kaironv1.MachineSpec{CPU: 1, Memory: resource.MustParse("64Mi")},
			Status: kaironv1.MachineStatus{Phase: kaironv1.MachineRunning},
		}
	}
	claim := &kaironv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "job", UID: "claim-uid", CreationTimestamp: metav1.NewTime(base.Add(time.Minute))},
		Spec:       kaironv1.MachineClaimSpec{PoolName: "agents", Labels: map[string]string{"team": "ml"}},
	}
	conflicted := false
	c := fake.NewClientBuilder().WithScheme(scheme).
		WithObjects(pool, member("newest", 2*time.Second), member("oldest", 0), member("middle", time.Second), claim).
		WithStatusSubresource(&kaironv1.MachineClaim{}, &kaironv1.MachinePool{}, &kaironv1.Machine{}).
		WithIndex(&kaironv1.MachineClaim{}, pendingClaimPoolIndex, pendingClaimPool).WithIndex(&kaironv1.Machine{}, poolMachineIndex, poolOfMember).WithIndex(&kaironv1.Machine{}, poolUnclaimedMachineIndex, poolOfUnclaimedMember).WithIndex(&kaironv1.Machine{}, claimedMachineIndex, claimOfClaimedMachine).
		WithInterceptorFuncs(interceptor.Funcs{Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*kaironv1.Machine); ok && obj.GetName() == "oldest" && !conflicted {
				conflicted = true
				return apierrors.NewConflict(schema.GroupResource{Group: kaironv1.GroupVersion.Group, Resource: "machines"}, "oldest", errors.New("the object has been modified"))
			}
			return cl.Patch(ctx, obj, patch, opts...)
		}}).
		Build()
	b := &MachineClaimBinder{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(100), Interval: time.Minute,
		tracker: newBindTracker(), pendingRefreshed: map[types.NamespacedName]time.Time{}}

	before := testutil.ToFloat64(claimBindConflicts)
	ctx := context.Background()
	if _, err := b.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(pool)}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(claimBindConflicts) - before; got != 1 {
		t.Errorf("kairon_machineclaim_bind_conflicts_total went up by %v, want 1", got)
	}
	var got kaironv1.MachineClaim
	if err := c.Get(ctx, client.ObjectKeyFromObject(claim), &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != kaironv1.ClaimBound || got.Status.MachineName != "middle" {
		t.Fatalf("claim status %s; want Bound to middle, the oldest member left after the conflict", fmtJSON(got.Status))
	}
	var m kaironv1.Machine
	if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: "middle"}, &m); err != nil {
		t.Fatal(err)
	}
	if m.Labels[kaironv1.LabelPoolState] != kaironv1.PoolStateClaimed || m.Labels[kaironv1.LabelMachineClaim] != "job" || m.Labels["team"] != "ml" {
		t.Errorf("bound member labels %v", m.Labels)
	}
	if ref := metav1.GetControllerOf(&m); ref == nil || ref.UID != claim.UID || len(m.OwnerReferences) != 1 {
		t.Errorf("bound member owners %s, want only the claim", fmtJSON(m.OwnerReferences))
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: "oldest"}, &m); err != nil {
		t.Fatal(err)
	}
	if m.Labels[kaironv1.LabelPoolState] != kaironv1.PoolStateWarm {
		t.Errorf("the conflicting member was bound after all: %v", m.Labels)
	}

	// A second pass, with the claim now Bound, binds nothing more.
	if _, err := b.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(pool)}); err != nil {
		t.Fatal(err)
	}
	var all kaironv1.MachineList
	if err := c.List(ctx, &all); err != nil {
		t.Fatal(err)
	}
	claimed := 0
	for _, m := range all.Items {
		if m.Labels[kaironv1.LabelPoolState] == kaironv1.PoolStateClaimed {
			claimed++
		}
	}
	if claimed != 1 {
		t.Errorf("%d members claimed after two passes, want 1", claimed)
	}
}

// checkBoundOnce checks that every claim in claims (all Bound) has a
// Machine of its own that carries its label, no other Machine does, and
// over the watch's whole history no claim named two Machines and no
// Machine was named by two claims. It returns the claims' bindMillis.
func checkBoundOnce(t *testing.T, env *testenv.Env, ns string, claims []kaironv1.MachineClaim, history *claimBindHistory) []int64 {
	t.Helper()
	// Every bound claim has its own Machine.
	boundTo := map[string]string{}
	var millis []int64
	for _, c := range claims {
		if other, dup := boundTo[c.Status.MachineName]; dup {
			t.Errorf("machine %s bound to both %s and %s", c.Status.MachineName, other, c.Name)
		}
		boundTo[c.Status.MachineName] = c.Name
		millis = append(millis, c.Status.BindMillis)
	}
	// That Machine carries the claim, and no other Machine does once the
	// members taken by the binds that lost a race are handed back.
	testenv.Eventually(t, waitTimeout, "each claim's label on its bound Machine only", func() (bool, string) {
		labelled := map[string][]string{}
		for _, m := range listMachines(t, env, ns) {
			if c := m.Labels[kaironv1.LabelMachineClaim]; c != "" && m.DeletionTimestamp == nil {
				labelled[c] = append(labelled[c], m.Name)
			}
		}
		for _, c := range claims {
			if got := labelled[c.Name]; len(got) != 1 || got[0] != c.Status.MachineName {
				return false, fmt.Sprintf("claim %s is bound to %s but these Machines carry it: %v", c.Name, c.Status.MachineName, got)
			}
		}
		return true, ""
	})
	testenv.Eventually(t, waitTimeout, "the watch to see every bind", func() (bool, string) {
		history.mu.Lock()
		defer history.mu.Unlock()
		return len(history.byClaim) == len(claims), fmt.Sprintf("%d claims seen bound", len(history.byClaim))
	})
	history.mu.Lock()
	defer history.mu.Unlock()
	for claim, ms := range history.byClaim {
		if len(ms) > 1 {
			t.Errorf("claim %s named several machines over time: %v", claim, ms)
		}
	}
	for m, cs := range history.byMachine {
		if len(cs) > 1 {
			t.Errorf("machine %s was named by several claims over time: %v", m, cs)
		}
	}
	return millis
}
