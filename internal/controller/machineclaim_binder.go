package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules"
)

// pendingClaimPoolIndex indexes the MachineClaims not yet bound by
// spec.poolName in the cache. Bound claims, which pile up as a pool serves
// claims, are in no pool's entry: the binder and the refill hold look only
// at those still waiting.
const pendingClaimPoolIndex = "kairon.pendingClaimsOfPool"

// pendingRefreshInterval limits how often the waiting claims of a pool with
// more than pendingRefreshBurst of them are rewritten only because the number
// of warming members in their message changed. During a burst of claims
// against a booting pool that number moves with every member's phase, and
// rewriting hundreds of claims each time would cost more than the binds. A
// new reason is always written at once, and so is every change for a few
// waiting claims.
const (
	pendingRefreshInterval = 2 * time.Second
	pendingRefreshBurst    = 10
)

// explainWaitingAfter is how long a claim waits before a pass that is still
// binding others tells it why (bindPending).
const explainWaitingAfter = time.Second

// midPassTold picks the waiting claims a pass tells why while it still
// binds others, rather than when it ends: a pass fed by the refill's
// members one at a time can last as long as the refill. Only claims that
// waited explainWaitingAfter: the write comes before the pass takes in the
// next member, and for claims that member is about to serve it only
// delayed their binds (tens of milliseconds at p99 for egress binds back
// to back; docs/benchmarks.md). Each claim is told once a pass, and the
// claims are looked at no more often than every explainScanEvery, since
// the pass comes here after each bind it finishes.
type midPassTold struct {
	done     map[types.UID]bool
	lastScan time.Time
}

// explainScanEvery bounds how often a pass looks for claims to tell.
const explainScanEvery = explainWaitingAfter / 10

// due returns the claims of needy to tell now, and counts them as told.
func (m *midPassTold) due(needy []*kaironv1.MachineClaim, tracker *bindTracker) []*kaironv1.MachineClaim {
	now := tracker.now()
	if len(needy) == 0 || now.Sub(m.lastScan) < explainScanEvery {
		return nil
	}
	m.lastScan = now
	var due []*kaironv1.MachineClaim
	for _, c := range needy {
		if !m.done[c.UID] && now.Sub(tracker.createdAt(c)) >= explainWaitingAfter {
			m.done[c.UID] = true
			due = append(due, c)
		}
	}
	return due
}

// pendingWriters bounds the concurrent status writes of one pass.
const pendingWriters = 8

// bindWorkers bounds the concurrent binds of one pass.
const bindWorkers = 16

var machineClaimKind = kaironv1.GroupVersion.WithKind("MachineClaim")

// MachineClaimBinder binds Pending MachineClaims to Running warm members of
// their pool. A pass works on one pool at a time (the request names the
// pool, not a claim) because binds depend on each other: claims are served
// oldest first, each from the oldest Running warm member left.
//
// The bind itself is a patch of the member's labels and owner that carries
// the resourceVersion the pass listed, so two binders (two kairon-controller
// replicas, or one with a stale cache) can never both take a member: the
// loser gets 409 Conflict and tries the next member. The claim's status is
// then written with its own resourceVersion, so a claim is never recorded as
// bound twice either; a binder that loses that race hands its member back.
type MachineClaimBinder struct {
	// Client reads from the manager's cache and writes to the API server.
	Client client.Client
	// APIReader reads from the API server when the cache may be behind.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Interval  time.Duration

	tracker *bindTracker
	// heldEvents holds Recorder's events while binds run (bind_events.go);
	// nil when the binder was not set up with a manager.
	heldEvents *eventsAfterBinds

	mu               sync.Mutex
	pendingRefreshed map[types.NamespacedName]time.Time
	// events counts, per pool, the watch events that may let a pass bind
	// more: claims arriving, members changing.
	events map[types.NamespacedName]uint64
	// policies wakes the binds waiting for a node to report their egress
	// policy in force.
	policies *policyWaiters
}

// poolEvent counts an event that may let a pass over pool bind more.
func (b *MachineClaimBinder) poolEvent(pool types.NamespacedName) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.events == nil {
		b.events = map[types.NamespacedName]uint64{}
	}
	b.events[pool]++
}

func (b *MachineClaimBinder) poolEvents(pool types.NamespacedName) uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.events[pool]
}

// SetupWithManager registers the binder with mgr.
func (b *MachineClaimBinder) SetupWithManager(mgr manager.Manager) error {
	if b.tracker == nil {
		b.tracker = newBindTracker()
	}
	b.pendingRefreshed = map[types.NamespacedName]time.Time{}
	b.policies = &policyWaiters{}
	b.heldEvents = newEventsAfterBinds(b.Recorder)
	b.Recorder = b.heldEvents
	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &kaironv1.MachineClaim{}, pendingClaimPoolIndex, pendingClaimPool); err != nil {
		return fmt.Errorf("indexing machine claims by pool: %w", err)
	}
	return builder.ControllerManagedBy(mgr).
		Named("machineclaim-binder").
		Watches(&kaironv1.MachineClaim{}, b.claimEvents()).
		Watches(&kaironv1.Machine{}, b.memberEvents()).
		Watches(&kaironv1.MachineNetworkPolicy{}, b.policies.events()).
		Watches(&kaironv1.MachinePool{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			return []reconcile.Request{{NamespacedName: client.ObjectKeyFromObject(o)}}
		}), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// Passes over different pools are independent; the workqueue never
		// runs two over the same pool at once.
		WithOptions(controller.Options{MaxConcurrentReconciles: 4}).
		Complete(requeue.UntilStopped(b))
}

func pendingClaimPool(o client.Object) []string {
	if c := o.(*kaironv1.MachineClaim); claimPending(c) {
		return []string{c.Spec.PoolName}
	}
	return nil
}

// claimEvents asks for a pass over the claim's pool when a claim arrives,
// changes its spec or goes, and records arrivals for createdAt. Status
// writes (the binder's own) ask for nothing.
func (b *MachineClaimBinder) claimEvents() handler.Funcs {
	enqueue := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		if c, ok := o.(*kaironv1.MachineClaim); ok && c.Spec.PoolName != "" {
			key := types.NamespacedName{Namespace: c.Namespace, Name: c.Spec.PoolName}
			b.poolEvent(key)
			q.Add(reconcile.Request{NamespacedName: key})
		}
	}
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			b.tracker.arrived(e.Object.GetUID())
			enqueue(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.ObjectOld.GetGeneration() != e.ObjectNew.GetGeneration() ||
				(e.ObjectOld.GetDeletionTimestamp() == nil) != (e.ObjectNew.GetDeletionTimestamp() == nil) {
				enqueue(e.ObjectNew, q)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			b.tracker.departed(e.Object.GetUID())
			enqueue(e.Object, q)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
	}
}

// memberEvents asks for a pass over a member's pool when it may have become
// bindable: created, Running, labelled warm again, deleted. This is what
// binds a waiting claim the moment a member finishes booting.
func (b *MachineClaimBinder) memberEvents() handler.Funcs {
	enqueue := func(o client.Object, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
		for _, req := range poolOfMachine(context.Background(), o) {
			b.poolEvent(req.NamespacedName)
			q.Add(req)
		}
	}
	changed := poolMemberChanged()
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			b.tracker.arrived(e.Object.GetUID())
			enqueue(e.Object, q)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if changed.Update(e) {
				enqueue(e.ObjectNew, q)
				enqueue(e.ObjectOld, q)
			}
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			b.tracker.departed(e.Object.GetUID())
			enqueue(e.Object, q)
		},
		GenericFunc: func(_ context.Context, e event.GenericEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			enqueue(e.Object, q)
		},
	}
}

// bindingPass is one pool as a pass sees it.
type bindingPass struct {
	key  types.NamespacedName
	pool *kaironv1.MachinePool // nil when there is no such pool
	hash string
	// pending claims, oldest first.
	pending []*kaironv1.MachineClaim
	// candidates: Running warm members from the current template, oldest
	// first; the pass consumes them as it binds or finds them taken.
	candidates []*kaironv1.Machine
	// warming: warm members from the current template still on their way up.
	warming int
	// unplaced: those of warming that wait for a node, and the scheduler's
	// explanation for one of them.
	unplaced rules.UnplacedMembers
	// events: the pool's event count when the pass read the cache.
	events uint64
}

// Reconcile runs one binding pass over the pool named by req.
func (b *MachineClaimBinder) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	pass, err := b.snapshot(ctx, req.NamespacedName, nil)
	if err != nil {
		return reconcile.Result{}, err
	}
	if pass.pool == nil && len(pass.pending) == 0 {
		b.mu.Lock()
		delete(b.events, req.NamespacedName)
		b.mu.Unlock()
	}
	waiting, retrySoon, bindErr := b.bindPending(ctx, pass)
	refreshIn, err := b.explainWaiting(ctx, pass, waiting)
	if err := errors.Join(bindErr, err); err != nil {
		return reconcile.Result{}, err
	}
	result := reconcile.Result{RequeueAfter: b.Interval}
	if retrySoon && conflictRetryDelay < result.RequeueAfter {
		result.RequeueAfter = conflictRetryDelay
	}
	if refreshIn > 0 && refreshIn < result.RequeueAfter {
		result.RequeueAfter = refreshIn
	}
	return result, nil
}

// bindPending binds the pass's pending claims, oldest first, each to the
// oldest candidate left, up to bindWorkers binds at a time: a bind is a few
// round trips to the API server, and a burst of claims must not queue
// behind them one by one. A worker that finishes takes the next claim at
// once. When the pass runs out of claims or members while binds are still
// in flight, it looks at the cache again and takes in the claims that
// arrived and the members that became ready meanwhile, rather than leave
// them to a next pass that would start only after the slowest bind of this
// one. A claim that lost its member to a conflict goes back to the front.
// It returns the claims left waiting for a member.
func (b *MachineClaimBinder) bindPending(ctx context.Context, pass *bindingPass) (waiting []*kaironv1.MachineClaim, retrySoon bool, err error) {
	type finished struct {
		claim  *kaironv1.MachineClaim
		member *kaironv1.Machine
		result bindResult
	}
	var (
		needy      = pass.pending
		candidates = pass.candidates
		done       = make(chan finished)
		running    int
		inFlight   = map[types.UID]bool{} // the claims and members of binds running
		// spent: claims and members this pass is done with. A member that
		// changed since listed is spent at the resourceVersion it had: the
		// cache showing it so still is no reason to try it again. Claims
		// and taken members are spent for good ("").
		spent = map[types.UID]string{}
		told  = midPassTold{done: map[types.UID]bool{}}
		errs  []error
	)
	for {
		for running < bindWorkers && len(needy) > 0 && len(candidates) > 0 {
			c, m := needy[0], candidates[0]
			needy, candidates = needy[1:], candidates[1:]
			running++
			inFlight[c.UID], inFlight[m.UID] = true, true
			go func() { done <- finished{c, m, b.bindClaim(ctx, pass, c, m)} }()
		}
		if running == 0 {
			break
		}
		if len(candidates) == 0 {
			// Binds still run, but needy claims have no member coming.
			if due := told.due(needy, b.tracker); len(due) > 0 {
				if _, err := b.explainWaiting(ctx, pass, due); err != nil {
					errs = append(errs, err)
				}
			}
		}
		f := <-done
		running--
		delete(inFlight, f.claim.UID)
		delete(inFlight, f.member.UID)
		r := f.result
		switch r.outcome {
		case bindDone:
			spent[f.claim.UID], spent[f.member.UID] = "", ""
		case bindMemberTaken:
			next := f.claim
			if r.claim != nil {
				next = r.claim
			}
			needy = append([]*kaironv1.MachineClaim{next}, needy...)
			spent[f.member.UID] = f.member.ResourceVersion
		case bindRetry, bindRefused:
			// A retry is the next pass's, as is a claim that cannot be
			// bound as it is (trying it again would only rewrite why).
			retrySoon = retrySoon || r.outcome == bindRetry
			spent[f.claim.UID] = ""
			if r.memberUsed {
				spent[f.member.UID] = ""
			} else {
				candidates = append(candidates, f.member)
				sortOldestFirst(b.tracker, candidates)
			}
		}
		if r.err != nil {
			errs = append(errs, fmt.Errorf("claim %s/%s: %w", f.claim.Namespace, f.claim.Name, r.err))
		}
		if len(needy) == 0 || len(candidates) == 0 {
			needy, candidates = b.takeInArrivals(ctx, pass, needy, candidates, inFlight, spent)
		}
	}
	return needy, retrySoon, errors.Join(errs...)
}

// takeInArrivals reads the pool from the cache again during a pass and
// adds to needy and candidates what is new there: claims and members that
// are neither in them, nor in a bind running, nor spent at the version the
// cache still shows. The pass's warming count follows the cache.
func (b *MachineClaimBinder) takeInArrivals(ctx context.Context, pass *bindingPass, needy []*kaironv1.MachineClaim, candidates []*kaironv1.Machine,
	inFlight map[types.UID]bool, spent map[types.UID]string) ([]*kaironv1.MachineClaim, []*kaironv1.Machine) {
	if b.poolEvents(pass.key) == pass.events {
		return needy, candidates // nothing arrived since the pass last looked
	}
	known := map[types.UID]bool{}
	for _, c := range needy {
		known[c.UID] = true
	}
	for _, m := range candidates {
		known[m.UID] = true
	}
	usable := func(o client.Object) bool {
		rv, wasSpent := spent[o.GetUID()]
		return !known[o.GetUID()] && !inFlight[o.GetUID()] && (!wasSpent || (rv != "" && rv != o.GetResourceVersion()))
	}
	fresh, err := b.snapshot(ctx, pass.key, usable)
	if err != nil || fresh.pool == nil || pass.pool == nil || fresh.pool.UID != pass.pool.UID || fresh.hash != pass.hash || fresh.pool.DeletionTimestamp != nil {
		// The next pass sorts out a pool that changed.
		return needy, candidates
	}
	pass.warming, pass.unplaced, pass.events = fresh.warming, fresh.unplaced, fresh.events
	if len(fresh.pending) > 0 || len(fresh.candidates) > 0 {
		needy = append(needy, fresh.pending...)
		candidates = append(candidates, fresh.candidates...)
		sortOldestFirst(b.tracker, needy)
		sortOldestFirst(b.tracker, candidates)
	}
	return needy, candidates
}

// snapshot reads the pool's bindable claims and members from the cache.
// With usable, it leaves out the claims and members usable rejects (those
// a pass already holds), before the work of checking and copying them: a
// pass in a burst reads the pool again after every bind, and a thousand
// waiting claims each checked for a labelled member every time made the
// pass's cost grow with the square of the burst.
func (b *MachineClaimBinder) snapshot(ctx context.Context, key types.NamespacedName, usable func(client.Object) bool) (*bindingPass, error) {
	if usable == nil {
		usable = func(client.Object) bool { return true }
	}
	pass := &bindingPass{key: key, events: b.poolEvents(key)}
	var pool kaironv1.MachinePool
	switch err := b.Client.Get(ctx, key, &pool); {
	case apierrors.IsNotFound(err):
	case err != nil:
		return nil, fmt.Errorf("getting pool: %w", err)
	default:
		pass.pool = &pool
		pass.hash = templateHash(&pool.Spec.Template)
	}

	// The cache's own objects, read only: a pass runs on every claim and
	// member event of the pool, and copying every claim and member each
	// time was the binder's largest cost in a burst. Only the claims a
	// bind may write are copied, below. Bound claims and claimed
	// members are not even listed (the indexes leave them out): they pile
	// up as the pool serves claims, and every pass read them all.
	var claims kaironv1.MachineClaimList
	if err := b.Client.List(ctx, &claims, client.InNamespace(key.Namespace), client.MatchingFields{pendingClaimPoolIndex: key.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing claims: %w", err)
	}
	var machines kaironv1.MachineList
	if err := b.Client.List(ctx, &machines, client.InNamespace(key.Namespace), client.MatchingFields{poolUnclaimedMachineIndex: key.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing members: %w", err)
	}

	for i := range machines.Items {
		m := &machines.Items[i]
		if pass.pool == nil || pass.pool.DeletionTimestamp != nil || m.DeletionTimestamp != nil ||
			!isWarmMemberOf(pass.pool, m) || m.Labels[kaironv1.LabelMachinePoolTemplateHash] != pass.hash {
			// Members from an older template are about to be replaced: a
			// claim made after the change gets the new template.
			continue
		}
		switch {
		case b.tracker.machineTaken(m):
		case !rules.MachineNodeReachable(m):
			// Its node's agent is unreachable: never handed out, and not
			// on its way either (the pool boots its replacement).
		case rules.WarmMemberReady(pass.pool, m):
			// Not copied: a pool may hold hundreds of them and a pass
			// takes a few; the take copies the one it writes.
			if usable(m) {
				pass.candidates = append(pass.candidates, m)
			}
		case machineWarming(m) || m.Status.Phase == kaironv1.MachineRunning:
			// Running but not yet ready by the pool's spec.readiness (its
			// guest agent not answering) counts as warming too.
			pass.warming++
			pass.unplaced.Add(m)
		}
	}
	for i := range claims.Items {
		c := &claims.Items[i]
		if c.DeletionTimestamp != nil || !claimPending(c) || !usable(c) || b.tracker.claimInFlight(c) {
			continue
		}
		// A claim that already has a Machine labelled for it is being, or
		// was, bound (its status write is in flight or failed); the claim
		// reconciler settles it, and binding it again would take a second
		// Machine.
		switch labelled, err := b.hasLabelledMember(ctx, key, c); {
		case err != nil:
			return nil, err
		case !labelled:
			pass.pending = append(pass.pending, c.DeepCopy())
		}
	}
	sortOldestFirst(b.tracker, pass.pending)
	sortOldestFirst(b.tracker, pass.candidates)
	return pass, nil
}

// hasLabelledMember: a live member of the pool is labelled as claimed by
// claim (the claim reconciler's listLabelled, on the same index).
func (b *MachineClaimBinder) hasLabelledMember(ctx context.Context, pool types.NamespacedName, claim *kaironv1.MachineClaim) (bool, error) {
	labelled, err := listLabelled(ctx, b.Client, claim, client.MatchingFields{claimedMachineIndex: claim.Name})
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(labelled, func(m *kaironv1.Machine) bool { return m.Labels[kaironv1.LabelMachinePool] == pool.Name }), nil
}

// machineWarming: on its way to Running.
func machineWarming(m *kaironv1.Machine) bool {
	switch m.Status.Phase {
	case "", kaironv1.MachinePending, kaironv1.MachineScheduled, kaironv1.MachineBooting:
		return true
	}
	return false
}

type bindOutcome int

const (
	bindDone        bindOutcome = iota
	bindMemberTaken             // the member changed since listed (409): the claim needs another
	bindRetry                   // the claim changed meanwhile: the next pass looks again
	bindRefused                 // the claim cannot be bound as it is; its status says why
)

type bindResult struct {
	outcome bindOutcome
	// memberUsed: the member was taken and handed back, so it is no
	// candidate for the rest of the pass.
	memberUsed bool
	// claim is the claim as this bind last wrote it (with its finalizer),
	// for the rest of the pass: its own older copy would conflict.
	claim *kaironv1.MachineClaim
	err   error
}

// bindClaim tries to bind claim to member m.
func (b *MachineClaimBinder) bindClaim(ctx context.Context, pass *bindingPass, claim *kaironv1.MachineClaim, m *kaironv1.Machine) bindResult {
	b.tracker.startBind(claim.UID)
	if b.heldEvents != nil {
		b.heldEvents.bindStarted()
		defer b.heldEvents.bindEnded()
	}
	r := b.tryBind(ctx, pass, claim, m)
	if r.outcome != bindDone {
		b.tracker.abandonBind(claim.UID)
	}
	return r
}

func (b *MachineClaimBinder) tryBind(ctx context.Context, pass *bindingPass, claim *kaironv1.MachineClaim, m *kaironv1.Machine) bindResult {
	if msg := invalidClaimLabels(claim.Spec.Labels); msg != "" {
		return bindResult{outcome: bindRefused, err: ignoreStale(b.writePending(ctx, claim, kaironv1.ClaimReasonInvalidLabels, msg))}
	}
	// The claim's finalizer, the Machine and the claim's egress policy are
	// three objects, so three writes that need not take turns: a bind
	// costs the slowest of them instead of their sum. Whichever fails, the
	// others are undone below before the Machine can go to anyone else.
	// The finalizer is what deletes the egress policy before the Machine
	// goes, and what keeps a Retain Machine from following its deleted
	// claim; until it lands the claim is not Bound, and a claim deleted
	// meanwhile takes its Machine and policy along through their owner
	// references.
	var (
		wg           sync.WaitGroup
		finalized    = claim
		finalizerErr error
		policy       string
		policyErr    error
	)
	if !controllerutil.ContainsFinalizer(claim, kaironv1.FinalizerMachineClaim) {
		wg.Go(func() { finalized, finalizerErr = b.ensureFinalizer(ctx, claim) })
	}
	if claim.Spec.Egress != nil {
		// Created before the Machine is labelled for the claim: the
		// policy names the Machine, so the node confines it while the
		// rest of the bind is written.
		wg.Go(func() { policy, policyErr = ensureEgressPolicy(ctx, b.Client, b.APIReader, claim, m.Name) })
	}
	claimed, takeErr := b.takeMachine(ctx, m, claim)
	wg.Wait()
	if takeErr != nil || finalizerErr != nil {
		if claim.Spec.Egress != nil && policyErr == nil {
			// The Machine stays (or goes back to being) a warm member: it
			// must not stay confined to this claim's egress.
			b.dropEgressPolicy(ctx, claim)
		}
	}
	if finalizerErr != nil {
		if takeErr == nil {
			log.FromContext(ctx).Info("Writing the claim's finalizer failed; handing the machine back", "claim", klog.KObj(claim), "machine", klog.KObj(m), "error", finalizerErr.Error())
			b.handBack(ctx, pass.pool, claim, claimed)
		}
		if apierrors.IsConflict(finalizerErr) || apierrors.IsNotFound(finalizerErr) {
			return bindResult{outcome: bindRetry, memberUsed: takeErr == nil}
		}
		return bindResult{outcome: bindRetry, memberUsed: takeErr == nil, err: finalizerErr}
	}
	claim = finalized
	switch {
	case apierrors.IsConflict(takeErr):
		// Changed since listed: bound by someone else, or its status moved
		// on. Either way not this pass's to take.
		claimBindConflicts.Inc()
		log.FromContext(ctx).V(1).Info("Warm machine changed since listed; trying the next", "machine", klog.KObj(m), "claim", klog.KObj(claim))
		return bindResult{outcome: bindMemberTaken, claim: claim}
	case apierrors.IsNotFound(takeErr):
		return bindResult{outcome: bindMemberTaken, claim: claim}
	case apierrors.IsInvalid(takeErr):
		// The Machine refused the claim's labels; every member would
		// refuse them alike, so this one stays for the next claim.
		return bindResult{outcome: bindRefused, err: ignoreStale(b.writePending(ctx, claim, kaironv1.ClaimReasonInvalidLabels,
			"spec.labels cannot be put on a Machine: "+takeErr.Error()))}
	case takeErr != nil:
		return bindResult{outcome: bindRetry, err: takeErr}
	}
	b.tracker.tookMachine(m.UID)
	if policyErr != nil {
		// A Machine without its egress policy would be unconfined: hand
		// it back rather than report the claim Bound.
		log.FromContext(ctx).Error(policyErr, "Creating the claim's egress policy; handing the machine back", "claim", klog.KObj(claim), "machine", klog.KObj(m))
		b.handBack(ctx, pass.pool, claim, claimed)
		return bindResult{outcome: bindRefused, memberUsed: true,
			err: ignoreStale(b.writePending(ctx, claim, kaironv1.ClaimReasonEgressPolicyFailed, "creating egress policy: "+policyErr.Error()))}
	}
	return b.recordBind(ctx, pass, claim, claimed, policy)
}

// dropEgressPolicy deletes the egress policy a failed bind created for a
// Machine it did not get. It returns once the API server has removed it,
// before the Machine can be offered to another claim: a node's policies
// arrive in the order they were written, so the node lets go of this one
// before it sees the next claim's, and never confines the Machine to both.
func (b *MachineClaimBinder) dropEgressPolicy(ctx context.Context, claim *kaironv1.MachineClaim) {
	var err error
	for range 3 {
		if _, err = deleteEgressPolicy(ctx, b.Client, b.APIReader, claim); err == nil {
			return
		}
	}
	// The claim's next bind points the policy at its new Machine, and
	// deleting the claim deletes the policy with it.
	log.FromContext(ctx).Error(err, "Deleting the egress policy of a bind that failed", "claim", klog.KObj(claim))
}

// ensureFinalizer adds the claim finalizer. A conflict is most often this
// binder's own Pending write that the cache has yet to show, so the claim
// is read again and, still Pending, tried once more rather than left for a
// later pass.
func (b *MachineClaimBinder) ensureFinalizer(ctx context.Context, claim *kaironv1.MachineClaim) (*kaironv1.MachineClaim, error) {
	updated, err := ensureClaimFinalizer(ctx, b.Client, claim)
	if !apierrors.IsConflict(err) {
		return updated, err
	}
	fresh := &kaironv1.MachineClaim{}
	if getErr := b.APIReader.Get(ctx, client.ObjectKeyFromObject(claim), fresh); getErr != nil {
		return nil, getErr
	}
	if fresh.UID != claim.UID || fresh.DeletionTimestamp != nil || !claimPending(fresh) {
		return nil, err
	}
	return ensureClaimFinalizer(ctx, b.Client, fresh)
}

// takeMachine is the bind: the member's labels say it is claimed, by
// whom, with the claim's spec.labels, and the claim becomes its owner in
// place of the pool, so that deleting the pool leaves it alone. The patch
// carries the resourceVersion the pass listed.
func (b *MachineClaimBinder) takeMachine(ctx context.Context, m *kaironv1.Machine, claim *kaironv1.MachineClaim) (*kaironv1.Machine, error) {
	claimed := m.DeepCopy()
	if claimed.Labels == nil {
		claimed.Labels = map[string]string{}
	}
	for k, v := range claim.Spec.Labels {
		if !reservedLabel(k) {
			claimed.Labels[k] = v
		}
	}
	claimed.Labels[kaironv1.LabelPoolState] = kaironv1.PoolStateClaimed
	claimed.Labels[kaironv1.LabelMachineClaim] = claim.Name
	claimed.OwnerReferences = append(withoutControllerRef(m.OwnerReferences), *metav1.NewControllerRef(claim, machineClaimKind))
	if err := b.Client.Patch(ctx, claimed, client.MergeFromWithOptions(m, client.MergeFromWithOptimisticLock{})); err != nil {
		return nil, err
	}
	return claimed, nil
}

// reservedLabel: Kairon's own labels, which a claim's spec.labels may not
// set on its Machine (a claim could otherwise make its Machine look warm).
func reservedLabel(key string) bool {
	return strings.HasPrefix(key, "kairon.zyvor.dev/")
}

func withoutControllerRef(refs []metav1.OwnerReference) []metav1.OwnerReference {
	var out []metav1.OwnerReference
	for _, ref := range refs {
		if !ptr.Deref(ref.Controller, false) {
			out = append(out, ref)
		}
	}
	return out
}

// recordBind finishes a bind whose Machine patch succeeded and whose
// egress policy, if any, exists: once the node enforces the policy, the
// claim's status, guarded by the claim's resourceVersion.
func (b *MachineClaimBinder) recordBind(ctx context.Context, pass *bindingPass, claim *kaironv1.MachineClaim, m *kaironv1.Machine, policy string) bindResult {
	logger := log.FromContext(ctx).WithValues("claim", klog.KObj(claim), "machine", klog.KObj(m))
	var enforced *metav1.Condition
	if policy != "" {
		// Bound only once the node enforces it: no window in which the
		// claimant's code runs unconfined (claim_egress_enforced.go).
		cond, err := waitEgressEnforced(ctx, b.Client, b.policies, claim.Namespace, policy, m)
		if err != nil {
			logger.Error(err, "Waiting for the node to enforce the claim's egress policy; handing the machine back")
			_, _ = deleteEgressPolicy(ctx, b.Client, b.APIReader, claim)
			b.handBack(ctx, pass.pool, claim, m)
			return bindResult{outcome: bindRefused, memberUsed: true,
				err: ignoreStale(b.writePending(ctx, claim, kaironv1.ClaimReasonEgressNotEnforced, err.Error()))}
		}
		enforced = &cond
	}

	boundAt := b.tracker.now()
	created := b.tracker.createdAt(claim)
	bindTime := boundAt.Sub(created)
	steps := b.tracker.steps(claim.UID, created, boundAt)
	desired := boundStatus(claim, m.Name, policy, boundAt, bindTime)
	withEgressEnforced(desired, enforced, claim.Generation)
	for range 3 {
		err := patchClaimStatus(ctx, b.Client, claim, desired)
		if err == nil {
			claimBindDuration.Observe(bindTime.Seconds())
			// Where the time went: the create and its watch delivery,
			// the wait for a pass, the take (and egress), the status.
			logger.Info("Bound claim", "bindMillis", desired.BindMillis, "seenMillis", millis(steps.seen),
				"startedMillis", millis(steps.started), "takeMillis", millis(steps.take), "statusMillis", millis(b.tracker.now().Sub(boundAt)))
			b.Recorder.Eventf(claim, m, corev1.EventTypeNormal, kaironv1.ClaimReasonBound, "Bind",
				"Bound to machine %s in %dms", m.Name, desired.BindMillis)
			return bindResult{outcome: bindDone}
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			// Unknown outcome: the claim reconciler settles a claim with
			// a Machine labelled for it, so leave the Machine as it is.
			return bindResult{outcome: bindRetry, memberUsed: true, err: err}
		}
		fresh := &kaironv1.MachineClaim{}
		getErr := b.APIReader.Get(ctx, client.ObjectKeyFromObject(claim), fresh)
		switch {
		case getErr != nil && !apierrors.IsNotFound(getErr):
			return bindResult{outcome: bindRetry, memberUsed: true, err: getErr}
		case getErr == nil && fresh.Status.Phase == kaironv1.ClaimBound && fresh.Status.MachineName == m.Name:
			// Another controller recorded this very bind.
			return bindResult{outcome: bindDone}
		case getErr == nil && fresh.UID == claim.UID && fresh.DeletionTimestamp == nil && claimPending(fresh):
			// Someone wrote the claim meanwhile (a Pending message) but
			// nobody bound it.
			claim = fresh
			desired = boundStatus(claim, m.Name, policy, boundAt, bindTime)
			withEgressEnforced(desired, enforced, claim.Generation)
			continue
		}
		// Gone, being deleted, or bound to another Machine by another
		// controller: this Machine was never the claim's. Hand it back.
		logger.Info("Claim was bound elsewhere or went away meanwhile; handing the machine back", "boundTo", fresh.Status.MachineName)
		b.handBack(ctx, pass.pool, claim, m)
		if getErr == nil && fresh.UID == claim.UID && fresh.Spec.Egress != nil && fresh.Status.Phase == kaironv1.ClaimBound {
			// The policy may have been pointed at this Machine; point it
			// back at the claim's.
			_, _ = ensureEgressPolicy(ctx, b.Client, b.APIReader, fresh, fresh.Status.MachineName)
		}
		return bindResult{outcome: bindRetry, memberUsed: true}
	}
	return bindResult{outcome: bindRetry, memberUsed: true}
}

// millis is d in fractional milliseconds, for log lines.
func millis(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}

// handBack returns a Machine this binder took for nothing to the pool.
func (b *MachineClaimBinder) handBack(ctx context.Context, pool *kaironv1.MachinePool, claim *kaironv1.MachineClaim, m *kaironv1.Machine) {
	if err := returnToPool(ctx, b.Client, b.APIReader, b.Recorder, pool, claim, m.Name); err != nil {
		// The claim reconciler finds the stray label and tries again.
		log.FromContext(ctx).Error(err, "Handing a machine back to its pool", "machine", klog.KObj(m), "claim", klog.KObj(claim))
	}
	b.tracker.gaveBackMachine(m.UID)
}

// boundStatus is a claim's status once bound to machine.
func boundStatus(claim *kaironv1.MachineClaim, machine, policy string, boundAt time.Time, bindTime time.Duration) *kaironv1.MachineClaimStatus {
	status := claim.Status.DeepCopy()
	status.Phase = kaironv1.ClaimBound
	status.MachineName = machine
	status.BoundAt = ptr.To(metav1.NewTime(boundAt))
	status.BindMillis = max(bindTime.Milliseconds(), 0)
	status.EgressPolicy = policy
	status.Message = ""
	status.ObservedGeneration = claim.Generation
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: kaironv1.ConditionReady.String(), Status: metav1.ConditionTrue, Reason: kaironv1.ClaimReasonBound,
		Message: "Bound to machine " + machine, ObservedGeneration: claim.Generation,
	})
	return status
}

// explainWaiting writes why each waiting claim is still Pending. It returns
// how soon to look again when it held back a refresh.
func (b *MachineClaimBinder) explainWaiting(ctx context.Context, pass *bindingPass, waiting []*kaironv1.MachineClaim) (time.Duration, error) {
	if len(waiting) == 0 {
		b.mu.Lock()
		delete(b.pendingRefreshed, pass.key)
		b.mu.Unlock()
		return 0, nil
	}
	reason, message := waitReason(pass)
	now := b.tracker.now()
	b.mu.Lock()
	sinceRefresh := now.Sub(b.pendingRefreshed[pass.key])
	b.mu.Unlock()

	var toWrite []*kaironv1.MachineClaim
	var heldBack bool
	for _, c := range waiting {
		if c.Status.Phase == kaironv1.ClaimPending && c.Status.Message == message {
			continue
		}
		cond := meta.FindStatusCondition(c.Status.Conditions, kaironv1.ConditionReady.String())
		if len(waiting) > pendingRefreshBurst && c.Status.Phase == kaironv1.ClaimPending && cond != nil && cond.Reason == reason &&
			sinceRefresh < pendingRefreshInterval {
			heldBack = true // only the count changed; it was refreshed a moment ago
			continue
		}
		toWrite = append(toWrite, c)
	}
	if len(toWrite) > 0 {
		b.mu.Lock()
		b.pendingRefreshed[pass.key] = now
		b.mu.Unlock()
	}

	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, pendingWriters)
	for _, c := range toWrite {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := ignoreStale(b.writePending(ctx, c, reason, message)); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if heldBack {
		return pendingRefreshInterval - sinceRefresh, errors.Join(errs...)
	}
	return 0, errors.Join(errs...)
}

// waitReason says why the pool's claims wait, with the counts users need.
func waitReason(pass *bindingPass) (reason, message string) {
	switch {
	case pass.pool == nil:
		return kaironv1.ClaimReasonPoolNotFound, fmt.Sprintf("MachinePool %q not found in namespace %q", pass.key.Name, pass.key.Namespace)
	case pass.pool.DeletionTimestamp != nil:
		return kaironv1.ClaimReasonPoolDeleting, fmt.Sprintf("MachinePool %q is being deleted", pass.key.Name)
	}
	warming := fmt.Sprintf("%d warming", pass.warming)
	if pass.unplaced.Count > 0 {
		// Short of room rather than slow to boot: say what the scheduler
		// said, so the user knows to free or add capacity.
		warming += fmt.Sprintf(", %d of them waiting for a node: %s", pass.unplaced.Count, pass.unplaced.Why)
	}
	if pass.pool.Spec.Readiness == kaironv1.PoolReadinessGuestAgent {
		return kaironv1.ClaimReasonWaitingForWarmMachine, fmt.Sprintf("no Running warm machine with an answering guest agent in pool %q (%s)", pass.key.Name, warming)
	}
	return kaironv1.ClaimReasonWaitingForWarmMachine, fmt.Sprintf("no Running warm machine in pool %q (%s)", pass.key.Name, warming)
}

// writePending records that a claim waits, and why. A conflict means the
// claim moved on (bound by another controller, or edited); the event that
// moved it brings a new pass.
func (b *MachineClaimBinder) writePending(ctx context.Context, claim *kaironv1.MachineClaim, reason, message string) error {
	status := claim.Status.DeepCopy()
	status.Phase = kaironv1.ClaimPending
	status.Message = message
	status.ObservedGeneration = claim.Generation
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{
		Type: kaironv1.ConditionReady.String(), Status: metav1.ConditionFalse, Reason: reason,
		Message: message, ObservedGeneration: claim.Generation,
	})
	if equality.Semantic.DeepEqual(&claim.Status, status) {
		return nil
	}
	err := patchClaimStatus(ctx, b.Client, claim, status)
	if err == nil && reason != kaironv1.ClaimReasonWaitingForWarmMachine {
		b.Recorder.Eventf(claim, nil, corev1.EventTypeWarning, reason, "Bind", "%s", message)
	}
	return err
}

// ignoreStale drops the errors of a write from a copy that is out of date:
// whatever changed or deleted the object brings a new pass.
func ignoreStale(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// invalidClaimLabels says what is wrong with a claim's spec.labels as
// Machine labels, or "" when nothing is.
func invalidClaimLabels(labels map[string]string) string {
	var problems []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if reservedLabel(k) {
			problems = append(problems, fmt.Sprintf("%s: the kairon.zyvor.dev/ labels are Kairon's own", k))
			continue
		}
		for _, msg := range validation.IsQualifiedName(k) {
			problems = append(problems, fmt.Sprintf("%s: %s", k, msg))
		}
		for _, msg := range validation.IsValidLabelValue(labels[k]) {
			problems = append(problems, fmt.Sprintf("%s=%s: %s", k, labels[k], msg))
		}
	}
	if len(problems) == 0 {
		return ""
	}
	return "spec.labels cannot be put on a Machine: " + strings.Join(problems, "; ")
}

// patchClaimStatus writes status to claim and leaves claim as written.
// Several writers share a claim's status (the binders of every
// kairon-controller replica, the claim reconciler), so the write is locked:
// from a stale copy it fails with a Conflict rather than, say, turn Bound
// back into Pending.
func patchClaimStatus(ctx context.Context, c client.Client, claim *kaironv1.MachineClaim, status *kaironv1.MachineClaimStatus) error {
	desired := claim.DeepCopy()
	desired.Status = *status
	if err := patch.Status(ctx, c, claim, desired, patch.WithOptimisticLock()); err != nil {
		return err
	}
	*claim = *desired
	return nil
}

// ensureClaimFinalizer adds the claim finalizer, returning the claim as
// written.
func ensureClaimFinalizer(ctx context.Context, c client.Client, claim *kaironv1.MachineClaim) (*kaironv1.MachineClaim, error) {
	if controllerutil.ContainsFinalizer(claim, kaironv1.FinalizerMachineClaim) {
		return claim, nil
	}
	updated := claim.DeepCopy()
	controllerutil.AddFinalizer(updated, kaironv1.FinalizerMachineClaim)
	if err := c.Patch(ctx, updated, client.MergeFromWithOptions(claim, client.MergeFromWithOptimisticLock{})); err != nil {
		return nil, err
	}
	return updated, nil
}

// returnToPool hands a Machine labelled for claim back to pool as a warm
// member, undoing the bind: it was never the claim's to use (the claim's
// status names another Machine, or the claim went away before it recorded
// the bind). A Machine of a pool that is gone is deleted instead.
func returnToPool(ctx context.Context, c client.Client, live client.Reader, recorder events.EventRecorder,
	pool *kaironv1.MachinePool, claim *kaironv1.MachineClaim, machine string) error {
	for range 5 {
		var m kaironv1.Machine
		if err := live.Get(ctx, client.ObjectKey{Namespace: claim.Namespace, Name: machine}, &m); err != nil {
			return client.IgnoreNotFound(err)
		}
		if m.Labels[kaironv1.LabelMachineClaim] != claim.Name || m.Labels[kaironv1.LabelPoolState] != kaironv1.PoolStateClaimed || m.DeletionTimestamp != nil {
			return nil // not (or no longer) held for this claim
		}
		// Read after the Machine: the claim reconciler may be recording
		// this very bind (a bind whose status write looked lost). A
		// Machine the claim is Bound to is never handed back, nor one it
		// is being recorded on: that recording marked the Machine before
		// writing the claim (markRecordingBind), so either the mark is
		// seen here or the patch below conflicts and the next turn sees it.
		var cur kaironv1.MachineClaim
		if err := live.Get(ctx, client.ObjectKeyFromObject(claim), &cur); err != nil && !apierrors.IsNotFound(err) {
			return err
		} else if err == nil && cur.UID == claim.UID {
			if cur.Status.Phase == kaironv1.ClaimBound && cur.Status.MachineName == machine {
				// Being deleted or not: its user had it, so it never
				// goes back warm (the release deletes or retains it).
				return nil
			}
			if cur.DeletionTimestamp == nil && claimPending(&cur) && m.Annotations[kaironv1.AnnotationRecordingBindOf] == string(cur.UID) {
				log.FromContext(ctx).Info("Not handing back a machine whose bind the claim reconciler is recording", "machine", klog.KObj(&m), "claim", klog.KObj(&cur))
				return nil
			}
		}
		if pool == nil || pool.DeletionTimestamp != nil || pool.Name != m.Labels[kaironv1.LabelMachinePool] {
			err := c.Delete(ctx, &m, client.Preconditions{UID: ptr.To(m.UID), ResourceVersion: ptr.To(m.ResourceVersion)})
			if apierrors.IsConflict(err) {
				continue
			}
			return client.IgnoreNotFound(err)
		}
		warm := m.DeepCopy()
		for k, v := range claim.Spec.Labels {
			if reservedLabel(k) || warm.Labels[k] != v {
				continue
			}
			if tv, ok := pool.Spec.Template.Metadata.Labels[k]; ok {
				warm.Labels[k] = tv
			} else {
				delete(warm.Labels, k)
			}
		}
		delete(warm.Labels, kaironv1.LabelMachineClaim)
		delete(warm.Annotations, kaironv1.AnnotationRecordingBindOf)
		warm.Labels[kaironv1.LabelPoolState] = kaironv1.PoolStateWarm
		warm.OwnerReferences = append(withoutControllerRef(m.OwnerReferences), *metav1.NewControllerRef(pool, machinePoolKind))
		err := c.Patch(ctx, warm, client.MergeFromWithOptions(&m, client.MergeFromWithOptimisticLock{}))
		if apierrors.IsConflict(err) {
			continue
		}
		if err == nil {
			recorder.Eventf(warm, claim, corev1.EventTypeNormal, kaironv1.EventReasonReturnedToPool, "Release",
				"Returned to pool %s: claim %s did not keep it", pool.Name, claim.Name)
		}
		return client.IgnoreNotFound(err)
	}
	return fmt.Errorf("machine %s kept changing while being returned to its pool", machine)
}
