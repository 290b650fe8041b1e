package controller

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilrand "k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/patch"
	"github.com/zyvor/kairon/internal/requeue"
	"github.com/zyvor/kairon/internal/rules"
)

var machinePoolKind = kaironv1.GroupVersion.WithKind("MachinePool")

// MachinePoolReconciler keeps spec.replicas warm (booted, unclaimed) members
// in every MachinePool. Binding members to claims is MachineClaimBinder's
// job; this controller only reacts to it: a bound member stops counting as
// warm, so the next reconcile, which the member's label change triggers,
// creates its replacement.
type MachinePoolReconciler struct {
	Client client.Client
	// APIReader reads the pull secrets of a template's OCI image
	// (pool_image.go): by name, never through the cache.
	APIReader client.Reader
	Recorder  events.EventRecorder
	Interval  time.Duration
	// Resolver finds the digest of a template's OCI image; nil means
	// RegistryResolver.
	Resolver ImageResolver

	expectations *replicaExpectations
	failures     *failureBackoff
	refills      *refillHolds
	statusWrites *statusPacing
	held         *heldPools
	images       *poolImages
}

// SetupWithManager registers the reconciler with mgr.
func (r *MachinePoolReconciler) SetupWithManager(mgr manager.Manager) error {
	if r.expectations == nil {
		r.expectations = newReplicaExpectations()
	}
	if r.failures == nil {
		r.failures = newFailureBackoff()
	}
	if r.refills == nil {
		r.refills = newRefillHolds()
	}
	if r.statusWrites == nil {
		r.statusWrites = newStatusPacing()
	}
	if r.held == nil {
		r.held = newHeldPools()
	}
	images := r.poolImages()
	if err := mgr.Add(images); err != nil {
		return err
	}
	return builder.ControllerManagedBy(mgr).
		For(&kaironv1.MachinePool{}).
		Watches(&kaironv1.Machine{}, r.held.memberEvents(poolMemberChanged().Update)).
		WatchesRawSource(source.Channel(images.wake, &handler.TypedEnqueueRequestForObject[*kaironv1.MachinePool]{})).
		Complete(requeue.UntilStopped(r))
}

// poolOfMachine maps a member, warm or claimed, to its pool. Claimed members
// belong to their claims, but the pool still counts them.
// A template Machine (warmFrom Snapshot) maps to its pool too.
func poolOfMachine(_ context.Context, o client.Object) []reconcile.Request {
	pool := o.GetLabels()[kaironv1.LabelMachinePool]
	if pool == "" {
		pool = o.GetLabels()[kaironv1.LabelMachinePoolTemplate]
	}
	if pool == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: o.GetNamespace(), Name: pool}}}
}

// poolMemberChanged passes the Machine events that change a pool's counts:
// membership and state (labels, owner), readiness (phase, and the
// GuestAgentReady condition) and deletion.
// Status chatter that leaves the phase alone does not.
func poolMemberChanged() predicate.Funcs {
	return updatesThat(func(old, cur *kaironv1.Machine) bool {
		return old.Status.Phase != cur.Status.Phase ||
			guestAgentReady(old) != guestAgentReady(cur) ||
			rules.MachineNodeReachable(old) != rules.MachineNodeReachable(cur) ||
			!maps.Equal(old.Labels, cur.Labels) ||
			!equality.Semantic.DeepEqual(old.OwnerReferences, cur.OwnerReferences) ||
			(old.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil)
	})
}

// guestAgentReady: m's GuestAgentReady condition is True, which a pool
// with spec.readiness GuestAgent binds on.
func guestAgentReady(m *kaironv1.Machine) bool {
	return meta.IsStatusConditionTrue(m.Status.Conditions, kaironv1.ConditionGuestAgentReady.String())
}

// Reconcile brings one pool to spec.replicas warm members built from its
// current template.
func (r *MachinePoolReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pool kaironv1.MachinePool
	if err := r.Client.Get(ctx, req.NamespacedName, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			forgetPoolMembers(req.Namespace, req.Name)
			r.heldPools().set(req.NamespacedName, false)
			r.poolImages().forget(req.NamespacedName)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if pool.DeletionTimestamp != nil {
		// The garbage collector deletes the warm members, which the pool
		// controls; claimed ones belong to their claims and stay.
		r.expectations.forget(pool.UID)
		r.refillHolds().forget(pool.UID)
		r.statusPacing().settled(pool.UID)
		r.heldPools().set(req.NamespacedName, false)
		r.poolImages().forget(req.NamespacedName)
		forgetPoolMembers(pool.Namespace, pool.Name)
		return reconcile.Result{}, nil
	}

	hash := templateHash(&pool.Spec.Template)
	tracked, err := r.listMembers(ctx, &pool)
	if err != nil {
		return reconcile.Result{}, err
	}
	live, createsInFlight := r.expectations.reconcile(pool.UID, tracked)
	members := classifyMembers(&pool, live)
	// Failed members and those on an unreachable node are not warm, and
	// are replaced; only the Failed ones are deleted (replica_health.go).
	counted, _, failed := splitByHealth(members.warm)
	failed, held, retryIn := r.failures.heldFailed(pool.UID, failed)
	current, stale := splitByTemplate(counted, hash)
	// An OCI image is pinned by digest; while the digest is unknown no
	// member is created (pool_image.go).
	img := r.poolImages().pin(&pool, hash, live)

	snap, snapCond, snapErr := r.reconcileSnapshot(ctx, &pool, hash, img)
	// Claims first: a refill that the waiting claims do not need waits
	// for their binds (pool_refill_hold.go), counted as on its way.
	waiting, binding := claimsAhead(ctx, r.Client, &pool, members.claimed)
	refillHeld := r.refillHolds().hold(pool.UID, waiting, binding, readyMembers(&pool, current))
	r.heldPools().set(req.NamespacedName, refillHeld)
	onTheirWay := createsInFlight + held
	if refillHeld {
		onTheirWay = max(onTheirWay, int(ptr.Deref(pool.Spec.Replicas, 1))-len(current))
	}
	warm, syncErr := r.syncMembers(ctx, &pool, hash, img, snap, current, stale, onTheirWay)
	syncErr = errors.Join(syncErr, deleteFailed(ctx, r.Client, r.Recorder, r.failures, r.expectations, &pool, failed))
	desired := pool.DeepCopy()
	desired.Status = *computePoolStatus(&pool, warm, members.claimed, syncErr)
	setSnapshotStatus(&desired.Status, snap, snapCond)
	setImageStatus(&desired.Status, img)
	// The pool's status is this controller's alone: all of it is written,
	// a moment after it changed (pool_status_pacing.go); a newly pinned
	// digest at once, since members run it from now on.
	changed := !equality.Semantic.DeepEqual(pool.Status, desired.Status)
	imageChanged := !equality.Semantic.DeepEqual(pool.Status.Image, desired.Status.Image)
	statusIn := r.statusPacing().wait(pool.UID, changed, syncErr != nil || snapErr != nil || imageChanged)
	if changed && statusIn == 0 {
		if err := patch.Status(ctx, r.Client, &pool, desired, patch.WholeStatus(), patch.IgnoreNotFound()); err != nil {
			return reconcile.Result{}, errors.Join(syncErr, err)
		}
		r.statusPacing().settled(pool.UID)
	}
	if err := errors.Join(syncErr, snapErr); err != nil {
		return reconcile.Result{}, err
	}
	if desired.Status.ReadyWarm == ptr.Deref(pool.Spec.Replicas, 1) {
		r.failures.healthy(pool.UID)
	}
	if refillHeld && (retryIn <= 0 || refillHoldRecheck < retryIn) {
		retryIn = refillHoldRecheck
	}
	if statusIn > 0 && (retryIn <= 0 || statusIn < retryIn) {
		retryIn = statusIn
	}
	if img.retryIn > 0 && (retryIn <= 0 || img.retryIn < retryIn) {
		retryIn = img.retryIn
	}
	if retryIn > 0 && retryIn < r.Interval {
		return reconcile.Result{RequeueAfter: retryIn}, nil
	}
	return reconcile.Result{RequeueAfter: r.Interval}, nil
}

// statusPacing is r.statusWrites, made on first use for reconcilers built
// without SetupWithManager (tests).
func (r *MachinePoolReconciler) statusPacing() *statusPacing {
	if r.statusWrites == nil {
		r.statusWrites = newStatusPacing()
	}
	return r.statusWrites
}

// refillHolds is r.refills, made on first use for reconcilers built
// without SetupWithManager (tests).
func (r *MachinePoolReconciler) refillHolds() *refillHolds {
	if r.refills == nil {
		r.refills = newRefillHolds()
	}
	return r.refills
}

// poolImages is r.images, made on first use for reconcilers built without
// SetupWithManager (tests): without a manager, nothing wakes a pool when
// its resolution ends but its retry timer.
func (r *MachinePoolReconciler) poolImages() *poolImages {
	if r.images == nil {
		resolver := r.Resolver
		if resolver == nil {
			resolver = RegistryResolver{}
		}
		reader := r.APIReader
		if reader == nil {
			reader = r.Client
		}
		r.images = newPoolImages(resolver, reader, r.Recorder)
	}
	return r.images
}

// heldPools is r.held, made on first use for reconcilers built without
// SetupWithManager (tests).
func (r *MachinePoolReconciler) heldPools() *heldPools {
	if r.held == nil {
		r.held = newHeldPools()
	}
	return r.held
}

// listMembers returns the Machines the pool counts, terminating ones
// included (the expectations need to see those): warm members it controls
// and members claimed from it. A warm-labelled Machine controlled by
// something else, such as a member of an earlier pool of the same name that
// the garbage collector has yet to delete, is not the pool's.
func (r *MachinePoolReconciler) listMembers(ctx context.Context, pool *kaironv1.MachinePool) ([]*kaironv1.Machine, error) {
	// Read-only views of the cache: a pool counts its claimed members too,
	// which pile up as claims are bound, and copying them all on every
	// reconcile was the largest cost of a pool serving back-to-back
	// claims. The reconciler only reads them and deletes some.
	var list kaironv1.MachineList
	if err := r.Client.List(ctx, &list, client.InNamespace(pool.Namespace),
		client.MatchingFields{poolMachineIndex: pool.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, fmt.Errorf("listing members: %w", err)
	}
	var tracked []*kaironv1.Machine
	for i := range list.Items {
		m := &list.Items[i]
		if isWarmMemberOf(pool, m) || isClaimedMember(m) {
			tracked = append(tracked, m)
		}
	}
	return tracked, nil
}

// poolMemberSet is a pool's live members, split by state.
type poolMemberSet struct {
	warm    []*kaironv1.Machine
	claimed []*kaironv1.Machine
}

func classifyMembers(pool *kaironv1.MachinePool, live []*kaironv1.Machine) poolMemberSet {
	var s poolMemberSet
	for _, m := range live {
		switch {
		case m.DeletionTimestamp != nil:
		case isClaimedMember(m):
			s.claimed = append(s.claimed, m)
		case isWarmMemberOf(pool, m):
			s.warm = append(s.warm, m)
		}
	}
	return s
}

func isWarmMemberOf(pool *kaironv1.MachinePool, m *kaironv1.Machine) bool {
	if m.Labels[kaironv1.LabelMachinePool] != pool.Name || m.Labels[kaironv1.LabelPoolState] != kaironv1.PoolStateWarm {
		return false
	}
	ref := metav1.GetControllerOf(m)
	return ref != nil && ref.UID == pool.UID
}

func isClaimedMember(m *kaironv1.Machine) bool {
	return m.Labels[kaironv1.LabelMachinePool] != "" && m.Labels[kaironv1.LabelPoolState] == kaironv1.PoolStateClaimed
}

// splitByTemplate separates warm members built from the current template
// from those built from an older one.
func splitByTemplate(warm []*kaironv1.Machine, hash string) (current, stale []*kaironv1.Machine) {
	for _, m := range warm {
		if m.Labels[kaironv1.LabelMachinePoolTemplateHash] == hash {
			current = append(current, m)
		} else {
			stale = append(stale, m)
		}
	}
	return current, stale
}

// syncMembers deletes stale and surplus warm members and creates missing
// ones running img.image, none while img's digest is unknown. It returns the warm members left afterwards (creations not
// included: they are counted once the cache shows them).
func (r *MachinePoolReconciler) syncMembers(ctx context.Context, pool *kaironv1.MachinePool, hash string, img poolImageState, snap *kaironv1.MachinePoolSnapshot,
	current, stale []*kaironv1.Machine, createsInFlight int) ([]*kaironv1.Machine, error) {
	var errs []error
	// Nobody uses a warm member, so one built from an older template is
	// replaced at once rather than rolled: its replacement is created in
	// this same pass, below.
	for _, m := range stale {
		errs = append(errs, r.deleteMember(ctx, pool, m, "its template is out of date"))
	}

	warm := current
	diff := int(ptr.Deref(pool.Spec.Replicas, 1)) - len(current) - createsInFlight
	switch {
	case diff > 0 && !img.unknown:
		errs = append(errs, r.createMembers(ctx, pool, hash, img.image, snap, diff))
	case diff < 0 && createsInFlight == 0:
		// Deleting while creations are unconfirmed could leave one too few
		// once they show up.
		victims := surplusMachines(current, -diff)
		gone := map[types.UID]bool{}
		for _, m := range victims {
			err := r.deleteMember(ctx, pool, m, "the pool has more warm members than spec.replicas")
			if err == nil {
				gone[m.UID] = true
			}
			errs = append(errs, err)
		}
		warm = nil
		for _, m := range current {
			if !gone[m.UID] {
				warm = append(warm, m)
			}
		}
	}
	return warm, errors.Join(errs...)
}

// createMembers creates up to maxCreatesPerSync members with
// slowStartBatch, as a MachineSet does: it stops after the first batch with
// a failure, since whatever refused one (a quota, the webhook) refuses the
// rest, and the next reconcile tries again.
// With snap, they are its clones (machinepool_snapshot.go).
func (r *MachinePoolReconciler) createMembers(ctx context.Context, pool *kaironv1.MachinePool, hash, image string, snap *kaironv1.MachinePoolSnapshot, n int) error {
	_, err := slowStartBatch(min(n, maxCreatesPerSync), slowStartInitialBatch, func() error {
		m, err := r.createMember(ctx, pool, hash, image, snap)
		if err != nil {
			r.Recorder.Eventf(pool, nil, corev1.EventTypeWarning, kaironv1.ReplicaReasonFailedCreate, "Create", "Creating a warm machine: %v", err)
			return fmt.Errorf("creating a warm machine: %w", err)
		}
		r.expectations.created(pool.UID, m.Name)
		log.FromContext(ctx).Info("Created warm machine", "machine", klog.KObj(m), "templateHash", hash)
		r.Recorder.Eventf(pool, m, corev1.EventTypeNormal, kaironv1.EventReasonSuccessfulCreate, "Create", "Created warm machine %s", m.Name)
		return nil
	})
	return err
}

// createMember names members <pool>-<8 hex digits>, as users see them in
// kaironctl claim's output, retrying the rare name collision.
func (r *MachinePoolReconciler) createMember(ctx context.Context, pool *kaironv1.MachinePool, hash, image string, snap *kaironv1.MachinePoolSnapshot) (*kaironv1.Machine, error) {
	var err error
	for range 3 {
		m := newPoolMember(pool, hash)
		m.Spec.Image = image
		cloneFrom(m, snap)
		if err = r.Client.Create(ctx, m); err == nil {
			return m, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, err
		}
	}
	return nil, err
}

// deleteMember deletes a warm member only if it is still the version the
// pass looked at: a claim may have bound it since, and a claimed Machine is
// never the pool's to delete.
func (r *MachinePoolReconciler) deleteMember(ctx context.Context, pool *kaironv1.MachinePool, m *kaironv1.Machine, why string) error {
	err := r.Client.Delete(ctx, m, client.Preconditions{UID: ptr.To(m.UID), ResourceVersion: ptr.To(m.ResourceVersion)})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		// It changed (bound, or its status moved on); the event that
		// changed it brings the pool back here with the new version.
		log.FromContext(ctx).V(1).Info("Warm machine changed since listed; not deleting it", "machine", klog.KObj(m))
		return nil
	case err != nil:
		r.Recorder.Eventf(pool, m, corev1.EventTypeWarning, kaironv1.ReplicaReasonFailedDelete, "Delete", "Deleting warm machine %s: %v", m.Name, err)
		return fmt.Errorf("deleting warm machine %s: %w", m.Name, err)
	}
	r.expectations.deleted(pool.UID, m.UID)
	log.FromContext(ctx).Info("Deleted warm machine", "machine", klog.KObj(m), "phase", m.Status.Phase, "why", why)
	r.Recorder.Eventf(pool, m, corev1.EventTypeNormal, kaironv1.EventReasonSuccessfulDelete, "Delete", "Deleted warm machine %s: %s", m.Name, why)
	return nil
}

// newPoolMember builds one warm member from the pool's template. The pool
// controls it (and the garbage collector deletes it with the pool) only
// while it is warm: a bind hands it to the claim.
func newPoolMember(pool *kaironv1.MachinePool, hash string) *kaironv1.Machine {
	labels := maps.Clone(pool.Spec.Template.Metadata.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	delete(labels, kaironv1.LabelMachineClaim)
	labels[kaironv1.LabelMachinePool] = pool.Name
	labels[kaironv1.LabelMachinePoolTemplateHash] = hash
	labels[kaironv1.LabelPoolState] = kaironv1.PoolStateWarm
	return &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{
			Namespace:       pool.Namespace,
			Name:            memberName(pool.Name),
			Labels:          labels,
			Annotations:     maps.Clone(pool.Spec.Template.Metadata.Annotations),
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(pool, machinePoolKind)},
		},
		Spec: *pool.Spec.Template.Spec.DeepCopy(),
	}
}

func memberName(pool string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	const suffix = 9 // "-" and 8 hex digits
	if len(pool) > 253-suffix {
		pool = strings.TrimRight(pool[:253-suffix], "-.")
	}
	return pool + "-" + hex.EncodeToString(b[:])
}

// templateHash is a short, stable digest of a pool's template. The API
// server stores the template with its defaults applied, so the same
// template always serialises, and hashes, the same.
func templateHash(t *kaironv1.MachineTemplateSpec) string {
	b, err := json.Marshal(t)
	if err != nil {
		// A struct of strings, maps and quantities always marshals.
		panic(fmt.Sprintf("marshalling a machine template: %v", err))
	}
	h := fnv.New32a()
	_, _ = h.Write(b)
	return utilrand.SafeEncodeString(strconv.FormatUint(uint64(h.Sum32()), 10))
}

// poolSelector is a pool's status.selector: its warm members, exactly the
// ones status.replicas counts, so that an autoscaler reading /scale averages
// over the same Machines it counts. Claimed members keep the pool label but
// carry pool-state=claimed, and are not selected.
func poolSelector(pool string) string {
	return kaironv1.LabelMachinePool + "=" + pool + "," + kaironv1.LabelPoolState + "=" + kaironv1.PoolStateWarm
}

func computePoolStatus(pool *kaironv1.MachinePool, warm, claimed []*kaironv1.Machine, syncErr error) *kaironv1.MachinePoolStatus {
	status := pool.Status.DeepCopy()
	status.ObservedGeneration = pool.Generation
	status.Selector = poolSelector(pool.Name)
	status.Replicas = int32(len(warm))
	status.Warm = int32(len(warm))
	status.ReadyWarm = 0
	var unplaced rules.UnplacedMembers
	for _, m := range warm {
		if rules.WarmMemberReady(pool, m) {
			status.ReadyWarm++
		} else {
			unplaced.Add(m)
		}
	}
	status.Claimed = int32(len(claimed))
	recordPoolMembers(pool.Namespace, pool.Name, int(status.ReadyWarm), int(status.Warm-status.ReadyWarm), len(claimed))

	desired := ptr.Deref(pool.Spec.Replicas, 1)
	ready := metav1.Condition{
		Type: kaironv1.ConditionReady.String(), Status: metav1.ConditionTrue, Reason: kaironv1.PoolReasonWarmMachinesReady,
		Message:            fmt.Sprintf("%d/%d warm machines %s", status.ReadyWarm, desired, readyWord(pool)),
		ObservedGeneration: pool.Generation,
	}
	if status.ReadyWarm != desired || status.Warm != desired {
		ready.Status, ready.Reason = metav1.ConditionFalse, kaironv1.PoolReasonWarmMachinesNotReady
		if booting := status.Warm - status.ReadyWarm - int32(unplaced.Count); booting > 0 {
			ready.Message += fmt.Sprintf(", %d booting", booting)
		}
		if unplaced.Count > 0 {
			ready.Message += fmt.Sprintf(", %d waiting for a node (%s)", unplaced.Count, unplaced.Why)
		}
	}
	meta.SetStatusCondition(&status.Conditions, ready)
	setReplicaFailure(&status.Conditions, syncErr, status.Warm, desired, pool.Generation)
	return status
}

// readyWord is what a ready member is under the pool's spec.readiness.
func readyWord(pool *kaironv1.MachinePool) string {
	if pool.Spec.Readiness == kaironv1.PoolReadinessGuestAgent {
		return "Running with an answering guest agent"
	}
	return "Running"
}
