package controller

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// Binds before refills. Each bind leaves its pool one member short, and
// the replacement costs the API server several writes (the Machine, its
// node, its way through Booting to Running) while a burst of claims is
// still being bound on the same API server. As long as the claims on a
// pool are all served (their member taken, the bind being recorded) or can
// be served by its ready members, the pool's refill waits for them: those
// binds go first. The wait is bounded, so claims that stay Pending for
// another reason never starve the pool.
const (
	// maxRefillHold is the longest a pool's refill waits for binds: long
	// enough for a burst of a thousand claims on a small API server (one
	// took 23 s on a 2-core machine), whose binds a one-second hold left
	// to share the API server with their replacements for all but the
	// first second (docs/benchmarks.md).
	maxRefillHold = 30 * time.Second
	// refillHoldRecheck is how soon a held pool looks again.
	refillHoldRecheck = 100 * time.Millisecond
)

// refillHolds remembers since when each pool's refill has been held.
type refillHolds struct{ uidStamps }

func newRefillHolds() *refillHolds {
	return &refillHolds{newUIDStamps()}
}

// hold says whether pool's refill waits now: claims being bound or
// waiting, the waiting ones few enough for its ready members, and not held
// for maxRefillHold already. Unheld, the pool's hold starts afresh the next
// time claims come.
func (h *refillHolds) hold(pool types.UID, waiting, binding, ready int) bool {
	if waiting+binding == 0 || waiting > ready {
		h.forget(pool)
		return false
	}
	return h.elapsed(pool) < maxRefillHold
}

// claimsAhead counts the pool's claims that a refill would compete with:
// waiting, those waiting for a warm member as the binder would serve them;
// binding, those whose member is taken (labelled for the claim among
// claimed) while the claim is not yet Bound. Without the claim index (the
// binder is not running) it counts none: nothing is held.
func claimsAhead(ctx context.Context, c client.Reader, pool *kaironv1.MachinePool, claimed []*kaironv1.Machine) (waiting, binding int) {
	var claims kaironv1.MachineClaimList
	if err := c.List(ctx, &claims, client.InNamespace(pool.Namespace), client.MatchingFields{pendingClaimPoolIndex: pool.Name}, client.UnsafeDisableDeepCopy); err != nil {
		return 0, 0
	}
	taken := make(map[string]bool, len(claimed))
	for _, m := range claimed {
		taken[m.Labels[kaironv1.LabelMachineClaim]] = true
	}
	for i := range claims.Items {
		cl := &claims.Items[i]
		if cl.DeletionTimestamp != nil || !claimPending(cl) {
			continue
		}
		if taken[cl.Name] {
			binding++
			continue
		}
		// A claim refused for what it asks (its labels, its egress) waits
		// for an edit, not for a member.
		if cond := meta.FindStatusCondition(cl.Status.Conditions, kaironv1.ConditionReady.String()); cond != nil && cond.Reason != kaironv1.ClaimReasonWaitingForWarmMachine {
			continue
		}
		waiting++
	}
	return waiting, binding
}

// readyMembers counts the members a claim can be bound to now.
func readyMembers(pool *kaironv1.MachinePool, members []*kaironv1.Machine) int {
	n := 0
	for _, m := range members {
		if rules.WarmMemberReady(pool, m) {
			n++
		}
	}
	return n
}
